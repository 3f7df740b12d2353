import APNsHTTP2
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

@testable import APNsSimulator

/// An HTTP/2 server over TLS that answers requests from a script and can cut an answer short
/// after its HEADERS: the status is out, the body never comes, as when an APNs front end dies
/// mid-answer. Requests beyond the script get the script's last answer, cut as it says.
final class CuttingServer: Sendable {
    enum Cut: Sendable {
        /// The whole answer.
        case none
        /// RST_STREAM INTERNAL_ERROR right after the HEADERS.
        case resetStream
        /// The connection closes right after the HEADERS.
        case closeConnection
        /// An interim 103 (Early Hints) HEADERS in place of the answer's, then RST_STREAM
        /// INTERNAL_ERROR: no final status at all.
        case informationalThenReset
    }

    struct Answer: Sendable {
        var status: Int
        var body: String
        var cut: Cut
    }

    let port: Int
    private let channel: any Channel
    private let requests: Requests

    final class Requests: Sendable {
        let count = Atomic<Int>(0)
    }

    /// How many requests arrived, over every connection.
    var requestCount: Int { requests.count.load(ordering: .relaxed) }

    private init(port: Int, channel: any Channel, requests: Requests) {
        self.port = port
        self.channel = channel
        self.requests = requests
    }

    static func start(tls: APNsSimulatorConfiguration.TLS, script: [Answer]) async throws -> CuttingServer {
        let context = try APNsSimulator.makeTLSContext(tls)
        let requests = Requests()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let cutter = FrameCutter()
                    let answerer = Answerer(script: script, requests: requests, cutter: cutter)
                    let session = try HTTP2Session(role: .server, delegate: answerer)
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    try channel.pipeline.syncOperations.addHandler(cutter)
                    try channel.pipeline.syncOperations.addHandler(HTTP2ChannelHandler(session: session, initialSettings: [.maxConcurrentStreams(10)]))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return CuttingServer(port: channel.localAddress?.port ?? 0, channel: channel, requests: requests)
    }

    func stop() async {
        try? await channel.close()
    }

    /// Answers each request as the script says, on the connection's event loop.
    private final class Answerer: HTTP2SessionDelegate {
        let script: [Answer]
        let requests: Requests
        let cutter: FrameCutter

        init(script: [Answer], requests: Requests, cutter: FrameCutter) {
            self.script = script
            self.requests = requests
            self.cutter = cutter
        }

        func http2(_ session: HTTP2Session, didReceiveHeader field: HTTP2HeaderField, on stream: Int32) {}

        func http2(_ session: HTTP2Session, didReceiveEndStreamOn stream: Int32) {
            let index = requests.count.add(1, ordering: .relaxed).newValue - 1
            guard let answer = script.isEmpty ? nil : script[min(index, script.count - 1)] else { return }
            // A body makes the HEADERS go out without END_STREAM, so the answer can be cut.
            let body = answer.body.isEmpty ? nil : ByteBuffer(string: answer.body)
            try? session.submitResponse(stream: stream, headers: [HTTP2Header(":status", "\(answer.status)")], body: body)
            switch answer.cut {
            case .none: break
            // libnghttp2 sends queued frames in order and drops the DATA of a reset stream.
            case .resetStream, .closeConnection, .informationalThenReset: cutter.armed = answer.cut
            }
        }
    }

    /// Passes the server's frames through whole. Once armed, cuts the answer whose HEADERS come
    /// next, as its `Cut` says; a reset stream's later frames (its DATA) are dropped, the
    /// server's session still thinking it sent them.
    private final class FrameCutter: ChannelOutboundHandler {
        typealias OutboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        var armed = Cut.none
        private var pending = ByteBuffer()
        private var resetStream: UInt32?
        private var closed = false

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            guard !closed else {
                promise?.succeed()
                return
            }
            var bytes = unwrapOutboundIn(data)
            pending.writeBuffer(&bytes)
            var ready = context.channel.allocator.buffer(capacity: pending.readableBytes)
            // A frame: 3 bytes of length, 1 of type, 1 of flags, 4 of stream id, then the payload.
            while let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self).map({ Int($0 >> 8) }),
                pending.readableBytes >= 9 + length,
                let type = pending.getInteger(at: pending.readerIndex + 3, as: UInt8.self),
                let stream = pending.getInteger(at: pending.readerIndex + 5, as: UInt32.self).map({ $0 & 0x7fff_ffff }),
                var frame = pending.readSlice(length: 9 + length)
            {
                if stream != 0, stream == resetStream { continue }
                let cut = type == 0x1 && stream != 0 ? armed : .none
                switch cut {
                case .none:
                    ready.writeBuffer(&frame)
                case .resetStream:
                    armed = .none
                    ready.writeBuffer(&frame)
                    resetStream = stream
                    Self.writeResetStream(stream, into: &ready)
                case .informationalThenReset:
                    // The answer's own HEADERS are dropped, which leaves the client's HPACK table
                    // behind the server's: the connection cannot answer correctly after this.
                    armed = .none
                    resetStream = stream
                    // HEADERS, END_HEADERS: ":status" as a literal without indexing (static name 8), "103".
                    let block: [UInt8] = [0x08, 0x03] + Array("103".utf8)
                    ready.writeInteger(UInt32(block.count) << 8 | 1)
                    ready.writeInteger(UInt8(0x4))
                    ready.writeInteger(stream)
                    ready.writeBytes(block)
                    Self.writeResetStream(stream, into: &ready)
                case .closeConnection:
                    ready.writeBuffer(&frame)
                    closed = true
                    let channel = context.channel
                    context.writeAndFlush(wrapOutboundOut(ready)).whenComplete { _ in channel.close(promise: nil) }
                    promise?.succeed()
                    return
                }
            }
            pending.discardReadBytes()
            context.write(wrapOutboundOut(ready), promise: promise)
        }

        /// RST_STREAM: 4 bytes of payload, type 3, no flags, the stream, INTERNAL_ERROR (2).
        private static func writeResetStream(_ stream: UInt32, into buffer: inout ByteBuffer) {
            buffer.writeInteger(UInt32(4 << 8 | 3))
            buffer.writeInteger(UInt8(0))
            buffer.writeInteger(stream)
            buffer.writeInteger(UInt32(2))
        }
    }
}
