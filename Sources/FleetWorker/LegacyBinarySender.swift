import APNsClient
import APNsCore
import APNsLegacyClient
import Foundation
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// Sends the notifications of apps configured with `transport: binary` through the legacy binary
/// gateway, one `LegacyGatewayClient` per app. A `Service`: `run()` keeps the gateway
/// connections open until graceful shutdown.
///
/// The gateway's verdict becomes the same `AttemptResult` an HTTP/2 answer would (see
/// `LegacyGatewayVerdict.attemptResult`): accepted is 200, "Invalid token" is 400
/// BadDeviceToken, a payload over the interface's limit is 413 PayloadTooLarge (refused before
/// sending), no verdict is retried like an unanswered request.
public final class LegacyBinarySender: NotificationSender, Service {
    /// By app name.
    public let clients: [String: LegacyGatewayClient]
    /// Deadline of one send (`worker.request-timeout-seconds`); an accepted verdict takes at
    /// least the client's quiet period.
    public let requestTimeout: Duration

    public init(clients: [String: LegacyGatewayClient], requestTimeout: Duration) {
        self.clients = clients
        self.requestTimeout = requestTimeout
    }

    /// A client for every app in `apps` with `transport: binary` (none for the others).
    public convenience init(
        apps: [AppConfiguration],
        requestTimeout: Duration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) throws(LegacyClientError) {
        var clients: [String: LegacyGatewayClient] = [:]
        for app in apps where app.transport == .binary {
            clients[app.name] = try LegacyGatewayClient(configuration: .load(app: app), eventLoopGroup: eventLoopGroup, logger: logger)
        }
        self.init(clients: clients, requestTimeout: requestTimeout)
    }

    public func send(_ notification: OutgoingNotification) async -> SendResult {
        guard let client = clients[notification.app] else {
            return SendResult(attempt: .notAnswered("no legacy gateway client for app '\(notification.app)'"), latencyMs: 0)
        }
        let started = ContinuousClock.now
        let request = notification.request
        let expiry = Self.expiry(request.expiration, now: Int64(Date().timeIntervalSince1970))
        let verdict = await client.send(
            token: notification.token.bytes,
            payload: request.payload.bytes,
            expiry: expiry,
            priority: request.priority.map(Self.framePriority),
            timeout: requestTimeout,
            sendBy: Self.continuousInstant(of: notification.sendBy)
        )
        let elapsed = ContinuousClock.now - started
        let latencyMs = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        return SendResult(attempt: verdict.attemptResult, latencyMs: latencyMs)
    }

    /// `deadline` on the legacy client's clock; nil for `distantFuture` (no limit).
    static func continuousInstant(of deadline: NIODeadline) -> ContinuousClock.Instant? {
        guard deadline != .distantFuture else { return nil }
        let remaining = Int64(clamping: deadline.uptimeNanoseconds) &- Int64(clamping: NIODeadline.now().uptimeNanoseconds)
        return ContinuousClock.now + .nanoseconds(remaining)
    }

    /// How long a binary notification without an expiration is stored: HTTP/2 leaves the header
    /// out and APNs stores it, but the binary PDU's expiry is always there, and 0 would mean "do
    /// not store" (a device offline for a moment would never get it).
    static let defaultStorageSeconds: Int64 = 30 * 86_400

    /// The PDU's expiry (unix seconds, 32 bits): the job's expiration (0 stays "do not store"),
    /// or `defaultStorageSeconds` from now.
    static func expiry(_ expiration: Int64?, now: Int64) -> UInt32 {
        UInt32(clamping: max(expiration ?? (now + defaultStorageSeconds), 0))
    }

    /// The frame format knows priorities 10 and 5 only; "low" (1) is sent as 5.
    static func framePriority(_ priority: NotificationPriority) -> UInt8 {
        priority == .immediate ? 10 : 5
    }

    /// Whether every app has at least one gateway connection up (for `/readyz`); names the ones
    /// that do not.
    public var appsWithoutConnection: [String] {
        clients.filter { $0.value.statistics.activeConnections == 0 }.map(\.key).sorted()
    }

    public func run() async throws {
        // With no binary app there is nothing to run, but a service group reads an early return
        // as a failure: stay up until shutdown like the other services.
        guard !clients.isEmpty else {
            try? await gracefulShutdown()
            return
        }
        try await withThrowingDiscardingTaskGroup { group in
            for client in clients.values {
                group.addTask { try await client.run() }
            }
        }
    }

    /// Shuts every client down (as graceful shutdown does).
    public func shutdown() {
        for client in clients.values { client.shutdown() }
    }
}
