import APNsCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle
import Synchronization

/// A pool of long-lived APNs connections for one app and environment, as a ServiceLifecycle
/// `Service`.
///
/// ```swift
/// let pool = try APNsClientPool(configuration: configuration, logger: logger)
/// // in a ServiceGroup, or: async let running: Void = pool.run()
/// let outcome = await pool.send(notification, timeout: .seconds(10))
/// ```
///
/// - `configuration.connections` connections are kept open; each is replaced after GOAWAY,
///   a dead PING or a close, with exponential backoff and jitter.
/// - A request goes to the connection with the most free streams (a throttled connection,
///   whose stream limit APNs lowered, gets less work). When every stream is taken the caller
///   suspends until one frees up or its deadline passes: back-pressure instead of a queue that grows.
/// - Requests APNs certainly did not process (REFUSED_STREAM, above a GOAWAY's last stream)
///   are sent again on another connection, up to `unprocessedRetries` times, within the deadline.
///
/// Two ways to send: `send` suspends the calling task until the answer; `submit` returns at once
/// and hands the outcome to an ``APNsOutcomeReceiver``, so that a caller with many requests in
/// flight (the push worker, a benchmark) needs no task per request.
public final class APNsClientPool: Service, Sendable {
    public let configuration: APNsClientConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    private let metrics: ClientMetrics
    private let sslContext: NIOSSLContext

    /// What a caller waiting for a stream is given.
    private enum Lease: Sendable {
        case connection(APNsConnection)
        case shutdown
        case timeout
        /// No connection is up and the last attempts to connect failed.
        case connectionFailed(String)
    }

    /// Someone waiting for a stream: a suspended `send`, or a submitted request.
    private enum Waiter: Sendable {
        case caller(UnsafeContinuation<Lease, Never>)
        case submitted(APNsRequest)
    }

    private struct State {
        var assignment = PoolAssignment<Waiter>()
        var connections: [UInt64: APNsConnection] = [:]
        var tokenRejections: TokenRejectionTracker
        var configurationError: APNsClientError?
        var nextConnectionID: UInt64 = 0
        /// Slots whose latest connect attempt failed. Only when every slot is in it can the pool
        /// not connect: one slot failing while another replaces a connection (after a routine
        /// GOAWAY) must not fail every request until the replacement is ready.
        var failingSlots: Set<Int> = []
        let slotCount: Int
        /// No connection is usable and every slot's last attempt to connect failed: waiting
        /// would serve no one, so callers hear "connection failed" now, not at their deadline.
        var cannotServe: Bool {
            failingSlots.count >= slotCount && !assignment.entries.contains { $0.budget.isUsable }
        }
        var lastConnectError: APNsClientError?
        var shutdownRequested = false
        var shutdownWaiters: [UnsafeContinuation<Void, Never>] = []
        /// `expireWaiters`, parked while no one waits for a stream.
        var parkedSweeper: UnsafeContinuation<Void, Never>?

        /// Queues `waiter` until `deadline`; returns the sweeper to wake if it was parked.
        mutating func enqueue(_ waiter: Waiter, deadline: NIODeadline) -> UnsafeContinuation<Void, Never>? {
            assignment.enqueue(waiter, deadline: deadline.uptimeNanoseconds)
            defer { parkedSweeper = nil }
            return parkedSweeper
        }
    }

    private let state: Mutex<State>
    private let unprocessedRetryCount = Atomic<Int>(0)

    public init(
        configuration: APNsClientConfiguration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.client")
    ) throws(APNsClientError) {
        try configuration.validate()
        self.configuration = configuration
        self.group = eventLoopGroup
        var logger = logger
        logger[metadataKey: "apns.app"] = "\(configuration.name)"
        self.logger = logger
        self.metrics = ClientMetrics(app: configuration.name, environment: configuration.endpoint.metricLabel)
        self.sslContext = try configuration.makeTLSContext()
        self.state = Mutex(State(tokenRejections: TokenRejectionTracker(threshold: configuration.tokenRejectionsBeforeError), slotCount: configuration.connections))
    }

    // MARK: Sending

