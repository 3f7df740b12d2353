import APNsCore

/// One notification for one device, as the client sends it.
///
/// Fields are sent as given: the client does not re-validate what the worker already checked
/// (`JobRules`), so that APNs's own verdict (BadTopic, BadCollapseId, …) reaches the caller.
/// The payload bytes go out exactly as they are.
public struct APNsNotification: Sendable {
    /// The device token, as hex digits (it becomes `:path /3/device/<token>`).
    public var deviceToken: String
    /// `apns-topic`. Required with token auth.
    public var topic: String?
    /// `apns-push-type`.
    public var pushType: PushType?
    /// `apns-priority`.
    public var priority: NotificationPriority?
    /// `apns-expiration`, unix seconds (0: do not store).
    public var expiration: Int64?
    /// `apns-collapse-id`.
    public var collapseID: String?
    /// `apns-id`, a canonical UUID; APNs makes one when nil.
    public var apnsID: String?
    /// The JSON payload, byte for byte as it will be sent.
    public var payload: RawJSON

    public init(
        deviceToken: String,
        topic: String? = nil,
        pushType: PushType? = nil,
        priority: NotificationPriority? = nil,
        expiration: Int64? = nil,
        collapseID: String? = nil,
        apnsID: String? = nil,
        payload: RawJSON
    ) {
        self.deviceToken = deviceToken
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID
        self.payload = payload
    }

    /// The notification of `job` for one of its tokens.
    public init(job: ResolvedJob, token: DeviceToken) {
        self.init(
            deviceToken: token.hex,
            topic: job.topic,
            pushType: job.pushType,
            priority: job.priority,
            expiration: job.job.expiration,
            collapseID: job.job.collapseID,
            apnsID: job.job.apnsID,
            payload: job.job.payload
        )
    }
}

/// APNs's answer to one request.
public struct APNsResponse: Sendable, Hashable {
    /// The HTTP status (200, 400, 403, 404, 405, 410, 413, 429, 500, 503).
    public var status: Int
    /// The `reason` of the JSON body; nil for 200 (or a body without one).
    public var reason: APNsReason?
    /// `apns-id` of the response (the request's, or the one APNs made).
    public var apnsID: String?
    /// `apns-unique-id`, which the sandbox sends for its delivery log, when present.
    public var apnsUniqueID: String?
    /// For 410: when APNs last confirmed the token invalid, milliseconds since the epoch.
    public var timestamp: Int64?
    /// From handing the request to the connection to the end of the response (for a 200 cut
    /// short after its HEADERS, to the cut).
    public var latency: Duration

    public init(status: Int, reason: APNsReason? = nil, apnsID: String? = nil, apnsUniqueID: String? = nil, timestamp: Int64? = nil, latency: Duration = .zero) {
        self.status = status
        self.reason = reason
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.timestamp = timestamp
        self.latency = latency
    }

    /// How the reason table classifies this answer.
    public var classification: ReasonClass {
        reason?.classification(status: status) ?? APNsReasonTable.classification(status: status)
    }
}

/// Why a request got no answer.
public struct APNsNotAnswered: Sendable, Hashable, CustomStringConvertible {
    public struct Kind: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case connectionFailed = "connection failed"
            case refusedStream = "refused stream"
            case goAway = "GOAWAY"
            case timeout = "timeout"
            case tooLate = "too late"
            case shutdown = "client shut down"
            case cutShort = "answer cut short"
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The connection broke (or never came up) before the answer.
        public static let connectionFailed = Kind(.connectionFailed)
        /// The server refused the stream (RST_STREAM REFUSED_STREAM): not processed.
        public static let refusedStream = Kind(.refusedStream)
        /// The stream was above a GOAWAY's last-stream-id: not processed.
        public static let goAway = Kind(.goAway)
        /// The request's deadline passed (the stream was cancelled).
        public static let timeout = Kind(.timeout)
        /// The request's send-by time passed before it could be written: it was not sent. The
        /// worker sets it from the job's deadline and expiration, so a request that waited for a
        /// stream cannot reach a device after the job said it must not.
        public static let tooLate = Kind(.tooLate)
        /// The client was shutting down.
        public static let shutdown = Kind(.shutdown)
        /// APNs's answer began with a status other than 200, then was cut (a reset, a lost
        /// connection, the deadline) before its reason: not delivered, so safe to send again,
        /// with backoff (a cut 429 or 503 must not be resent at once).
        public static let cutShort = Kind(.cutShort)

        public var description: String { base.rawValue }
    }

    public var kind: Kind
    /// Detail for logs and `last-reason`; never holds keys or tokens.
    public var detail: String
    /// True when APNs certainly did not deliver the request (refused, above GOAWAY's
    /// last-stream-id, never written, or answered with a status other than 200 and then cut
    /// short: `cutShort`), so sending it again cannot duplicate it.
    public var certainlyNotProcessed: Bool

    public init(_ kind: Kind, _ detail: String, certainlyNotProcessed: Bool) {
        self.kind = kind
        self.detail = detail
        self.certainlyNotProcessed = certainlyNotProcessed
    }

    public var description: String { detail.isEmpty ? kind.description : "\(kind): \(detail)" }
}

/// How one `send` ended: APNs answered, or it did not.
public enum APNsOutcome: Sendable, Hashable, CustomStringConvertible {
    case answered(APNsResponse)
    case notAnswered(APNsNotAnswered)

    /// The form `DeliveryPolicy.after(attempt:result:…)` consumes.
    public var attemptResult: AttemptResult {
        switch self {
        case .answered(let response): .answered(status: response.status, reason: response.reason)
        case .notAnswered(let why): why.certainlyNotProcessed ? .notAnswered(why.description) : .unconfirmed(why.description)
        }
    }

    public var response: APNsResponse? {
        if case .answered(let response) = self { return response }
        return nil
    }

    public var description: String {
        switch self {
        case .answered(let response):
            var text = "\(response.status)"
            if let reason = response.reason { text += " \(reason)" }
            if let timestamp = response.timestamp { text += " timestamp=\(timestamp)" }
            return text
        case .notAnswered(let why):
            return "not answered (\(why))"
        }
    }
}
