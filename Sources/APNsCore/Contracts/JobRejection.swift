/// Why a job can never be sent. Its `reason` text becomes the `invalid` result's `reason`
/// and the DLQ copy's `dlq-reason` header, so it names the field and the problem precisely.
public struct JobRejection: Error, Sendable, Hashable, CustomStringConvertible {
    /// The contract field at fault (`tokens[3]`, `payload`, `apns-topic` header), when there is one.
    public var field: String?
    public var message: String

    public init(field: String? = nil, _ message: String) {
        self.field = field
        self.message = message
    }

    /// The same problem, attributed to a more precise field (for example `tokens[3]`).
    func at(_ field: String) -> JobRejection {
        JobRejection(field: field, message)
    }

    /// The field is escaped and clipped like any other quoted value: it can be a key the
    /// producer wrote (an unknown or repeated one), and the reason travels in a Kafka header.
    public var reason: String {
        let full = field.map { "\(JobRules.escaped(JobRules.clip($0))): \(message)" } ?? message
        // A backstop: every value quoted in a message is clipped, but the reason is copied into
        // each token's result and the DLQ header, so it never grows past a kilobyte or so.
        return full.utf8.count <= Self.maximumReasonBytes ? full : JobRules.clip(full, to: Self.maximumReasonBytes / 4)
    }

    static let maximumReasonBytes = 1024

    public var description: String { reason }
}