    /// Sends one notification and returns APNs's answer, or why there was none.
    ///
    /// Suspends while every stream of every connection is busy (back-pressure). Never throws:
    /// a passed deadline, a shutdown or a broken connection are outcomes.
    ///
    /// - Parameters:
    ///   - deadline: when the answer must have arrived; the stream is cancelled then.
    ///   - sendBy: when the request must have been written; still waiting for a stream then, it
    ///     is not sent and the outcome is `tooLate`.
    public func send(_ notification: APNsNotification, deadline: NIODeadline, sendBy: NIODeadline = .distantFuture) async -> APNsOutcome {
        var retries = 0
        let waitsUntil = min(deadline, sendBy)
        while true {
            let leased = await lease(deadline: waitsUntil)
            guard case .connection(let connection) = leased else { return unanswered(leased, sendBy: sendBy) }
            let outcome = await connection.execute(notification, deadline: deadline, sendBy: sendBy)
            if shouldSendAgain(outcome, retries: retries, deadline: waitsUntil) {
                retries += 1
                continue
            }
            return outcome
        }
    }

    /// Whether a request APNs certainly did not process goes out again (and counts it if so).
    private func shouldSendAgain(_ outcome: APNsOutcome, retries: Int, deadline: NIODeadline) -> Bool {
        guard case .notAnswered(let why) = outcome, why.certainlyNotProcessed,
            why.kind == .refusedStream || why.kind == .goAway || why.kind == .connectionFailed,
            retries < configuration.unprocessedRetries, NIODeadline.now() < deadline
        else { return false }
        metrics.unprocessedRetry(why.kind)
        unprocessedRetryCount.add(1, ordering: .relaxed)
        return true
    }

    /// Sends one notification without suspending: the outcome goes to `receiver` (with `tag`),
    /// exactly once, on an event loop, after this returns. Retries, deadlines and back-pressure
    /// are as for `send`, except that a request waiting for a stream waits in the pool's queue.
    /// A caller bounds how many it submits (the queue holds whatever it is given).
    public func submit(_ notification: APNsNotification, deadline: NIODeadline, sendBy: NIODeadline = .distantFuture, to receiver: any APNsOutcomeReceiver, tag: Int = 0) {
        submit(APNsRequest(notification: notification, deadline: deadline, sendBy: sendBy, destination: .receiver(receiver, tag: tag)))
    }

    private func submit(_ request: APNsRequest) {
        let (immediate, sweeper) = state.withLock { state -> (Lease?, UnsafeContinuation<Void, Never>?) in
            if let lease = Self.immediateLease(&state) { return (lease, nil) }
            if request.waitsUntil <= .now() { return (.timeout, nil) }
            return (nil, state.enqueue(.submitted(request), deadline: request.waitsUntil))
        }
        sweeper?.resume()
        if let immediate { serve(.submitted(request), with: immediate) }
    }

    /// Gives a waiter what it waited for: a caller is resumed; a submitted request is written to
    /// its connection, or told why it cannot be (on an event loop, never inside `submit`, so a
    /// receiver that submits again from its callback does not recurse).
    private func serve(_ waiter: Waiter, with lease: Lease) {
        switch waiter {
        case .caller(let continuation):
            continuation.resume(returning: lease)
        case .submitted(let request):
            if case .connection(let connection) = lease {
                connection.enqueue(request)
                return
            }
            let outcome = unanswered(lease, sendBy: request.sendBy)
            group.any().execute { request.deliver(outcome) }
        }
    }

    /// The outcome for a request that never left the client, given the lease it got instead of
    /// a connection.
    private func unanswered(_ lease: Lease, sendBy: NIODeadline) -> APNsOutcome {
        let why: APNsNotAnswered
        switch lease {
        // `.connection` is not passed here (callers send on it); it reads as a shutdown.
        case .shutdown, .connection: why = APNsNotAnswered(.shutdown, "the client is shutting down", certainlyNotProcessed: true)
        // Why it waited stays in the text: "no connection became ready" is the clue to an
        // egress problem when short-deadline jobs come out expired.
        case .timeout where sendBy <= .now(): why = APNsRequest.tooLate("while it waited: \(waitingTimeoutDetail())")
        case .timeout: why = APNsNotAnswered(.timeout, waitingTimeoutDetail(), certainlyNotProcessed: true)
        case .connectionFailed(let detail): why = APNsNotAnswered(.connectionFailed, detail, certainlyNotProcessed: true)
        }
        let outcome = APNsOutcome.notAnswered(why)
        metrics.record(outcome)
        return outcome
    }

