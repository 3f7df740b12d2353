import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// The simulator's admin endpoint (HTTP/1.1):
///
/// - `GET /counters`: the counters as JSON (totals and per connection);
/// - `GET /counters.txt`: the same as readable text;
/// - `POST /goaway?reason=Shutdown`: GOAWAY on every open HTTP/2 connection;
/// - `POST /reset`: a TCP reset of every open HTTP/2 connection (no GOAWAY, no close_notify);
/// - `POST /close-notify`: TLS close_notify, then FIN, on every open HTTP/2 connection (no GOAWAY);
/// - `POST /faults?error_500_rate=&error_503_rate=&shutdown_503_rate=&latency_ms=&drop_to_one_stream=`: run-time
///   faults over the configured behaviour (the parameters given replace the faults in force);
///   `DELETE /faults` clears them; `GET /faults` shows them;
/// - `GET /healthz`: `ok`.
///
/// A request with an `Origin` header (a web page's, sent by a browser) is refused: the
/// endpoint has no authentication, and a page could otherwise POST faults to it. Connections
/// close after 60 s without a request, and with the listener when the simulator stops.
enum AdminServer {
    /// How long a connection may stay open without a request.
    static let idleTimeout: TimeAmount = .seconds(60)

    /// What the admin endpoint can do to the simulator's connections and behaviour.
    struct Actions: Sendable {
        var goAway: @Sendable (String) -> Void
        /// Resets every connection; returns how many.
        var reset: @Sendable () -> Int
        /// close_notify to every connection; returns how many.
        var closeNotify: @Sendable () -> Int
        var faults: RuntimeFaults
        var behaviour: APNsSimulatorConfiguration.Behaviour
    }

    static func bind(
        host: String,
        port: Int,
        group: any EventLoopGroup,
        counters: SimulatorCounters,
        actions: Actions
    ) async throws -> any Channel {
        try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(AdminConnections()) }
            }
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(IdleStateHandler(allTimeout: idleTimeout))
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(AdminHandler(counters: counters, actions: actions))
                }
            }
            .bind(host: host, port: port)
            .get()
    }
}

/// On the listener: remembers the connections it accepted and closes them when it closes, so a
/// kept-alive admin connection cannot act on a stopped simulator.
private final class AdminConnections: ChannelInboundHandler, Sendable {
    typealias InboundIn = any Channel

    private let open = Mutex<[ObjectIdentifier: any Channel]>([:])

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = unwrapInboundIn(data)
        let id = ObjectIdentifier(child)
        open.withLock { $0[id] = child }
        child.closeFuture.whenComplete { _ in _ = self.open.withLock { $0.removeValue(forKey: id) } }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        for child in open.withLock({ Array($0.values) }) { child.close(promise: nil) }
        context.fireChannelInactive()
    }
}

