import APNsClient
import APNsCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A client of the legacy binary gateway (Apple's port 2195): a few long-lived TLS connections
/// with certificate auth, the enhanced format by default, batched writes, and a verdict for
/// every notification.
///
/// ```swift
/// let client = try LegacyGatewayClient(configuration: .load(app: app), logger: logger)
/// // in a ServiceGroup, or: async let running: Void = client.run()
/// let verdict = await client.send(token: token.bytes, payload: payload)
/// ```
///
/// The gateway says nothing on success. A notification is `accepted` once a later
/// error-response shows it passed, or `quietPeriod` after it was written with no error-response.
/// An error-response (command 8) rejects the notification it names; the gateway then closes the
/// connection and drops what came after, which this client writes again on a new connection.
/// A connection that closes without an error-response has what did not yet pass its quiet
/// period written again (at-least-once, at most `maximumResends` times). Every `send` has a
/// deadline, so none waits forever; `run()` must be running for sends to be taken.
public final class LegacyGatewayClient: Service, Sendable {
    /// A snapshot for readiness checks and tests.
    public struct Statistics: Sendable, Hashable {
        /// Connections that take notifications.
        public var activeConnections: Int
        /// Notifications waiting to be written.
        public var pending: Int
        /// Notifications written and waiting for their quiet period.
        public var unconfirmed: Int
    }

    typealias Machine = GatewayStateMachine<CheckedContinuation<LegacyGatewayVerdict, Never>>

    private enum Phase {
        case idle, running, stopped
    }

    private struct State {
        var machine: Machine
        var phase = Phase.idle
        var channels: [UInt64: any Channel] = [:]
        /// Connections still connecting or in their TLS handshake: a shutdown closes them at once
        /// rather than waiting up to two connect timeouts for an attempt nobody wants any more.
        var connecting: [UInt64: any Channel] = [:]
        /// Connections that received an error-response (their close is expected), and whether it
        /// told of trouble with the gateway rather than with one notification (see `runSlot`).
        var answeredWithError: [UInt64: Bool] = [:]
        var shutdownRequested = false
        var shutdownWaiters: [CheckedContinuation<Void, Never>] = []
        var nextConnectionID: UInt64 = 0
    }

    public let configuration: LegacyGatewayConfiguration
    private let eventLoopGroup: any EventLoopGroup
    private let sslContext: NIOSSLContext?
    private let logger: Logger
    private let metrics: LegacyMetrics
    private let state: Mutex<State>

    /// Reads the certificate and CA now, so bad credentials fail here rather than on every connect.
    public init(
        configuration: LegacyGatewayConfiguration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.legacy-gateway")
    ) throws(LegacyClientError) {
        try configuration.validate()
        self.configuration = configuration
        self.eventLoopGroup = eventLoopGroup
        self.sslContext = try LegacyTLS.context(endpoint: configuration.endpoint, certificate: configuration.certificate)
        var logger = logger
        logger[metadataKey: "apns.app"] = "\(configuration.name)"
        logger[metadataKey: "legacy.gateway"] = "\(configuration.endpoint.label)"
        self.logger = logger
        self.metrics = LegacyMetrics(app: configuration.name)
        let machineConfiguration = Machine.Configuration(
            windowSize: configuration.windowSize,
            quietPeriod: configuration.quietPeriod,
            maximumResends: configuration.maximumResends,
            identifiesNotifications: configuration.format != .simple
        )
        self.state = Mutex(State(machine: Machine(configuration: machineConfiguration)))
    }

    public var statistics: Statistics {
        state.withLock { state in
            Statistics(
                activeConnections: state.machine.activeConnectionCount,
                pending: state.machine.pending.count,
                unconfirmed: state.machine.unconfirmedCount
            )
        }
    }

    /// True between the start of `run()` and the start of shutdown: sends are taken.
    public var isRunning: Bool {
        state.withLock { $0.phase == .running && !$0.shutdownRequested }
    }

    /// Waits until `count` connections take notifications (or `timeout` passes); true if they do.
    public func waitUntilConnected(_ count: Int? = nil, timeout: Duration = .seconds(10)) async -> Bool {
        let wanted = count ?? configuration.connections
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end, !Task.isCancelled {
            if statistics.activeConnections >= wanted { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return statistics.activeConnections >= wanted
    }

    // MARK: Sending

    /// Sends one notification and waits for the gateway's verdict (at least the quiet period
    /// when all goes well), at most `timeout` (default `sendTimeout`).
    ///
    /// - Parameters:
    ///   - expiry: unix seconds, 0 for "do not store" (not sent in the simple format).
    ///   - priority: 10 or 5; only the frame format carries it.
    ///   - sendBy: not written (or written again) after this; the verdict then says so.
    public func send(
        token: [UInt8],
        payload: some Collection<UInt8>,
        expiry: UInt32 = 0,
        priority: UInt8? = nil,
        timeout: Duration? = nil,
        sendBy: ContinuousClock.Instant? = nil
    ) async -> LegacyGatewayVerdict {
        if let refusal = refusal(token: token, payloadCount: payload.count) {
            metrics.record(refusal)
            return refusal
        }
        let deadline = ContinuousClock.now + (timeout ?? configuration.sendTimeout)
        let identifier: UInt32? = state.withLock { state in
            state.phase == .running && !state.shutdownRequested ? state.machine.takeIdentifier() : nil
        }
        guard let identifier else {
            let verdict = LegacyGatewayVerdict.notAnswered("the legacy gateway client is not running; it was not sent")
            metrics.record(verdict)
            return verdict
        }
        let bytes = LegacyNotification(
            format: configuration.format,
            identifier: identifier,
            expiry: expiry,
            token: token,
            payload: Array(payload),
            priority: configuration.format == .frame ? priority : nil
        ).encoded()
        return await withCheckedContinuation { continuation in
            let actions = state.withLock { $0.machine.enqueue(identifier: identifier, bytes: bytes, deadline: deadline, sendBy: sendBy, waiter: continuation) }
            execute(actions)
        }
    }

    /// What the gateway would answer without sending, when the PDU cannot be valid: this keeps
    /// one bad notification from costing a connection.
    private func refusal(token: [UInt8], payloadCount: Int) -> LegacyGatewayVerdict? {
        if token.isEmpty {
            return .refused(.missingDeviceToken, detail: "the device token is empty")
        }
        if token.count != configuration.tokenBytes {
            return .refused(.invalidTokenSize, detail: "the device token is \(token.count) bytes; the binary interface takes \(configuration.tokenBytes)")
        }
        if payloadCount == 0 {
            return .refused(.missingPayload, detail: "the payload is empty")
        }
        if payloadCount > configuration.payloadLimit {
            return .refused(.invalidPayloadSize, detail: "the payload is \(payloadCount) bytes; the binary interface takes at most \(configuration.payloadLimit)")
        }
        return nil
    }

    private func execute(_ actions: Machine.Actions) {
        if actions.resent > 0 { metrics.resent(actions.resent) }
        if let response = actions.unattributed {
            logger.warning("legacy gateway error-response names no notification in flight; re-sending the window", metadata: [
                "legacy.status": "\(response.status)", "legacy.identifier": "\(response.identifier)",
            ])
        }
        for resume in actions.resumes {
            metrics.record(resume.verdict)
            resume.waiter.resume(returning: resume.verdict)
        }
        guard !actions.drains.isEmpty else { return }
        let channels = state.withLock { state in actions.drains.compactMap { id in state.channels[id].map { (id, $0) } } }
        for (id, channel) in channels {
            channel.eventLoop.execute { self.drain(id, channel: channel) }
        }
    }

    /// One write pass, on the channel's event loop: everything queued that fits the window goes
    /// out in as few writes as `batchBytes` allows, flushed once per batch.
    private func drain(_ id: UInt64, channel: any Channel) {
        let pass = state.withLock { $0.machine.drain(id, now: .now) }
        let writes = pass.writes
        if !writes.isEmpty {
            var batch = channel.allocator.buffer(capacity: min(configuration.batchBytes, writes.reduce(0) { $0 + $1.count }))
            var inBatch = 0
            func flushBatch() {
                let count = inBatch
                let promise = channel.eventLoop.makePromise(of: Void.self)
                promise.futureResult.whenSuccess { [self] in
                    state.withLock { $0.machine.written(id, count: count, now: .now) }
                }
                channel.writeAndFlush(batch, promise: promise)
                inBatch = 0
            }
            for pdu in writes {
                if inBatch > 0, batch.readableBytes + pdu.count > configuration.batchBytes {
                    flushBatch()
                    // A new buffer only when another PDU follows (one per pass was wasted).
                    batch = channel.allocator.buffer(capacity: configuration.batchBytes)
                }
                batch.writeBytes(pdu)
                inBatch += 1
            }
            flushBatch()
        }
        execute(pass.actions)
    }

    // MARK: Connection events (event loop)

    fileprivate func connectionReady(_ id: UInt64, channel: any Channel) {
        let actions = state.withLock { state -> Machine.Actions in
            guard state.phase == .running, !state.shutdownRequested else { return Machine.Actions() }
            state.connecting[id] = nil
            state.channels[id] = channel
            return state.machine.connectionActive(id)
        }
        metrics.event("ready")
        logger.debug("legacy gateway connection ready", metadata: ["legacy.connection": "\(id)"])
        execute(actions)
    }

    fileprivate func errorResponse(_ id: UInt64, _ response: LegacyErrorResponse) {
        let actions = state.withLock { state in
            let actions = state.machine.errorResponse(id, response, now: .now)
            // Unattributed, a processing error or "none": nothing says the next connection fares better.
            let code = response.status.code
            state.answeredWithError[id] = actions.unattributed != nil || code == 1 || code == 255
            return actions
        }
        metrics.event("error_response")
        logger.debug("legacy gateway error-response", metadata: [
            "legacy.connection": "\(id)", "legacy.status": "\(response.status)", "legacy.identifier": "\(response.identifier)",
        ])
        execute(actions)
    }

    fileprivate func unintelligible(_ id: UInt64, _ bytes: [UInt8]) {
        metrics.event("protocol_error")
        logger.warning("legacy gateway sent something other than an error-response; closing the connection", metadata: [
            "legacy.connection": "\(id)", "legacy.bytes": "\(HexDump.lines(bytes).joined(separator: " | "))",
        ])
    }

    fileprivate func connectionFailed(_ id: UInt64, _ error: any Error) {
        metrics.event("connection_error")
        logger.warning("legacy gateway connection failed; closing it", metadata: [
            "legacy.connection": "\(id)", "error": "\(error)",
        ])
    }

    fileprivate func connectionClosed(_ id: UInt64) {
        let (actions, unconfirmed) = state.withLock { state -> (Machine.Actions, Int) in
            state.channels[id] = nil
            let unconfirmed = state.machine.connections[id]?.window.count ?? 0
            return (state.machine.connectionClosed(id, now: .now), unconfirmed)
        }
        if unconfirmed > 0 {
            logger.notice("legacy gateway connection closed without an error-response; re-sending what had not passed its quiet period", metadata: [
                "legacy.connection": "\(id)", "legacy.unconfirmed": "\(unconfirmed)",
            ])
        }
        execute(actions)
    }

    // MARK: Running

    /// Keeps the connections open until graceful shutdown (or `shutdown()`), then lets written
    /// notifications finish their quiet period (up to `drainTimeout`) and closes.
    public func run() async throws {
        let start = state.withLock { state -> Bool in
            guard state.phase == .idle else { return false }
            state.phase = .running
            return true
        }
        guard start else { return }
        // Cancellation too (the stop's time is up): a checked continuation does not see it.
        await withTaskCancellationOrGracefulShutdownHandler {
            await withTaskGroup(of: Void.self) { group in
                for slot in 0..<configuration.connections {
                    group.addTask { await self.runSlot(slot) }
                }
                group.addTask { await self.runTicks() }
                await self.waitForShutdownRequest()
                await self.drainAndClose()
                group.cancelAll()
            }
        } onCancelOrGracefulShutdown: {
            self.shutdown()
        }
        // Anything still waiting (a connection that never came back) gets its answer now.
        let actions = state.withLock { state in
            state.phase = .stopped
            return state.machine.finishAll("the legacy gateway client shut down before the gateway's verdict")
        }
        execute(actions)
    }

    /// Begins a clean shutdown: nothing more is taken, queued notifications are answered, and
    /// `run()` returns once written ones have their verdicts or `drainTimeout` passed.
    public func shutdown() {
        let (waiters, connecting) = state.withLock { state -> ([CheckedContinuation<Void, Never>], [any Channel]) in
            guard !state.shutdownRequested else { return ([], []) }
            state.shutdownRequested = true
            defer {
                state.shutdownWaiters = []
                state.connecting = [:]
            }
            return (state.shutdownWaiters, Array(state.connecting.values))
        }
        for channel in connecting { channel.close(promise: nil) }
        for waiter in waiters { waiter.resume() }
    }

    /// Registers a connection attempt's channel, so that a shutdown can end it; false when the
    /// shutdown has already begun (the attempt is not wanted).
    private func startedConnecting(_ id: UInt64, channel: any Channel) -> Bool {
        state.withLock { state in
            guard !state.shutdownRequested else { return false }
            state.connecting[id] = channel
            return true
        }
    }

    private func stoppedConnecting(_ id: UInt64) {
        state.withLock { _ = $0.connecting.removeValue(forKey: id) }
    }

    private func waitForShutdownRequest() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let already = state.withLock { state -> Bool in
                if state.shutdownRequested { return true }
                state.shutdownWaiters.append(continuation)
                return false
            }
            if already { continuation.resume() }
        }
    }

    private func drainAndClose() async {
        execute(state.withLock { $0.machine.shutdown() })
        let end = ContinuousClock.now + configuration.drainTimeout
        // Cancelled (the stop's time is up): close at once; the sleep would not wait anyway.
        while !Task.isCancelled, ContinuousClock.now < end, !state.withLock({ $0.machine.isIdle }) {
            do { try await Task.sleep(for: tickInterval) } catch { break }
        }
        let channels = state.withLock { state in
            state.phase = .stopped
            return Array(state.channels.values)
        }
        for channel in channels { channel.close(promise: nil) }
        for channel in channels { try? await channel.closeFuture.get() }
    }

    private var tickInterval: Duration {
        Machine.tickInterval(configuration.quietPeriod)
    }

    /// Confirms quiet notifications and enforces deadlines.
    private func runTicks() async {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: tickInterval)
            } catch {
                return
            }
            execute(state.withLock { $0.machine.tick(now: .now) })
        }
    }

    private var keepsConnecting: Bool {
        state.withLock { $0.phase == .running && !$0.shutdownRequested }
    }

    /// One connection slot: connect, serve until closed, back off, reconnect.
    private func runSlot(_ slot: Int) async {
        var backoff = ReconnectBackoff(base: configuration.reconnectBackoff.base, maximum: configuration.reconnectBackoff.maximum)
        var errorReconnects = ReconnectPacer(configuration.errorReconnects)
        while keepsConnecting {
            let id = state.withLock { state -> UInt64 in
                state.nextConnectionID += 1
                return state.nextConnectionID
            }
            let outcome = await connectAndServe(id)
            guard keepsConnecting else { return }
            let delay: Duration
            switch outcome {
            case .errorResponse(let trouble, let lived):
                // The gateway closes after every error-response: for a bad notification (a bad
                // token, say) that is the protocol, so reconnect at once, within a pace. Errors
                // that blame the gateway, one quickly after another, back off: Apple treats rapid
                // connect-and-close as an attack.
                if trouble, lived < .seconds(1) {
                    delay = backoff.nextDelay(jitter: Double.random(in: 0...1))
                } else {
                    backoff.reset()
                    delay = errorReconnects.delay(now: .now)
                    if delay > .zero {
                        metrics.event("reconnect_paced")
                        logger.debug("legacy gateway error-responses come fast; pacing reconnects", metadata: [
                            "legacy.slot": "\(slot)", "legacy.delay": "\(delay)",
                        ])
                    }
                }
            case .closed(let lived):
                if lived >= .seconds(1) { backoff.reset() }
                delay = backoff.nextDelay(jitter: Double.random(in: 0...1))
                logger.debug("legacy gateway connection closed; reconnecting", metadata: ["legacy.connection": "\(id)", "legacy.delay": "\(delay)"])
            case .failed(let error):
                delay = backoff.nextDelay(jitter: Double.random(in: 0...1))
                metrics.event("connect_failed")
                logger.warning("legacy gateway connection failed; retrying", metadata: [
                    "legacy.slot": "\(slot)", "error": "\(error)", "legacy.delay": "\(delay)",
                ])
            }
            if delay > .zero {
                do {
                    try await Task.sleep(for: delay)
                } catch {
                    return
                }
            }
        }
    }

    private enum SlotOutcome {
        case failed(LegacyClientError)
        case closed(lived: Duration)
        case errorResponse(trouble: Bool, lived: Duration)
    }

    private func connectAndServe(_ id: UInt64) async -> SlotOutcome {
        let endpoint = configuration.endpoint
        let eventLoop = eventLoopGroup.next()
        let ready = eventLoop.makePromise(of: Void.self)
        let sslContext = self.sslContext
        let serverHostname = LegacyTLS.serverHostname(endpoint.host)
        let bootstrap = ClientBootstrap(group: eventLoop)
            // Writes are batched by the client; once flushed they should leave at once.
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            // The gateway acknowledges nothing, so a peer gone silently (a NAT dropping the flow)
            // would otherwise keep the connection "open" for TCP's 15 minutes of retransmissions.
            // Keepalives find it when idle; TCP_USER_TIMEOUT aborts it once written bytes stay
            // unacknowledged for a while, and what is still inside its quiet period is written
            // again. (What passed its quiet period meanwhile already counted as accepted.)
            .channelOption(.socketOption(.so_keepalive), value: 1)
            .connectTimeout(TimeAmount(configuration.connectTimeout))
            .channelInitializer { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    guard startedConnecting(id, channel: channel) else {
                        throw LegacyClientError(.connect, "the legacy gateway client is shutting down")
                    }
                    try LegacyTCP.detectSilentPeers(channel, quietPeriod: configuration.quietPeriod)
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname))
                    }
                    try channel.pipeline.syncOperations.addHandler(
                        GatewayConnectionHandler(id: id, owner: self, waitsForHandshake: sslContext != nil, ready: ready)
                    )
                }
            }
        defer { stoppedConnecting(id) }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            ready.fail(error)
            return .failed(LegacyClientError(.connect, "cannot connect to \(endpoint.label): \(error)"))
        }
        let timeout = eventLoop.scheduleTask(in: TimeAmount(configuration.connectTimeout)) {
            ready.fail(LegacyClientError(.timeout, "no TLS handshake with \(endpoint.label) within \(self.configuration.connectTimeout)"))
            channel.close(promise: nil)
        }
        // The timer and the handshake's completion both run on the channel's loop: a handshake
        // that completed first cancels the timer there, and keeps its connection.
        ready.futureResult.whenComplete { _ in timeout.cancel() }
        do {
            try await ready.futureResult.get()
        } catch {
            channel.close(promise: nil)
            try? await channel.closeFuture.get()
            connectionClosed(id)
            let failure = error as? LegacyClientError ?? LegacyClientError(.connect, "TLS with \(endpoint.label) failed: \(error)")
            return .failed(failure)
        }
        let connectedAt = ContinuousClock.now
        // Shutdown may have begun while connecting: then this connection is not wanted.
        if !keepsConnecting { channel.close(promise: nil) }
        try? await channel.closeFuture.get()
        // The handler reports the close too; whichever comes first settles the window.
        connectionClosed(id)
        let trouble = state.withLock { $0.answeredWithError.removeValue(forKey: id) }
        let lived = ContinuousClock.now - connectedAt
        return trouble.map { .errorResponse(trouble: $0, lived: lived) } ?? .closed(lived: lived)
    }
}

