import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// The simulator's admin endpoint (HTTP/1.1):
///
/// - `GET /counters`: the counters as JSON (totals and per connection);
/// - `GET /counters.txt`: the same as readable text;
/// - `POST /goaway?reason=Shutdown`: GOAWAY on every open HTTP/2 connection;
/// - `GET /healthz`: `ok`.
enum AdminServer {
    static func bind(
        host: String,
        port: Int,
        group: any EventLoopGroup,
        counters: SimulatorCounters,
        goAway: @escaping @Sendable (String) -> Void
    ) async throws -> any Channel {
        try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(AdminHandler(counters: counters, goAway: goAway))
                }
            }
            .bind(host: host, port: port)
            .get()
    }
}

final class AdminHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let counters: SimulatorCounters
    private let goAway: @Sendable (String) -> Void
    private var head: HTTPRequestHead?

    init(counters: SimulatorCounters, goAway: @escaping @Sendable (String) -> Void) {
        self.counters = counters
        self.goAway = goAway
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
            let (status, contentType, body) = route(head)
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: contentType)
            headers.add(name: "content-length", value: String(body.utf8.count))
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
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
            guard !reason.isEmpty, reason.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) else {
                return (.badRequest, "text/plain", "reason must be printable ASCII without quotes\n")
            }
            goAway(reason)
            return (.ok, "text/plain", "GOAWAY \(reason) sent\n")
        case (.GET, "/healthz"):
            return (.ok, "text/plain", "ok\n")
        default:
            return (.notFound, "text/plain", "GET /counters, GET /counters.txt, POST /goaway?reason=R, GET /healthz\n")
        }
    }
}