    /// `send` with a deadline `timeout` from now.
    public func send(_ notification: APNsNotification, timeout: Duration) async -> APNsOutcome {
        await send(notification, deadline: .now() + TimeAmount(timeout))
    }

    private func waitingTimeoutDetail() -> String {
        let usable = state.withLock { $0.assignment.entries.filter { $0.budget.isUsable }.count }
        return usable == 0
            ? "no connection to \(configuration.endpoint.host):\(configuration.endpoint.port) became ready before the deadline"
            : "every stream stayed busy until the deadline"
    }

    /// A connection with a stream taken for the caller, waiting for one if needed.
    private func lease(deadline: NIODeadline) async -> Lease {
        let immediate = state.withLock { state -> Lease? in
            Self.immediateLease(&state)
        }
        if let immediate { return immediate }
        if deadline <= .now() { return .timeout }
        return await withUnsafeContinuation { (continuation: UnsafeContinuation<Lease, Never>) in
            let sweeper = state.withLock { state -> UnsafeContinuation<Void, Never>? in
                if let immediate = Self.immediateLease(&state) {
                    continuation.resume(returning: immediate)
                    return nil
                }
                // Given up by `expireWaiters`, at most `deadlineCheckInterval` after the deadline.
                defer { metrics.recordWaiting(state.assignment.waiterCount) }
                return state.enqueue(.caller(continuation), deadline: deadline)
            }
            sweeper?.resume()
        }
    }

