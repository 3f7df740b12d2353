import APNsClient
import APNsCore
import NIOCore

/// One notification as the worker hands it to a transport: the client's request plus what
/// picks the pool (app and environment).
///
/// A class, not a struct: it is a few hundred bytes, and every async function it passes through
/// on its way to APNs would otherwise keep a copy in its frame for as long as the request is in
/// flight (measured: frames were most of a worker's memory per notification in flight).
public final class OutgoingNotification: Sendable {
    public let app: String
    public let environment: APNsEnvironment
    public let token: DeviceToken
    /// The request as the HTTP/2 client sends it; the payload is the producer's exact bytes.
    public let request: APNsNotification
    /// The job's cutoff (deadline or expiration) on the monotonic clock: a transport does not
    /// write the notification after it, however long it waited for a stream or a connection.
    public let sendBy: NIODeadline

    /// The notification of `job` for `token`; `apnsID` stays the same across in-process attempts.
    /// Each field is read from where the job is stored, rather than through
    /// `APNsNotification(job:token:)`: handing it the whole `ResolvedJob` copied the job, a
    /// retain for every string inside (counted with uprobes).
    init(token: DeviceToken, of job: JobInFlight, apnsID: String, sendBy: NIODeadline) {
        self.sendBy = sendBy
        self.app = job.accepted.appName
        self.environment = job.accepted.job.environment
        self.token = token
        self.request = APNsNotification(
            deviceToken: token.hex,
            topic: job.accepted.job.topic,
            pushType: job.accepted.job.pushType,
            priority: job.accepted.job.priority,
            expiration: job.accepted.job.job.expiration,
            collapseID: job.accepted.job.job.collapseID,
            apnsID: apnsID,
            payload: job.accepted.job.job.payload
        )
    }
}

extension NIODeadline {
    /// The monotonic instant of a job's wall-clock `cutoff`, given that the wall clock reads
    /// `now`. One millisecond after the cutoff, because
    /// `DeliveryPolicy` still sends within the cutoff's own millisecond: once this passes, the
    /// policy calls the notification expired.
    static func sendBy(cutoff: UnixMillis, now: UnixMillis) -> NIODeadline {
        let (remaining, overflow) = cutoff.value.subtractingReportingOverflow(now.value)
        if overflow { return cutoff.value > 0 ? .distantFuture : .now() }
        // Beyond a year the client has nothing to enforce (and TimeAmount could overflow).
        if remaining > 366 * 86_400_000 { return .distantFuture }
        return .now() + .milliseconds(max(remaining + 1, 0))
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

    /// This result with `apnsID` as its id.
    func withAPNsID(_ apnsID: String?) -> SendResult {
        var result = self
        result.apnsID = apnsID
        return result
    }

    /// What the HTTP/2 client's outcome says, taking `latencyMs` from the caller's clock.
    /// `sentID` is the `apns-id` the request carried: the result's when APNs did not answer (a
    /// timeout or a dropped connection) but may still have taken the request under it, or began
    /// an answer that was cut short; not when the request certainly never reached APNs.
    public init(_ outcome: APNsOutcome, sentID: String?, latencyMs: Double) {
        let response = outcome.response
        var mayHaveReachedAPNs = false
        if case .notAnswered(let why) = outcome { mayHaveReachedAPNs = !why.certainlyNotProcessed || why.kind == .cutShort }
        self.init(
            attempt: outcome.attemptResult,
            apnsID: response?.apnsID ?? (mayHaveReachedAPNs ? sentID : nil),
            apnsUniqueID: response?.apnsUniqueID,
            unregisteredAt: response?.timestamp,
            latencyMs: latencyMs
        )
    }
}

/// The transport the push worker sends through: the HTTP/2 client pool, or the legacy binary
/// interface for apps configured with `protocol: binary`.
public protocol NotificationSender: Sendable {
    func send(_ notification: OutgoingNotification) async -> SendResult

    /// Whether `submit` can send `app`'s notifications (without a task waiting for each).
    func canSubmit(app: String) -> Bool

    /// Sends without suspending: `receiver` gets the outcome once, after this returns (on an
    /// event loop, for the HTTP/2 client). Only for apps where `canSubmit` is true.
    func submit(_ notification: OutgoingNotification, to receiver: any APNsOutcomeReceiver)
}

extension NotificationSender {
    public func canSubmit(app: String) -> Bool { false }

    /// A transport without `submit` answers that nothing was sent (callers check `canSubmit`
    /// first, so this is a caller's mistake made visible rather than a crash).
    public func submit(_ notification: OutgoingNotification, to receiver: any APNsOutcomeReceiver) {
        let why = APNsNotAnswered(.connectionFailed, "\(Self.self) cannot submit; it sends only with send(_:)", certainlyNotProcessed: true)
        Task { receiver.receive(.notAnswered(why), tag: 0) }
    }
}
