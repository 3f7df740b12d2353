import APNsCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// Reads the legacy feedback service (Apple's port 2196): connect, read tuples until the server
/// closes, done. Nothing is sent.
///
/// ```swift
/// if let endpoint = app.legacyFeedback, case .certificate(let source) = app.authentication {
///     let client = LegacyFeedbackClient(endpoint: endpoint, certificate: source, logger: logger)
///     let tuples = try await client.fetch(timeout: .seconds(60))
/// }
/// ```
public struct LegacyFeedbackClient: Sendable {
    public let endpoint: LegacyEndpoint
    public let certificate: AppConfiguration.CertificateSource?
    private let eventLoopGroup: any EventLoopGroup
    private let logger: Logger

    public init(
        endpoint: LegacyEndpoint,
        certificate: AppConfiguration.CertificateSource?,
        logger: Logger,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) {
        self.endpoint = endpoint
        self.certificate = certificate
        self.logger = logger
        self.eventLoopGroup = eventLoopGroup
    }

    /// Loads the certificate, key and CA as a poll would, without connecting: a wrong password or
    /// an unreadable file is found at start, not at the first poll an hour later. Each poll loads
    /// them again, so renewed files are picked up.
    public func checkCredentials() throws(LegacyClientError) {
        _ = try LegacyTLS.context(endpoint: endpoint, certificate: certificate)
    }

    /// Connects (TLS with the client certificate, or plain TCP when the endpoint says so), reads
    /// every tuple until the server closes the connection, and returns them in order.
    ///
    /// Convenient for short lists; a worker should use ``fetch(timeout:chunkSize:deliver:)``,
    /// which holds at most a chunk in memory however long the list is.
    public func fetch(timeout: Duration) async throws -> [FeedbackTuple] {
        var tuples: [FeedbackTuple] = []
        try await fetch(timeout: timeout) { tuples += $0 }
        return tuples
    }

    /// Past the deadline, a service that sent something this recently is still sending.
    static let stillSending = TimeAmount.seconds(1)
    /// How long a ready connection that has carried no byte must stay silent to count as an
    /// empty list (at least; `quietEnd` if that is longer).
    static let emptyListQuiet = TimeAmount.seconds(5)

