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
        let outcome = await clients.send(notification.request, app: notification.app, environment: notification.environment, deadline: started + TimeAmount(requestTimeout), sendBy: notification.sendBy)
        return SendResult(outcome, sentID: notification.request.apnsID, latencyMs: started.millisecondsUntilNow)
    }

    public func canSubmit(app: String) -> Bool { true }

    public func submit(_ notification: OutgoingNotification, to receiver: any APNsOutcomeReceiver) {
        clients.submit(notification.request, app: notification.app, environment: notification.environment, deadline: .now() + TimeAmount(requestTimeout), sendBy: notification.sendBy, to: receiver)
    }
}

extension NIODeadline {
    /// Milliseconds from this instant to now, on the monotonic clock (a send's latency).
    var millisecondsUntilNow: Double { milliseconds(until: .now()) }

    /// Milliseconds from this instant to `end`.
    func milliseconds(until end: NIODeadline) -> Double {
        Double(end.uptimeNanoseconds &- uptimeNanoseconds) / 1e6
    }
}
