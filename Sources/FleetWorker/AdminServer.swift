import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Synchronization

/// The worker's admin endpoint: `GET /metrics` (Prometheus text), `/healthz` (the process is
/// alive: its Kafka pipeline, if watched, is not stuck) and `/readyz` (partitions assigned and
/// every app has a usable APNs connection, the pipeline moving).
/// It binds to `admin.host`, 127.0.0.1 by default, so metrics stay on the host unless asked.
public final class AdminServer: Service, Sendable {
    public struct Readiness: Sendable {
        public var ready: Bool
        /// Why not, for the response body.
        public var detail: String

        public init(ready: Bool, detail: String) {
            self.ready = ready
            self.detail = detail
        }
    }

    private let host: String
    private let port: Int
    private let metrics: @Sendable () -> [UInt8]
    private let readiness: @Sendable () -> Readiness
    private let pipeline: PipelineWatch?
    private let logger: Logger
    private let boundPort = Mutex<Int?>(nil)
    /// A connection must complete each request within this long of opening, or of its previous
    /// answer, or it is closed: a client that goes quiet, or sends a byte now and then, must not
    /// hold a connection for ever. A scraper that keeps its connection between scrapes further
    /// apart than this reconnects (Prometheus retries such a GET on a new connection).
    private let idleTimeout: TimeAmount
    /// Connections open at once at most; a new one beyond that closes the oldest. A client
    /// opening many must not use up the file descriptors that the APNs and Kafka connections
    /// need, nor (by holding them) lock the kubelet's probes out: probes and scrapes are short,
    /// so the oldest connection is the one least likely to be in use.
    static let maximumConnections = 64
    private let openConnections = Mutex<[any Channel]>([])

    public init(
        host: String,
        port: Int,
        logger: Logger,
        metrics: @escaping @Sendable () -> [UInt8],
        readiness: @escaping @Sendable () -> Readiness,
        pipeline: PipelineWatch? = nil,
        idleTimeout: Duration = .seconds(60)
    ) {
        self.idleTimeout = TimeAmount(idleTimeout)
        self.host = host
        self.pipeline = pipeline
        self.port = port
        self.logger = logger
        self.metrics = metrics
        self.readiness = readiness
    }

    /// The port actually bound (useful with port 0), once running.
    public var localPort: Int? { boundPort.withLock { $0 } }

    public func run() async throws {
        let metrics = self.metrics
        let readiness = self.readiness
        // A thread of its own: rendering /metrics (and a probe's checks) must not run on, and
        // hold up, the event loops that carry APNs traffic.
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let channel: any Channel
        do {
            channel = try await bind(group: group, metrics: metrics, readiness: readiness, pipeline: pipeline)
        } catch {
            throw AdminServerError(host: host, port: port, underlying: "\(error)")
        }
        boundPort.withLock { $0 = channel.localAddress?.port }
        logger.info("admin endpoint listening", metadata: ["admin.address": "http://\(host):\(channel.localAddress?.port ?? port)"])
        try? await gracefulShutdown()
        try await channel.close()
    }

    private func bind(
        group: MultiThreadedEventLoopGroup,
        metrics: @escaping @Sendable () -> [UInt8],
        readiness: @escaping @Sendable () -> Readiness,
        pipeline: PipelineWatch?
    ) async throws -> any Channel {
        let idleTimeout = self.idleTimeout
        return try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { [self] channel in
                let evicted = openConnections.withLock { open -> (any Channel)? in
                    open.append(channel)
                    return open.count > Self.maximumConnections ? open.removeFirst() : nil
                }
                evicted?.close(promise: nil)
                channel.closeFuture.whenComplete { _ in
                    self.openConnections.withLock { open in open.removeAll { $0 === channel } }
                }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(AdminHandler(metrics: metrics, readiness: readiness, pipeline: pipeline, requestTimeout: idleTimeout))
                }
            }
            .bind(host: host, port: port)
            .get()
    }
}

/// The admin endpoint could not listen: a setting to fix (exit status 2), named as such.
public struct AdminServerError: Error, CustomStringConvertible {
    public let host: String
    public let port: Int
    public let underlying: String

    public var description: String {
        "admin.host/admin.port: cannot listen on \(host):\(port) (\(underlying)); is another process, or a second worker on this host, using it?"
    }
}

final class AdminHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let metrics: @Sendable () -> [UInt8]
    private let readiness: @Sendable () -> AdminServer.Readiness
    private let pipeline: PipelineWatch?
    private let requestTimeout: TimeAmount
    private var head: HTTPRequestHead?
    /// Closes the connection unless a request completes first (see `AdminServer.idleTimeout`).
    private var deadline: Scheduled<Void>?

    init(metrics: @escaping @Sendable () -> [UInt8], readiness: @escaping @Sendable () -> AdminServer.Readiness, pipeline: PipelineWatch?, requestTimeout: TimeAmount) {
        self.metrics = metrics
        self.readiness = readiness
        self.pipeline = pipeline
        self.requestTimeout = requestTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        armDeadline(context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }

    private func armDeadline(context: ChannelHandlerContext) {
        deadline?.cancel()
        let channel = context.channel
        deadline = context.eventLoop.scheduleTask(in: requestTimeout) { channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): self.head = head
        case .body: break
        case .end:
            guard let head else { return }
            self.head = nil
            let (status, contentType, body) = route(head)
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: contentType)
            headers.add(name: "content-length", value: String(body.count))
            // HTTP/1.0, or `Connection: close`: the client expects the server to close.
            let keepAlive = head.isKeepAlive
            if !keepAlive { headers.add(name: "connection", value: "close") }
            // RFC 9110: a 405 says which methods the resource takes.
            if status == .methodNotAllowed { headers.add(name: "allow", value: "GET, HEAD") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
            // A HEAD answer has the GET's headers and no body (one would corrupt a kept-alive connection).
            if head.method != .HEAD {
                context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
            }
            if keepAlive {
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                armDeadline(context: context)
            } else {
                // The connection's deadline must not cut the answer short; the close follows it.
                deadline?.cancel()
                deadline = nil
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
            }
        }
    }

    private func route(_ head: HTTPRequestHead) -> (HTTPResponseStatus, String, [UInt8]) {
        guard head.method == .GET || head.method == .HEAD else {
            return (.methodNotAllowed, "text/plain", Array("only GET\n".utf8))
        }
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        switch path {
        case "/metrics":
            return (.ok, "text/plain; version=0.0.4", metrics())
        case "/healthz":
            if let problem = pipeline?.livenessProblem() {
                return (.serviceUnavailable, "text/plain", Array("unhealthy: \(problem)\n".utf8))
            }
            return (.ok, "text/plain", Array("ok\n".utf8))
        case "/readyz":
            var state = readiness()
            if state.ready, let problem = pipeline?.readinessProblem() { state = .init(ready: false, detail: problem) }
            return (state.ready ? .ok : .serviceUnavailable, "text/plain", Array("\(state.ready ? "ready" : "not ready"): \(state.detail)\n".utf8))
        default:
            return (.notFound, "text/plain", Array("not found; try /metrics, /healthz or /readyz\n".utf8))
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