    /// Connects, reads tuples until the server closes the connection, and hands them to
    /// `deliver` in order, at most `chunkSize` at a time. Reading pauses once a chunk is full
    /// and resumes when `deliver` has taken everything read, so memory stays bounded by about a
    /// chunk plus one read, whatever the service sends.
    ///
    /// The service forgets tuples once it has sent them, so every tuple read is delivered, even
    /// when the stream then ends badly (cut inside a tuple, a read error, the deadline): that is
    /// logged as a warning. It throws when nothing could be read (bad credentials, no connection,
    /// a failed handshake, the deadline passing before the first tuple) and when the calling task
    /// is cancelled. The deadline counts only the time spent reading: while a full chunk waits
    /// for `deliver`, the clock stops. A service still sending when it passes is read on, up
    /// to twice `timeout` in all: what it sent and was not read would be lost.
    ///
    /// A service that has sent whole tuples (or nothing at all, once the connection and its TLS
    /// handshake are up) and then nothing for `quietEnd` is taken to be done, as if it had
    /// closed: Apple's closed at once, but a server that holds the connection open afterwards
    /// (the reference test server, for a minute) would otherwise end every poll at the
    /// deadline, as a failure; with an empty list, every poll, and the worker would never be
    /// ready.
    public func fetch(timeout: Duration, quietEnd: Duration = .seconds(5), chunkSize: Int = 10_000, deliver: ([FeedbackTuple]) async -> Void) async throws {
        let sslContext = try LegacyTLS.context(endpoint: endpoint, certificate: certificate)
        let eventLoop = eventLoopGroup.next()
        let (signals, signal) = AsyncStream.makeStream(of: FeedbackReader.Signal.self)
        let reader = FeedbackReader.Shared(chunkSize: max(chunkSize, 1), signal: signal)
        let serverHostname = LegacyTLS.serverHostname(endpoint.host)
        let endpoint = self.endpoint
        // The attempt's channel, so that a stop can end a connect that would otherwise last the
        // whole timeout (a service that does not answer SYNs).
        // `cancelled` covers a stop that comes before the channel exists.
        let connecting = Mutex<(channel: (any Channel)?, cancelled: Bool)>((nil, false))
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let cancelled = connecting.withLock { state in
                        state.channel = channel
                        return state.cancelled
                    }
                    if cancelled { throw CancellationError() }
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname))
                    }
                    try channel.pipeline.syncOperations.addHandler(FeedbackReader(shared: reader, waitsForHandshake: sslContext != nil))
                }
            }
        let startedAt = NIODeadline.now()
        let channel: any Channel
        do {
            channel = try await withTaskCancellationHandler {
                try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
            } onCancel: {
                connecting.withLock { state in
                    state.cancelled = true
                    return state.channel
                }?.close(promise: nil)
            }
        } catch {
            if Task.isCancelled {
                throw LegacyClientError(.shutdown, "feedback service at \(endpoint.label): the poll was cancelled (the worker is stopping) while connecting")
            }
            throw LegacyClientError(.connect, "cannot connect to the feedback service at \(endpoint.label): \(error)")
        }
        // The deadline is for the service, so it counts only reading time. While a chunk waits
        // for `deliver` (Kafka slow, say), what the service already sent sits unread in the
        // socket, and closing then would throw away tuples it has forgotten.
        let budget = TimeAmount(timeout)
        let quiet = TimeAmount(quietEnd)
        let deadline = NIOLoopBoundBox.makeEmptyBox(valueType: Scheduled<Void>.self, eventLoop: eventLoop)
        // When the check below is due: a check that runs late (this process starved of CPU)
        // must not take its own lateness for the service's silence.
        let checkDue = NIOLoopBoundBox.makeBoxSendingValue(NIODeadline.now(), eventLoop: eventLoop)
        @Sendable func check(in wait: TimeAmount) {
            checkDue.value = .now() + wait
            deadline.value = eventLoop.scheduleTask(in: wait, expireWhenReading)
        }
        @Sendable func expireWhenReading() {
            let now = NIODeadline.now()
            let late = max(.zero, now - checkDue.value)
            let paused = reader.pausedTime(now: now)
            let reading = (now - startedAt) - paused.total
            let sinceLastRead = reader.quietTime(now: now)
            // Before the first byte, silence is taken for an empty list only after at least
            // `emptyListQuiet`: a service slow to start sending must not be cut off (what it then
            // writes to a closed connection, it has forgotten).
            let quietNeeded = reader.hasReadBytes ? quiet : max(quiet, Self.emptyListQuiet)
            if !paused.now, let sinceLastRead, sinceLastRead - late >= quietNeeded {
                signal.yield(.ended(.quiet))
                channel.close(promise: nil)
                return
            }
            guard !paused.now, reading >= budget else {
                var wait = paused.now ? .milliseconds(100) : budget - reading
                if !paused.now { wait = min(wait, quietNeeded - (sinceLastRead ?? .zero)) }
                return check(in: wait)
            }
            // Past the budget, a service still sending is not cut off at once: it has forgotten
            // what it sent, so bytes left unread are tuples lost. It is at twice the budget (a
            // stop waits for a poll; its callers size the budget for that).
            // Read bytes, not whole tuples: a stream in full flow is mostly cut inside one.
            if let sending = reader.sinceLastRead(now: now).map({ $0 - late }), sending < Self.stillSending, reading < budget * 2 {
                return check(in: Self.stillSending - max(.zero, sending))
            }
            signal.yield(.ended(.timedOut))
            channel.close(promise: nil)
        }
        // Arms itself for what is left of the budget.
        eventLoop.execute(expireWhenReading)

        var delivered = 0
        func deliverWhatWasRead() async {
            while case let chunk = reader.take(), !chunk.isEmpty {
                await deliver(chunk)
                delivered += chunk.count
            }
        }
        // Stays so only if the signals end without an ending: the task was cancelled.
        var ending = FeedbackReader.Ending.cancelled
        for await next in signals {
            await deliverWhatWasRead()
            if case .ended(let how) = next {
                ending = how
                break
            }
            // Room again: the reader may go on.
            channel.triggerUserOutboundEvent(FeedbackReader.ResumeReading(), promise: nil)
        }
        eventLoop.execute { deadline.value?.cancel() }
        channel.close(promise: nil)
        try? await channel.closeFuture.get()
        // Whatever arrived between the end and the close.
        await deliverWhatWasRead()
        let (leftover, bytes, failure, malformed) = reader.state.withLock {
            ($0.decoder.leftoverByteCount, $0.bytesRead, $0.failure, $0.decoder.malformation != nil)
        }

        var problem: String?
        switch ending {
        case .cancelled:
            throw LegacyClientError(.shutdown, "feedback service at \(endpoint.label): the poll was cancelled (the worker is stopping) after \(delivered) tuples")
        case .closed:
            if let failure { problem = failure }
        case .quiet:
            logger.debug("feedback service went quiet between tuples; taking the list as complete", metadata: ["legacy.feedback": "\(endpoint.label)", "legacy.quiet_end": "\(quietEnd)"])
            if let failure { problem = failure }
        case .timedOut:
            problem = "the deadline (\(timeout)) passed before the service closed the connection"
        }
        if leftover > 0, !malformed {
            problem = [problem, "the stream ended inside a tuple (\(leftover) bytes left over)"].compactMap { $0 }.joined(separator: "; ")
        }
        if let problem {
            guard delivered > 0 else {
                let code: LegacyClientError.Code = ending == .timedOut ? .timeout : (bytes == 0 && failure != nil ? .connect : .protocolError)
                throw LegacyClientError(code, "feedback service at \(endpoint.label): \(problem)")
            }
            logger.warning("feedback stream ended badly; keeping the tuples read", metadata: [
                "legacy.feedback": "\(endpoint.label)", "legacy.tuples": "\(delivered)", "legacy.problem": "\(problem)",
            ])
        }
        logger.debug("feedback service read", metadata: ["legacy.feedback": "\(endpoint.label)", "legacy.tuples": "\(delivered)", "legacy.bytes": "\(bytes)"])
    }
}