    /// Tells waiters whose deadline passed that no stream freed up in time. One sweep per pool,
    /// every `deadlineCheckInterval` while anyone waits, instead of a timer per waiting request;
    /// parked while no one does (an idle pool used to wake 50 times a second for nothing), until
    /// the next waiter or the shutdown.
    private func expireWaiters() async {
        while !isShuttingDown {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let goOn = state.withLock { state -> Bool in
                    if state.shutdownRequested || state.assignment.waiterCount > 0 { return true }
                    state.parkedSweeper = continuation
                    return false
                }
                if goOn { continuation.resume() }
            }
            try? await Task.sleep(for: configuration.deadlineCheckInterval)
            let now = NIODeadline.now().uptimeNanoseconds
            let expired = state.withLock { $0.assignment.expire(now: now) }
            for waiter in expired { serve(waiter, with: .timeout) }
        }
    }

    /// A lease that needs no waiting: a free stream, a shutdown, or a pool that cannot connect.
    private static func immediateLease(_ state: inout State) -> Lease? {
        if state.assignment.shuttingDown { return .shutdown }
        if let id = state.assignment.acquire() {
            if let connection = state.connections[id] { return .connection(connection) }
            // Its connection is gone: the stream goes back, but serves no one.
            state.assignment.restrict(connection: id) { $0.close(tokenAccepted: false) }
        }
        if state.cannotServe {
            return .connectionFailed(state.lastConnectError?.message ?? "cannot connect to APNs")
        }
        return nil
    }

    /// Hands freed streams to waiters (outside the lock).
    private func resume(_ served: [(connection: UInt64, waiter: Waiter)], _ connections: [UInt64: APNsConnection]) {
        for (id, waiter) in served {
            serve(waiter, with: connections[id].map { .connection($0) } ?? .connectionFailed("the connection closed"))
        }
    }

    /// The last failure to connect, while no connection is up.
    public var connectError: APNsClientError? {
        state.withLock { state in
            state.assignment.entries.contains { $0.budget.isUsable } ? nil : state.lastConnectError
        }
    }

    // MARK: Observing

    /// Set when APNs keeps rejecting fresh provider tokens (wrong key id, team id or key, or a
    /// clock far off), or keeps answering 403 about the credentials themselves (a certificate
    /// for the other environment, say); cleared by the next answer that proves the credentials.
    public var configurationError: APNsClientError? {
        state.withLock { $0.configurationError }
    }

    /// A snapshot for diagnostics and tests.
    public struct Statistics: Sendable, Hashable {
        /// Connections that take work now.
        public var usableConnections: Int
        /// The stream limit of each usable connection.
        public var streamLimits: [Int]
        public var inFlight: Int
        public var waiting: Int
        /// Requests re-sent because APNs certainly did not process them (refused, GOAWAY), since start.
        public var unprocessedRetries: Int
    }

    public var statistics: Statistics {
        state.withLock { state in
            let usable = state.assignment.entries.filter { $0.budget.isUsable }
            return Statistics(
                usableConnections: usable.count,
                streamLimits: usable.map(\.budget.limit),
                inFlight: state.assignment.inFlight,
                waiting: state.assignment.waiterCount,
                unprocessedRetries: unprocessedRetryCount.load(ordering: .relaxed)
            )
        }
    }

    /// Waits until `count` connections are usable (or `timeout` passes); true if they are.
    public func waitUntilReady(connections count: Int? = nil, timeout: Duration = .seconds(10)) async -> Bool {
        let wanted = count ?? configuration.connections
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end, !Task.isCancelled {
            if statistics.usableConnections >= wanted { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return statistics.usableConnections >= wanted
    }

    // MARK: Running

    /// Keeps the connections open until graceful shutdown (or `shutdown()`), then drains.
    /// Cancelled, it shuts down the same way: its loops sleep through `Task.sleep`, which a
    /// cancelled task returns from at once, so they would otherwise spin until a shutdown.
    public func run() async throws {
        await withTaskCancellationOrGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                for slot in 0..<configuration.connections {
                    group.addTask { await self.runSlot(slot) }
                }
                group.addTask { await self.sampleGauges() }
                group.addTask { await self.expireWaiters() }
                await self.waitForShutdownRequest()
                await self.drainAndClose()
            }
        } onCancelOrGracefulShutdown: {
            self.shutdown()
        }
    }

    /// Begins a clean shutdown: waiting callers get `.shutdown`, in-flight requests get up to
    /// `drainTimeout` to finish, then every connection closes and `run()` returns.
    public func shutdown() {
        let (waiters, shutdownWaiters) = state.withLock { state -> ([Waiter], [UnsafeContinuation<Void, Never>]) in
            guard !state.shutdownRequested else { return ([], []) }
            state.shutdownRequested = true
            let waiters = state.assignment.shutdown()
            var shutdownWaiters = state.shutdownWaiters
            state.shutdownWaiters.removeAll()
            if let sweeper = state.parkedSweeper { shutdownWaiters.append(sweeper) }
            state.parkedSweeper = nil
            return (waiters, shutdownWaiters)
        }
        for waiter in waiters { serve(waiter, with: .shutdown) }
        for waiter in shutdownWaiters { waiter.resume() }
    }

    private var isShuttingDown: Bool { state.withLock { $0.shutdownRequested } }

    private func waitForShutdownRequest() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let already = state.withLock { state -> Bool in
                if state.shutdownRequested { return true }
                state.shutdownWaiters.append(continuation)
                return false
            }
            if already { continuation.resume() }
        }
    }

    private func drainAndClose() async {
        let connections = state.withLock { Array($0.connections.values) }
        // Cancelled (a forced stop), there is no time left to give in-flight requests.
        let deadline = Task.isCancelled ? NIODeadline.now() : NIODeadline.now() + TimeAmount(configuration.drainTimeout)
        for connection in connections { connection.drain(until: deadline) }
        for connection in connections { try? await connection.closedFuture.get() }
    }

    /// How long a connection that answered 200 must have lasted for its slot's backoff to reset.
    static let provenLifetime: Duration = .seconds(2)

    /// One connection slot: connect, serve until unusable, back off, reconnect.
    private func runSlot(_ slot: Int) async {
        var backoff = ReconnectBackoff(base: configuration.reconnectBackoff.base, maximum: configuration.reconnectBackoff.maximum)
        while !isShuttingDown {
            let id = state.withLock { state -> UInt64 in
                state.nextConnectionID += 1
                return state.nextConnectionID
            }
            let connection = APNsConnection(id: id, eventLoop: group.next(), configuration: configuration, events: self, logger: logger, metrics: metrics)
            state.withLock { state in
                state.connections[id] = connection
                state.assignment.add(connection: id, budget: StreamBudget(localLimit: configuration.maximumStreamsPerConnection, tokenAuthentication: configuration.authentication.isToken))
            }
            do {
                try await connection.connect(sslContext: sslContext)
                state.withLock { _ = $0.failingSlots.remove(slot) }
                let readyAt = ContinuousClock.now
                if isShuttingDown { connection.drain(until: .now()) }
                try? await connection.unusableFuture.get()
                // A 200 on a connection that then lasted a while proves it; so does serving
                // longer than the longest backoff (an app whose answers are all 410s, or one APNs
                // closed for being idle), which otherwise left every replacement waiting the
                // maximum. A server closing each connection right after its first answer still
                // sees the backoff grow: APNs takes rapid reconnects for an attack.
                let lived = ContinuousClock.now - readyAt
                if (connection.hadSuccessSnapshot && lived >= Self.provenLifetime) || lived >= backoff.maximum { backoff.reset() }
            } catch {
                metrics.connectionEvent("connect_failed")
                let failure = error as? APNsClientError ?? APNsClientError(.connect, "\(error)")
                // Logged at warning the first time, then quietly while it keeps failing.
                let waiters = state.withLock { state -> [Waiter] in
                    state.assignment.remove(connection: id)
                    state.connections[id] = nil
                    state.failingSlots.insert(slot)
                    state.lastConnectError = failure
                    return state.cannotServe ? state.assignment.takeAllWaiters() : []
                }
                if backoff.failures == 0 {
                    logger.warning("Cannot connect to APNs", metadata: ["apns.error": "\(failure.message)", "apns.slot": "\(slot)"])
                } else {
                    logger.debug("Still cannot connect to APNs", metadata: ["apns.error": "\(failure.message)", "apns.slot": "\(slot)"])
                }
                for waiter in waiters { serve(waiter, with: .connectionFailed(failure.message)) }
            }
            if isShuttingDown { break }
            let delay = backoff.nextDelay(jitter: Double.random(in: 0...1))
            let wakeUp = ContinuousClock.now + delay
            while !isShuttingDown, ContinuousClock.now < wakeUp {
                try? await Task.sleep(for: min(.milliseconds(50), wakeUp - ContinuousClock.now))
            }
        }
    }

    /// Streams in use and callers waiting change with every request; publishing them there would
    /// cost the hot path a metrics update per stream; four samples a second are what a scrape sees.
    private func sampleGauges() async {
        while !isShuttingDown {
            state.withLock { state in
                publishGauges(state)
                metrics.recordWaiting(state.assignment.waiterCount)
            }
            try? await Task.sleep(for: .milliseconds(250))
        }
    }

    private func publishGauges(_ state: borrowing State) {
        var limit = 0
        var smallest: Int?
        var connections = (connecting: 0, ready: 0, goingAway: 0)
        for entry in state.assignment.entries {
            if entry.budget.isUsable {
                limit += entry.budget.limit
                smallest = min(smallest ?? .max, entry.budget.limit)
                connections.ready += 1
            } else if entry.budget.goingAway {
                connections.goingAway += 1
            } else {
                connections.connecting += 1
            }
        }
        metrics.recordPool(streamLimit: limit, smallestStreamLimit: smallest ?? 0, connections: connections, inFlight: state.assignment.inFlight)
    }
}

