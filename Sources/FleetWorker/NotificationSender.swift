import APNsCore

/// One notification as the worker hands it to a transport.
public struct OutgoingNotification: Sendable {
    public var app: String
    public var token: DeviceToken
    public var topic: String
    public var pushType: PushType
    public var priority: NotificationPriority
    public var expiration: Int64?
    public var collapseID: String?
    /// Stable across the in-process attempts of this notification.
    public var apnsID: String
    /// The producer's exact bytes.
    public var payload: RawJSON
    public var environment: APNsEnvironment

    public init(app: String, token: DeviceToken, job: ResolvedJob, apnsID: String) {
        self.app = app
        self.token = token
        self.topic = job.topic
        self.pushType = job.pushType
        self.priority = job.priority
        self.expiration = job.job.expiration
        self.collapseID = job.job.collapseID
        self.apnsID = apnsID
        self.payload = job.job.payload
        self.environment = job.environment
    }
}

/// How one send ended, with what APNs said about it.
public struct SendResult: Sendable, Hashable {
    public var attempt: AttemptResult
    /// The `apns-id` APNs answered with.
    public var apnsID: String?
    public var apnsUniqueID: String?
    /// APNs's 410 timestamp, ms since the epoch.
    public var unregisteredAt: Int64?
    public var latencyMs: Double

    public init(attempt: AttemptResult, apnsID: String? = nil, apnsUniqueID: String? = nil, unregisteredAt: Int64? = nil, latencyMs: Double) {
        self.attempt = attempt
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.unregisteredAt = unregisteredAt
        self.latencyMs = latencyMs
    }
}

/// The transport the push worker sends through: the HTTP/2 client pool, or the legacy binary
/// interface for apps configured with `protocol: binary`.
public protocol NotificationSender: Sendable {
    func send(_ notification: OutgoingNotification) async -> SendResult
}
