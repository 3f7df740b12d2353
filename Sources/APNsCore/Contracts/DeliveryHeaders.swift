/// Headers on a record of `apns.jobs.retry`: the job is re-published unchanged with these.
public struct RetryHeaders: Sendable, Hashable {
    public static let attemptKey = "attempt"
    public static let notBeforeKey = "not-before"
    public static let lastReasonKey = "last-reason"
    /// APNs's HTTP status on the last attempt, when it answered.
    public static let lastStatusKey = "last-status"
    /// The job id of the first consumption, so that a job without `id` keeps its id through retries.
    public static let jobIDKey = "job-id"
    static let keys: Set<String> = [attemptKey, notBeforeKey, lastReasonKey, lastStatusKey]
    public static let maximumAttempt = 1_000_000

    /// Attempts already made (the retry record is consumed for attempt `attempt + 1`).
    public var attempt: Int
    /// Not to be sent before this time.
    public var notBefore: UnixMillis
    public var lastReason: String
    /// APNs's status on the last attempt; nil when it did not answer (a timeout, a lost
    /// connection). A job that ends before its next attempt (its deadline passed meanwhile)
    /// reports it, as it would have after an in-process attempt.
    public var lastStatus: Int?

    public init(attempt: Int, notBefore: UnixMillis, lastReason: String, lastStatus: Int? = nil) {
        self.attempt = attempt
        self.notBefore = notBefore
        self.lastReason = lastReason
        self.lastStatus = lastStatus
    }

    public var headers: [RecordHeader] {
        [
            RecordHeader(Self.attemptKey, String(attempt)),
            RecordHeader(Self.notBeforeKey, String(notBefore.value)),
            RecordHeader(Self.lastReasonKey, lastReason),
        ] + (lastStatus.map { [RecordHeader(Self.lastStatusKey, String($0))] } ?? [])
    }

    /// An `attempt` header's value, if valid: bounded far above any retry.max-attempts (at most
    /// 1,000), so counting on cannot overflow.
    public static func attempt(_ text: String) -> Int? {
        guard let attempt = JobRules.integer(text).map(Int.init), attempt >= 1, attempt <= maximumAttempt else { return nil }
        return attempt
    }

    /// The record's headers with any earlier retry headers replaced by these.
    public func applied(to original: [RecordHeader]) -> [RecordHeader] {
        original.filter { !Self.keys.contains($0.key) } + headers
    }

    /// Reads the retry headers of a record; nil when it has none (a first attempt).
    public init?(headers: [RecordHeader]) throws(ContractDecodingError) {
        guard let attemptText = headers.text(Self.attemptKey) else { return nil }
        guard let attempt = Self.attempt(attemptText) else {
            throw ContractDecodingError(contract: "retry headers", field: Self.attemptKey, "must be an integer from 1 to \(Self.maximumAttempt), got \(JobRules.quoted(JobRules.clip(attemptText)))")
        }
        guard let notBeforeText = headers.text(Self.notBeforeKey), let notBefore = JobRules.integer(notBeforeText), notBefore >= 0 else {
            throw ContractDecodingError(contract: "retry headers", field: Self.notBeforeKey, "must be unix milliseconds")
        }
        self.attempt = attempt
        self.notBefore = UnixMillis(notBefore)
        self.lastReason = headers.text(Self.lastReasonKey) ?? ""
        // Informational only: one that is not an HTTP status is left out, not a reason to refuse
        // the record (records written before it existed have none).
        self.lastStatus = headers.text(Self.lastStatusKey).flatMap { JobRules.integer($0) }.flatMap { (100...599).contains($0) ? Int($0) : nil }
    }
}

/// Headers on a record of `apns.jobs.dlq`; the value is the original bytes, unchanged.
public struct DeadLetterHeaders: Sendable, Hashable {
    public static let reasonKey = "dlq-reason"
    public static let sourceTopicKey = "source-topic"
    public static let sourcePartitionKey = "source-partition"
    public static let sourceOffsetKey = "source-offset"

    public var reason: String
    public var source: SourcePosition

    public init(reason: String, source: SourcePosition) {
        self.reason = reason
        self.source = source
    }

    public var headers: [RecordHeader] {
        [
            RecordHeader(Self.reasonKey, reason),
            RecordHeader(Self.sourceTopicKey, source.topic),
            RecordHeader(Self.sourcePartitionKey, String(source.partition)),
            RecordHeader(Self.sourceOffsetKey, String(source.offset)),
        ]
    }

    /// The original record's headers (kept, so a header job stays a header job) plus these.
    public func applied(to original: [RecordHeader]) -> [RecordHeader] {
        let own: Set<String> = [Self.reasonKey, Self.sourceTopicKey, Self.sourcePartitionKey, Self.sourceOffsetKey]
        return original.filter { !own.contains($0.key) } + headers
    }

    public init(headers: [RecordHeader]) throws(ContractDecodingError) {
        guard let reason = headers.text(Self.reasonKey) else {
            throw ContractDecodingError(contract: "dlq headers", field: Self.reasonKey, "missing")
        }
        guard let topic = headers.text(Self.sourceTopicKey) else {
            throw ContractDecodingError(contract: "dlq headers", field: Self.sourceTopicKey, "missing")
        }
        guard let partitionText = headers.text(Self.sourcePartitionKey), let partition = Int32(partitionText) else {
            throw ContractDecodingError(contract: "dlq headers", field: Self.sourcePartitionKey, "missing or not an integer")
        }
        guard let offsetText = headers.text(Self.sourceOffsetKey), let offset = Int64(offsetText) else {
            throw ContractDecodingError(contract: "dlq headers", field: Self.sourceOffsetKey, "missing or not an integer")
        }
        self.reason = reason
        self.source = SourcePosition(topic: topic, partition: partition, offset: offset)
    }
}
