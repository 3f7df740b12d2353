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
        let started = ContinuousClock.now
        let deadline = NIODeadline.now() + .nanoseconds(Int64(requestTimeout.components.seconds) * 1_000_000_000 + requestTimeout.components.attoseconds / 1_000_000_000)
        let outcome = await clients.send(notification.request, app: notification.app, environment: notification.environment, deadline: deadline)
        let elapsed = ContinuousClock.now - started
        let latencyMs = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        let response = outcome.response
        return SendResult(
            attempt: outcome.attemptResult,
            apnsID: response?.apnsID,
            apnsUniqueID: response?.apnsUniqueID,
            unregisteredAt: response?.timestamp,
            latencyMs: latencyMs
        )
    }
}