extension APNsClientPool: APNsConnectionEvents {
    func connectionBecameReady(_ connection: APNsConnection, maxConcurrentStreams: UInt32?) {
        let (served, connections) = state.withLock { state in
            state.lastConnectError = nil
            let served = state.assignment.update(connection: connection.id) { $0.settingsReceived(maxConcurrentStreams: maxConcurrentStreams) }
            publishGauges(state)
            return (served, state.connections)
        }
        resume(served, connections)
    }

    func connection(_ connection: APNsConnection, didChangeMaxConcurrentStreams value: UInt32) {
        let (served, connections) = state.withLock { state in
            let served = state.assignment.update(connection: connection.id) { $0.settingsReceived(maxConcurrentStreams: value) }
            publishGauges(state)
            return (served, state.connections)
        }
        logger.debug("Stream limit changed", metadata: ["apns.connection": "\(connection.id)", "apns.max_concurrent_streams": "\(value)"])
        resume(served, connections)
    }

    func connection(_ connection: APNsConnection, didFinishStreams count: Int, tokenAccepted: Bool) {
        let served = state.withLock { state -> [(connection: UInt64, waiter: Waiter, target: APNsConnection?)] in
            if tokenAccepted, state.tokenRejections.consecutive > 0 || state.configurationError != nil {
                state.tokenRejections.accepted()
                state.configurationError = nil
            }
            let served = state.assignment.update(connection: connection.id) { $0.close(streams: count, tokenAccepted: tokenAccepted) }
            // Nobody waiting is the steady state: no array is built for it.
            if served.isEmpty { return [] }
            return served.map { ($0.connection, $0.waiter, state.connections[$0.connection]) }
        }
        for (_, waiter, target) in served { serve(waiter, with: target.map { .connection($0) } ?? .connectionFailed("the connection closed")) }
    }