final class AdminHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let counters: SimulatorCounters
    private let actions: AdminServer.Actions
    private var head: HTTPRequestHead?

    init(counters: SimulatorCounters, actions: AdminServer.Actions) {
        self.counters = counters
        self.actions = actions
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
        case .body:
            break
        case .end:
            guard let head else { return }
            self.head = nil
            let (status, contentType, body) =
                head.headers.contains(name: "origin")
                ? (.forbidden, "text/plain", "requests from web pages (with an Origin header) are refused\n")
                : route(head)
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: contentType)
            headers.add(name: "content-length", value: String(body.utf8.count))
            // HTTP/1.0, or `Connection: close`: the client expects the server to close.
            let keepAlive = head.isKeepAlive
            if !keepAlive { headers.add(name: "connection", value: "close") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
            if head.method != .HEAD {
                context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))), promise: nil)
            }
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
                if !keepAlive { channel.close(promise: nil) }
            }
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    private func route(_ head: HTTPRequestHead) -> (HTTPResponseStatus, String, String) {
        let components = URLComponents(string: head.uri)
        let path = components?.path ?? head.uri
        switch (head.method, path) {
        case (.GET, "/counters"):
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            guard let data = try? encoder.encode(counters.snapshot()) else { return (.internalServerError, "text/plain", "encoding failed\n") }
            return (.ok, "application/json", String(decoding: data, as: UTF8.self) + "\n")
        case (.GET, "/counters.txt"):
            return (.ok, "text/plain", counters.snapshot().summary + "\n")
        case (.POST, "/goaway"):
            let reason = components?.queryItems?.first(where: { $0.name == "reason" })?.value ?? "Shutdown"
            guard APNsSimulatorConfiguration.Behaviour.isWellFormedGoAwayReason(reason) else {
                return (.badRequest, "text/plain", "reason must be printable ASCII without quotes\n")
            }
            actions.goAway(reason)
            return (.ok, "text/plain", "GOAWAY \(reason) sent\n")
        case (.POST, "/reset"):
            return (.ok, "text/plain", "reset \(actions.reset()) connection(s)\n")
        case (.POST, "/close-notify"):
            return (.ok, "text/plain", "close_notify to \(actions.closeNotify()) connection(s)\n")
        case (.GET, "/faults"):
            return (.ok, "text/plain", "faults: \(actions.faults.current)\n")
        case (.DELETE, "/faults"):
            actions.faults.set(RuntimeFaults.Overrides())
            return (.ok, "text/plain", "faults: none\n")
        case (.POST, "/faults"):
            do {
                let overrides = try Self.faults(components?.queryItems ?? [])
                try overrides.validate(over: actions.behaviour)
                actions.faults.set(overrides)
                return (.ok, "text/plain", "faults: \(overrides)\n")
            } catch {
                return (.badRequest, "text/plain", "\(error.message)\n")
            }
        case (.GET, "/healthz"):
            return (.ok, "text/plain", "ok\n")
        default:
            return (
                .notFound, "text/plain",
                "GET /counters, GET /counters.txt, POST /goaway?reason=R, POST /reset, POST /close-notify, "
                    + "GET|POST|DELETE /faults?error_500_rate=&error_503_rate=&shutdown_503_rate=&latency_ms=&drop_to_one_stream=, GET /healthz\n"
            )
        }
    }

    /// The faults of a `POST /faults` query; an unknown parameter or value is an error, not ignored.
    static func faults(_ items: [URLQueryItem]) throws(SimulatorConfigurationError) -> RuntimeFaults.Overrides {
        var overrides = RuntimeFaults.Overrides()
        for item in items {
            let value = item.value ?? ""
            switch item.name {
            case "error_500_rate":
                guard let rate = Double(value) else { throw SimulatorConfigurationError("error_500_rate must be a number, not '\(value)'") }
                overrides.internalServerErrorRate = rate
            case "error_503_rate":
                guard let rate = Double(value) else { throw SimulatorConfigurationError("error_503_rate must be a number, not '\(value)'") }
                overrides.serviceUnavailableRate = rate
            case "shutdown_503_rate":
                guard let rate = Double(value) else { throw SimulatorConfigurationError("shutdown_503_rate must be a number, not '\(value)'") }
                overrides.shutdownRate = rate
            case "latency_ms":
                guard let milliseconds = Int64(value), milliseconds >= 0, milliseconds <= APNsSimulatorConfiguration.longestDuration.components.seconds * 1000 else {
                    throw SimulatorConfigurationError("latency_ms must be a whole number from 0 to 86400000 (a day), not '\(value)'")
                }
                overrides.latency = .milliseconds(milliseconds)
            case "drop_to_one_stream":
                guard let drop = Bool(value) else { throw SimulatorConfigurationError("drop_to_one_stream must be true or false, not '\(value)'") }
                overrides.dropToOneStreamAfterRejection = drop
            default:
                throw SimulatorConfigurationError("unknown fault '\(item.name)' (error_500_rate, error_503_rate, shutdown_503_rate, latency_ms, drop_to_one_stream)")
            }
        }
        return overrides
    }
}
