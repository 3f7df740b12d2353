/// A dead device token, published to the log-compacted `apns.token-events` topic.
public struct TokenEvent: Sendable, Hashable {
    public enum Source: String, Sendable, Hashable {
        /// From an HTTP/2 result (410, BadDeviceToken, DeviceTokenNotForTopic).
        case http2
        /// From a tuple of the legacy feedback service.
        case feedbackService = "feedback-service"
    }

    public var token: String
    public var topic: String
    public var app: String?
    public var reason: String
    /// Milliseconds since the epoch: APNs's 410 timestamp, the feedback tuple's time, or when
    /// APNs gave the rejecting answer (the result's `sent_at`).
    public var invalidatedAt: Int64
    public var source: Source
    public var jobID: String?
    /// Whether `invalidatedAt` is a time APNs (or the feedback service) stated, rather than
    /// when the answer came or the poll ran. Not part of the record: a decoded event takes its
    /// time as stated. Like `observedAt`, left out of `==`, which compares records.
    public var timeIsStated: Bool
    /// Milliseconds since the epoch: when the answer came (the result's `sent_at`) or the poll
    /// ran. Not part of the record either: it orders events whose times are of different kinds
    /// (a 410's stated time against a BadDeviceToken's send time).
    public var observedAt: Int64

    public init(
        token: String, topic: String, app: String?, reason: String, invalidatedAt: Int64, source: Source, jobID: String? = nil,
        timeIsStated: Bool = true, observedAt: Int64? = nil
    ) {
        self.token = token
        self.topic = topic
        self.app = app
        self.reason = reason
        self.invalidatedAt = invalidatedAt
        self.source = source
        self.jobID = jobID
        self.timeIsStated = timeIsStated
        self.observedAt = observedAt ?? invalidatedAt
    }

    /// Two events are equal when their records are (`timeIsStated` and `observedAt` are not in it).
    public static func == (lhs: TokenEvent, rhs: TokenEvent) -> Bool {
        lhs.token == rhs.token && lhs.topic == rhs.topic && lhs.app == rhs.app && lhs.reason == rhs.reason
            && lhs.invalidatedAt == rhs.invalidatedAt && lhs.source == rhs.source && lhs.jobID == rhs.jobID
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(token)
        hasher.combine(topic)
        hasher.combine(invalidatedAt)
    }

    /// The record key, `<apns-topic>/<token>`, so compaction keeps the latest event per token and topic.
    public var key: String { "\(topic)/\(token)" }

    /// How far after the answer's time a 410 timestamp may lie and still be taken as APNs's.
    static let clockSkewMilliseconds: Int64 = 86_400_000

    /// Reasons whose result makes the token dead.
    public static let invalidatingReasons: Set<String> = [
        APNsReason.unregistered.rawValue,
        APNsReason.badDeviceToken.rawValue,
        APNsReason.deviceTokenNotForTopic.rawValue,
    ]

    /// Whether `result` is APNs's own answer that the token is dead (whether or not it can key
    /// an event).
    public static func invalidates(_ result: NotificationResult) -> Bool {
        guard result.outcome == .rejected, let status = result.status else { return false }
        // A 410 says the token is no longer active for the topic whatever reason comes with it
        // (Apple has added reasons since the reference, and one may come without any).
        if status == 410 { return true }
        guard let reason = result.reason else { return false }
        return invalidatingReasons.contains(reason)
    }

    /// The event a result implies, if any: only APNs's own answers count (an `invalid` job
    /// never reached APNs, so its reason says nothing about the token). A result whose token is
    /// not a device token, whose topic is empty, or whose time is before 1970 (another
    /// producer's, say) implies none: its event would break the topic's key and schema.
    public init?(result: NotificationResult, observedAt: UnixMillis) {
        // A 410 without a reason (or with an empty one) is APNs's Unregistered.
        let stated = result.reason.flatMap { $0.isEmpty ? nil : $0 }
        guard Self.invalidates(result), let reason = stated ?? (result.status == 410 ? APNsReason.unregistered.rawValue : nil),
            let topic = result.topic, !topic.isEmpty,
            let token = try? DeviceToken(hex: result.token), observedAt.value >= 0
        else { return nil }
        // APNs's 410 timestamp says when the token stopped being valid, so it is never after the
        // answer (a day of clock skew allowed). One outside that is not APNs's: the answer's time
        // stands instead, rather than an event dated before 1970 or far in the future, which
        // readers would keep over every later registration.
        let time = Self.invalidationTime(stated: result.unregisteredAt, observedAt: observedAt)
        self.init(
            token: token.hex,
            topic: topic,
            app: result.app,
            reason: reason,
            invalidatedAt: time.value,
            source: .http2,
            jobID: result.jobID,
            timeIsStated: time.isStated,
            observedAt: observedAt.value
        )
    }

    /// The event of a legacy feedback tuple: the app stopped answering on that device at the
    /// tuple's time (seconds, as the feedback service reports it). Nil when the tuple's token is
    /// not a device token. As with a 410's timestamp, a time more than a day after the poll
    /// (`polledAt`) cannot be the service's: the poll's time stands instead, rather than an
    /// event readers would keep over every registration until then.
    public init?(feedback tuple: FeedbackTuple, topic: String, app: String?, polledAt: UnixMillis) {
        guard let token = try? DeviceToken(bytes: tuple.token) else { return nil }
        let time = Self.invalidationTime(stated: Int64(tuple.timestamp) * 1000, observedAt: polledAt)
        self.init(
            token: token.hex,
            topic: topic,
            app: app,
            reason: APNsReason.unregistered.rawValue,
            invalidatedAt: time.value,
            source: .feedbackService,
            timeIsStated: time.isStated,
            observedAt: polledAt.value
        )
    }

    /// The stated time of an invalidation when APNs could have stated it: not before 1970, and
    /// not after it was observed (a day of clock skew allowed); otherwise the observation's time.
    static func invalidationTime(stated: Int64?, observedAt: UnixMillis) -> (value: Int64, isStated: Bool) {
        let latest = observedAt.value.addingReportingOverflow(clockSkewMilliseconds)
        guard let stated, stated >= 0, latest.overflow || stated <= latest.partialValue else { return (observedAt.value, false) }
        return (stated, true)
    }

    public func encoded() -> [UInt8] {
        var writer = JSONWriter(capacity: 256)
        writer.beginObject()
        writer.field("token", token)
        writer.field("topic", topic)
        writer.field("app", app)
        writer.field("reason", reason)
        writer.field("invalidated_at", invalidatedAt)
        writer.field("source", source.rawValue)
        writer.field("job_id", jobID)
        writer.endObject()
        return writer.bytes
    }

    public init(decoding bytes: [UInt8]) throws(ContractDecodingError) {
        let object = try ContractObject(bytes, contract: "token event", rawKeys: [])
        token = try object.requiredString("token")
        topic = try object.requiredString("topic")
        app = try object.optionalString("app")
        reason = try object.requiredString("reason")
        invalidatedAt = try object.requiredInt("invalidated_at")
        let sourceText = try object.requiredString("source")
        guard let source = Source(rawValue: sourceText) else {
            throw ContractDecodingError(contract: "token event", field: "source", "unknown source \"\(sourceText)\"")
        }
        self.source = source
        jobID = try object.optionalString("job_id")
        timeIsStated = true
        observedAt = invalidatedAt
    }
}