/// Decodes tuples on the event loop, in whatever pieces the stream arrives, and stops reading
/// while a full chunk waits to be delivered.
private final class FeedbackReader: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = Never

    enum Ending: Sendable, Equatable {
        /// The service closed the connection (or a read failed).
        case closed
        /// The service sent whole tuples, then nothing for the quiet period.
        case quiet
        case timedOut, cancelled
    }

    enum Signal: Sendable {
        /// A chunk is ready.
        case chunk
        case ended(Ending)
    }

    /// Sent by `fetch` once it has taken a chunk.
    struct ResumeReading {}

    struct State {
        var decoder = FeedbackTupleDecoder()
        var tuples: [FeedbackTuple] = []
        var bytesRead = 0
        var failure: String?
        /// A `read` is held back until `fetch` has taken the chunk.
        var holding = false
        /// Reading paused since then (a chunk filled up), and how long earlier pauses lasted.
        var pausedSince: NIODeadline?
        var pausedTotal = TimeAmount.zero
        /// When bytes last arrived, or reading last resumed; until the first bytes, when the
        /// connection was ready to read (TCP up, and the TLS handshake done); nil before that.
        var lastActivity: NIODeadline?
    }

    /// Shared between the event loop and `fetch`.
    final class Shared: Sendable {
        let state = Mutex(State())
        let chunkSize: Int
        let signal: AsyncStream<Signal>.Continuation

        init(chunkSize: Int, signal: AsyncStream<Signal>.Continuation) {
            self.chunkSize = chunkSize
            self.signal = signal
        }

        /// The oldest tuples read, at most a chunk.
        func take() -> [FeedbackTuple] {
            state.withLock { state in
                guard state.tuples.count > chunkSize else {
                    defer { state.tuples = [] }
                    return state.tuples
                }
                defer { state.tuples.removeFirst(chunkSize) }
                return Array(state.tuples.prefix(chunkSize))
            }
        }


        /// How long the stream has been quiet, once it is ready and stopped between whole tuples
        /// (or has sent none yet); nil otherwise.
        func quietTime(now: NIODeadline) -> TimeAmount? {
            state.withLock { state in
                guard let last = state.lastActivity, state.decoder.leftoverByteCount == 0 else { return nil }
                return now - last
            }
        }

        /// How long since the service last sent anything, inside a tuple or not; nil before it
        /// sent anything.
        func sinceLastRead(now: NIODeadline) -> TimeAmount? {
            state.withLock { state in state.bytesRead > 0 ? state.lastActivity.map { now - $0 } : nil }
        }

        /// Whether the service has sent anything yet.
        var hasReadBytes: Bool { state.withLock { $0.bytesRead > 0 } }

        /// The connection can carry tuples from now on: the quiet clock starts.
        func ready() {
            state.withLock { state in
                if state.lastActivity == nil { state.lastActivity = .now() }
            }
        }

        /// Whether reading is paused now, and for how long it has been paused in all.
        func pausedTime(now: NIODeadline) -> (now: Bool, total: TimeAmount) {
            state.withLock { state in
                guard let since = state.pausedSince else { return (false, state.pausedTotal) }
                return (true, state.pausedTotal + (now - since))
            }
        }
    }

    private let shared: Shared

    init(shared: Shared, waitsForHandshake: Bool) {
        self.shared = shared
        self.waitsForHandshake = waitsForHandshake
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let (full, malformed) = shared.state.withLock { state in
            state.bytesRead += buffer.readableBytes
            state.lastActivity = .now()
            buffer.withUnsafeReadableBytes { state.decoder.append($0) }
            let before = state.tuples.count
            while let tuple = state.decoder.next() { state.tuples.append(tuple) }
            if let malformation = state.decoder.malformation, state.failure == nil { state.failure = malformation }
            // Signalled once, when the chunk fills up; reading pauses from then on.
            guard before < shared.chunkSize, state.tuples.count >= shared.chunkSize else { return (false, state.decoder.malformation != nil) }
            if state.pausedSince == nil { state.pausedSince = .now() }
            return (true, state.decoder.malformation != nil)
        }
        if full { shared.signal.yield(.chunk) }
        // The whole tuples before it are kept (the close ends the poll as `closed`, with the reason).
        if malformed { context.close(promise: nil) }
    }

    func read(context: ChannelHandlerContext) {
        let held = shared.state.withLock { state in
            state.holding = state.tuples.count >= shared.chunkSize
            return state.holding
        }
        if !held { context.read() }
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is ResumeReading else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        promise?.succeed()
        let resume = shared.state.withLock { state in
            guard state.tuples.count < shared.chunkSize else { return false }
            if let since = state.pausedSince {
                let now = NIODeadline.now()
                state.pausedTotal = state.pausedTotal + (now - since)
                state.pausedSince = nil
                if state.lastActivity != nil { state.lastActivity = now }
            }
            guard state.holding else { return false }
            state.holding = false
            return true
        }
        if resume { context.read() }
    }

    /// Without TLS the connection is ready once up; with it, once the handshake is done (a slow
    /// handshake is not the service's silence).
    private let waitsForHandshake: Bool

    func channelActive(context: ChannelHandlerContext) {
        if !waitsForHandshake { shared.ready() }
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted = event as? TLSUserEvent { shared.ready() }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        shared.signal.yield(.ended(.closed))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A server that closes TCP without TLS close_notify has still sent everything.
        if let sslError = error as? NIOSSLError, case .uncleanShutdown = sslError {
            return
        }
        shared.state.withLock { state in
            if state.failure == nil { state.failure = "\(error)" }
        }
        context.close(promise: nil)
    }
}
