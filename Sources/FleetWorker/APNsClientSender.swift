import APNsClient
import APNsCore
import NIOCore

/// Sends the worker's notifications through the HTTP/2 client pools, one per app and environment.
public struct APNsClientSender: NotificationSender {
    public let clients: APNsClients
    /// Deadline of one request (`worker.request-timeout-seconds`).
    public let requestTimeout: Duration

    public init(clients: APNsClients, requestTimeout: Duration) {
        self.clients = clients
        self.requestTimeout = requestTimeout
    }

    public func send(_ notification: OutgoingNotification) async -> SendResult {
        let started = NIODeadline.now()
        let outcome = await clients.send(notification.request, app: notification.app, environment: notification.environment, deadline: started + timeout)
        return SendResult(outcome, latencyMs: Self.milliseconds(since: started))
    }

    public func canSubmit(app: String) -> Bool { true }

    public func submit(_ notification: OutgoingNotification, to receiver: any APNsOutcomeReceiver) {
        clients.submit(notification.request, app: notification.app, environment: notification.environment, deadline: .now() + timeout, to: receiver)
    }

    private var timeout: TimeAmount {
        .nanoseconds(Int64(requestTimeout.components.seconds) * 1_000_000_000 + requestTimeout.components.attoseconds / 1_000_000_000)
    }

    /// Milliseconds from `start` to now, on the monotonic clock.
    static func milliseconds(since start: NIODeadline) -> Double {
        Double(NIODeadline.now().uptimeNanoseconds &- start.uptimeNanoseconds) / 1e6
    }
}
