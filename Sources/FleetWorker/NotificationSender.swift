import APNsClient
import APNsCore

/// One notification as the worker hands it to a transport: the client's request plus what
/// picks the pool (app and environment).
public struct OutgoingNotification: Sendable {
    public var app: String
    public var environment: APNsEnvironment
    public var token: DeviceToken
    /// The request as the HTTP/2 client sends it; the payload is the producer's exact bytes.
    public var request: APNsNotification

    /// The notification of `job` for `token`; `apnsID` stays the same across in-process attempts.
    public init(app: String, token: DeviceToken, job: ResolvedJob, apnsID: String) {
        self.app = app
        self.environment = job.environment
        self.token = token
        var request = APNsNotification(job: job, token: token)
        request.apnsID = apnsID
        self.request = request
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