    func connection(_ connection: APNsConnection, didFinish request: APNsRequest, with outcome: APNsOutcome) {
        if shouldSendAgain(outcome, retries: request.retries, deadline: request.waitsUntil) {
            submit(request.sentAgain())
        } else {
            request.deliver(outcome)
        }
    }

    func connection(_ connection: APNsConnection, didRejectProviderToken reason: APNsReason) {
        let action = state.withLock { state -> TokenRejectionTracker.Action in
            let action = state.tokenRejections.rejected(connection: connection.id)
            if case .replaceConnectionAndReport(let count) = action {
                state.configurationError = APNsClientError(
                    .providerTokenRejected,
                    "APNs rejected \(count) fresh provider tokens in a row (\(reason)): check the key id, team id and .p8 key of app '\(configuration.name)', and the system clock"
                )
            }
            return action
        }
        switch action {
        case .none:
            return
        case .replaceConnection:
            logger.notice("APNs rejected the provider token; replacing the connection with a fresh token", metadata: ["apns.reason": "\(reason)"])
        case .replaceConnectionAndReport:
            logger.error("\(configurationError?.message ?? "provider tokens keep being rejected")")
        }
        connection.retire(reason: "provider token rejected (\(reason))")
    }

    func connection(_ connection: APNsConnection, didRejectCredentials reason: APNsReason, inARow: Int) {
        let error = APNsClientError(
            .credentialsRejected,
            "APNs answered 403 \(reason) to \(inARow) requests in a row: check app '\(configuration.name)''s \(configuration.authentication.isToken ? "provider token settings" : "certificate") and its environment (\(configuration.endpoint.host))"
        )
        // Cleared, like a token rejection's, by the next answer that proves the credentials.
        state.withLock { $0.configurationError = error }
        logger.error("\(error.message)")
    }

    func connectionBecameUnusable(_ connection: APNsConnection) {
        state.withLock { state in
            state.assignment.restrict(connection: connection.id) { $0.goAwayReceived() }
            publishGauges(state)
        }
    }

    func connectionDidClose(_ connection: APNsConnection) {
        state.withLock { state in
            state.assignment.remove(connection: connection.id)
            state.connections[connection.id] = nil
            state.tokenRejections.connectionGone(connection.id)
            publishGauges(state)
        }
    }
}

/// Receives the outcomes of requests given to ``APNsClientPool/submit(_:deadline:sendBy:to:tag:)``.
public protocol APNsOutcomeReceiver: AnyObject, Sendable {
    /// Called exactly once per submitted request, on an event loop: return quickly and never
    /// block (other connections' answers wait behind it). May submit more requests.
    func receive(_ outcome: APNsOutcome, tag: Int)
}

extension APNsRequest {
    /// Hands the outcome to where it goes (a suspended caller, or a receiver).
    func deliver(_ outcome: APNsOutcome) {
        switch destination {
        case .caller(let continuation): continuation.resume(returning: outcome)
        case .receiver(let receiver, let tag): receiver.receive(outcome, tag: tag)
        }
    }
}
