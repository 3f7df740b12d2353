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

    /// Connects (TLS with the client certificate, or plain TCP when the endpoint says so), reads
    /// every tuple until the server closes the connection, and returns them in order.
    ///
    /// The service forgets tuples once it has sent them, so tuples already read are returned even
    /// when the stream then ends badly (cut inside a tuple, a read error, the deadline): that is
    /// logged as a warning. It throws when nothing could be read: bad credentials, no connection,
    /// a failed handshake, or the deadline passing before the first tuple.
    public func fetch(timeout: Duration) async throws -> [FeedbackTuple] {
        let sslContext = try LegacyTLS.context(endpoint: endpoint, certificate: certificate)
        let eventLoop = eventLoopGroup.next()
        let finished = eventLoop.makePromise(of: FeedbackReader.Ending.self)
        let reader = FeedbackReader.Shared()
        let serverHostname = LegacyTLS.serverHostname(endpoint.host)
        let endpoint = self.endpoint
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname))
                    }
                    try channel.pipeline.syncOperations.addHandler(FeedbackReader(shared: reader, finished: finished))
                }
            }
        let started = ContinuousClock.now
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            finished.succeed(.closed)
            throw LegacyClientError(.connect, "cannot connect to the feedback service at \(endpoint.label): \(error)")
        }
        let remaining = timeout - (ContinuousClock.now - started)
        let deadline = eventLoop.scheduleTask(in: TimeAmount(max(remaining, .zero))) {
            finished.succeed(.timedOut)
            channel.close(promise: nil)
        }
        let ending = try await finished.futureResult.get()
        deadline.cancel()
        channel.close(promise: nil)
        let (tuples, leftover, bytes, failure) = reader.state.withLock { ($0.tuples, $0.decoder.leftoverByteCount, $0.bytesRead, $0.failure) }

        var problem: String?
        switch ending {
        case .closed:
            if let failure { problem = failure }
        case .timedOut:
            problem = "the deadline (\(timeout)) passed before the service closed the connection"
        }
        if leftover > 0 {
            problem = [problem, "the stream ended inside a tuple (\(leftover) bytes left over)"].compactMap { $0 }.joined(separator: "; ")
        }
        if let problem {
            guard !tuples.isEmpty else {
                let code: LegacyClientError.Code = ending == .timedOut ? .timeout : (bytes == 0 && failure != nil ? .connect : .protocolError)
                throw LegacyClientError(code, "feedback service at \(endpoint.label): \(problem)")
            }
            logger.warning("feedback stream ended badly; keeping the tuples read", metadata: [
                "legacy.feedback": "\(endpoint.label)", "legacy.tuples": "\(tuples.count)", "legacy.problem": "\(problem)",
            ])
        }
        logger.debug("feedback service read", metadata: ["legacy.feedback": "\(endpoint.label)", "legacy.tuples": "\(tuples.count)", "legacy.bytes": "\(bytes)"])
        return tuples
    }
}

/// Collects tuples on the event loop, in whatever pieces the stream arrives.
private final class FeedbackReader: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    enum Ending: Sendable, Equatable {
        case closed, timedOut
    }

    struct State {
        var decoder = FeedbackTupleDecoder()
        var tuples: [FeedbackTuple] = []
        var bytesRead = 0
        var failure: String?
    }

    /// Read by `fetch` after the channel is done; the lock only makes that hand-over safe.
    final class Shared: Sendable {
        let state = Mutex(State())
    }

    private let shared: Shared
    private let finished: EventLoopPromise<Ending>

    init(shared: Shared, finished: EventLoopPromise<Ending>) {
        self.shared = shared
        self.finished = finished
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        shared.state.withLock { state in
            state.bytesRead += buffer.readableBytes
            buffer.withUnsafeReadableBytes { state.decoder.append($0) }
            while let tuple = state.decoder.next() { state.tuples.append(tuple) }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        finished.succeed(.closed)
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