/// One gateway connection's inbound side: readiness, the error-response, the close.
private final class GatewayConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let id: UInt64
    private let owner: LegacyGatewayClient
    private let waitsForHandshake: Bool
    private let ready: EventLoopPromise<Void>
    private var isReady = false
    private var done = false
    private var received: [UInt8] = []

    init(id: UInt64, owner: LegacyGatewayClient, waitsForHandshake: Bool, ready: EventLoopPromise<Void>) {
        self.id = id
        self.owner = owner
        self.waitsForHandshake = waitsForHandshake
        self.ready = ready
    }

    func channelActive(context: ChannelHandlerContext) {
        if !waitsForHandshake { becomeReady(context: context) }
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if waitsForHandshake, let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent {
            becomeReady(context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func becomeReady(context: ChannelHandlerContext) {
        guard !isReady else { return }
        isReady = true
        ready.succeed()
        owner.connectionReady(id, channel: context.channel)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        var buffer = unwrapInboundIn(data)
        received += buffer.readBytes(length: buffer.readableBytes) ?? []
        // The gateway sends exactly one thing, ever: a 6-byte error-response before it closes.
        guard received.count >= LegacyErrorResponse.byteCount else { return }
        done = true
        if let response = LegacyErrorResponse(bytes: received) {
            owner.errorResponse(id, response)
        } else {
            owner.unintelligible(id, Array(received.prefix(16)))
        }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !isReady {
            ready.fail(LegacyClientError(.connect, "the gateway closed the connection during the TLS handshake (is the client certificate accepted?)"))
        }
        owner.connectionClosed(id)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // After an error-response the gateway closes, often without a TLS close_notify or with
        // our writes unread (a reset): the expected end of a connection, not a failure.
        let expectedEnd = done || (error as? NIOSSLError) == .uncleanShutdown
        if expectedEnd {
            // Nothing to report.
        } else if isReady {
            // Before readiness the connect attempt reports it; after, this is the only trace (a
            // client certificate refused after a TLS 1.3 handshake, a reset).
            owner.connectionFailed(id, error)
        } else {
            ready.fail(error)
        }
        context.close(promise: nil)
    }
}

/// TCP options for gateway connections (Linux names; NIO has none for these).
enum LegacyTCP {
    /// Keepalives after 15 s idle, every 5 s, three missed; written bytes unacknowledged for
    /// ``userTimeoutMilliseconds(quietPeriod:)`` abort the connection. Linux only (elsewhere
    /// the keepalive defaults apply).
    static func detectSilentPeers(_ channel: any Channel, quietPeriod: Duration) throws {
        #if os(Linux)
        let options = channel.syncOptions
        func set(_ name: Int32, _ value: Int) throws {
            try options?.setOption(ChannelOptions.Types.SocketOption(level: .tcp, name: NIOBSDSocket.Option(rawValue: name)), value: value)
        }
        try set(TCP_KEEPIDLE, 15)
        try set(TCP_KEEPINTVL, 5)
        try set(TCP_KEEPCNT, 3)
        try set(TCP_USER_TIMEOUT, userTimeoutMilliseconds(quietPeriod: quietPeriod))
        #endif
    }

    /// Written bytes may stay unacknowledged this long: ten seconds, or five quiet periods if
    /// that is longer (a gateway on a slow link is not declared dead early).
    static func userTimeoutMilliseconds(quietPeriod: Duration) -> Int {
        let quiet = quietPeriod.components
        let quietMilliseconds = min(quiet.seconds, 1_000_000) * 1000 + quiet.attoseconds / 1_000_000_000_000_000
        return Int(max(10_000, 5 * quietMilliseconds))
    }
}
