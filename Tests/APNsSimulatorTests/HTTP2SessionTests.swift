import APNsHTTP2
import NIOCore
import NIOEmbedded
import Testing

/// Records what a session reports.
final class RecordingDelegate: HTTP2SessionDelegate {
    var headers: [Int32: [(String, String)]] = [:]
    var bodies: [Int32: ByteBuffer] = [:]
    var ended: [Int32] = []
    var closed: [Int32: HTTP2ErrorCode] = [:]
    var goAways: [HTTP2GoAway] = []
    var sentGoAways: [HTTP2GoAway] = []
    var pingAcks: [UInt64] = []
    var settings: [[HTTP2Setting]] = []
    /// Server side: answer each request that ends with this status and body.
    var respond: ((HTTP2Session, Int32) -> Void)?

    func http2(_ session: HTTP2Session, didReceiveHeader field: HTTP2HeaderField, on stream: Int32) {
        headers[stream, default: []].append((field.name, field.value))
    }

    func http2(_ session: HTTP2Session, didReceiveData chunk: HTTP2DataChunk, on stream: Int32) {
        var buffer = bodies[stream] ?? ByteBuffer()
        chunk.append(to: &buffer)
        bodies[stream] = buffer
    }

    func http2(_ session: HTTP2Session, didReceiveEndStreamOn stream: Int32) {
        ended.append(stream)
        respond?(session, stream)
    }

    func http2(_ session: HTTP2Session, didCloseStream stream: Int32, errorCode: HTTP2ErrorCode) { closed[stream] = errorCode }
    func http2(_ session: HTTP2Session, didReceiveGoAway goAway: HTTP2GoAway) { goAways.append(goAway) }
    func http2(_ session: HTTP2Session, didSendGoAway goAway: HTTP2GoAway) { sentGoAways.append(goAway) }
    func http2(_ session: HTTP2Session, didReceivePingAck opaqueData: UInt64) { pingAcks.append(opaqueData) }
    func http2(_ session: HTTP2Session, didReceiveSettings settings: [HTTP2Setting]) { self.settings.append(settings) }
}

/// Counts the `read` calls that get past the HTTP/2 handler towards the socket.
final class ReadCounter: ChannelOutboundHandler {
    typealias OutboundIn = ByteBuffer
    var reads = 0

    func read(context: ChannelHandlerContext) {
        reads += 1
        context.read()
    }
}

@Suite("HTTP/2 session over libnghttp2, in memory")
struct HTTP2SessionTests {
    @Test("a server stops reading while its peer is not reading its answers; a client keeps reading", arguments: [HTTP2Role.server, .client])
    func readingFollowsWritability(role: HTTP2Role) throws {
        let channel = EmbeddedChannel()
        let counter = ReadCounter()
        let session = try HTTP2Session(role: role, delegate: RecordingDelegate())
        try channel.pipeline.syncOperations.addHandlers([counter, HTTP2ChannelHandler(session: session, initialSettings: [])])
        channel.read()
        #expect(counter.reads == 1)

        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.read()
        channel.read()
        #expect(counter.reads == (role == .server ? 1 : 3), "reads while the channel is not writable")

        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        #expect(counter.reads == (role == .server ? 2 : 3), "a held read goes out once the channel is writable")
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    @Test("a session that ends while its peer reads nothing still closes the connection, 5 s later", arguments: [HTTP2Role.server, .client])
    func endedSessionClosesWhileNotWritable(role: HTTP2Role) throws {
        let channel = EmbeddedChannel()
        let session = try HTTP2Session(role: role, delegate: RecordingDelegate())
        try channel.pipeline.syncOperations.addHandler(HTTP2ChannelHandler(session: session, initialSettings: []))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        // The simulator's idle GOAWAY, or its stop, to a client that stopped reading.
        try session.terminate(errorCode: .noError)
        session.flush()
        channel.embeddedEventLoop.advanceTime(by: .seconds(4))
        #expect(channel.isActive, "the GOAWAY may still go out")
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!channel.isActive, "closed although the GOAWAY never could be written")
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    @Test("a GOAWAY written while streams are open, then a full channel: closed 5 s later unless the peer reads")
    func gracefulGoAwayThenFullChannelCloses() throws {
        let (server, _, client, _) = try sessionPair()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(HTTP2ChannelHandler(session: server, initialSettings: []))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        // A request the server has not answered keeps its stream, and the session, open.
        _ = try client.submitRequest(
            headers: [HTTP2Header(":method", "POST"), HTTP2Header(":scheme", "https"), HTTP2Header(":path", "/3/device/00"), HTTP2Header(":authority", "localhost")],
            body: ByteBuffer(string: "{}")
        )
        var wire = ByteBuffer()
        try client.produceOutput(into: &wire)
        try channel.writeInbound(wire)
        try server.submitGoAway()
        server.flush()
        #expect(channel.isActive, "a graceful GOAWAY leaves the open stream to finish")
        // The write filled the channel, and the peer reads no more.
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.embeddedEventLoop.advanceTime(by: .seconds(6))
        #expect(!channel.isActive)
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    /// Moves bytes both ways until neither side has anything to send.
    /// A server advertising `maxConcurrentStreams` and a client, each with a recording delegate,
    /// their SETTINGS queued.
    func sessionPair(maxConcurrentStreams: UInt32 = 10) throws -> (server: HTTP2Session, serverDelegate: RecordingDelegate, client: HTTP2Session, clientDelegate: RecordingDelegate) {
        let serverDelegate = RecordingDelegate()
        let clientDelegate = RecordingDelegate()
        let server = try HTTP2Session(role: .server, delegate: serverDelegate)
        let client = try HTTP2Session(role: .client, delegate: clientDelegate)
        try server.submitSettings([.maxConcurrentStreams(maxConcurrentStreams)])
        try client.submitSettings([])
        return (server, serverDelegate, client, clientDelegate)
    }

    func pump(_ a: HTTP2Session, _ b: HTTP2Session) throws {
        for _ in 0..<32 {
            var ab = ByteBuffer()
            try a.produceOutput(into: &ab)
            var ba = ByteBuffer()
            try b.produceOutput(into: &ba)
            if ab.readableBytes == 0 && ba.readableBytes == 0 { return }
            if ab.readableBytes > 0 { try b.receive(ab) }
            if ba.readableBytes > 0 { try a.receive(ba) }
        }
    }

    @Test("request with body, response with body, headers never indexed")
    func requestResponse() throws {
        let (server, serverDelegate, client, clientDelegate) = try sessionPair()
        serverDelegate.respond = { session, stream in
            try? session.submitResponse(
                stream: stream,
                headers: [HTTP2Header(":status", "400"), HTTP2Header("apns-id", "abc")],
                body: ByteBuffer(string: #"{"reason":"BadDeviceToken"}"#)
            )
        }
        let stream = try client.submitRequest(
            headers: [
                HTTP2Header(":method", "POST"), HTTP2Header(":scheme", "https"),
                HTTP2Header(":path", "/3/device/00", neverIndex: true), HTTP2Header(":authority", "localhost"),
                HTTP2Header("authorization", "bearer x", neverIndex: true),
            ],
            body: ByteBuffer(string: String(repeating: "p", count: 40_000))
        )
        try pump(client, server)
        #expect(serverDelegate.headers[stream]?.first(where: { $0.0 == ":path" })?.1 == "/3/device/00")
        #expect(serverDelegate.bodies[stream]?.readableBytes == 40_000)
        #expect(serverDelegate.ended == [stream])
        #expect(clientDelegate.headers[stream]?.first(where: { $0.0 == ":status" })?.1 == "400")
        #expect(clientDelegate.bodies[stream].map { String(buffer: $0) } == #"{"reason":"BadDeviceToken"}"#)
        #expect(clientDelegate.closed[stream] == .noError)
        #expect(client.remoteSetting(.maxConcurrentStreams) == 10)
    }

    /// libnghttp2 (1.52) does this itself; pinned here because a field dropped silently instead
    /// would let the simulator judge a request other than the one sent.
    @Test("a request header with a malformed value resets its stream on a server, instead of vanishing from the request")
    func malformedHeaderValueResetsStream() throws {
        let (server, serverDelegate, client, clientDelegate) = try sessionPair()
        serverDelegate.respond = { session, stream in
            try? session.submitResponse(stream: stream, headers: [HTTP2Header(":status", "200")], body: nil)
        }
        func request(priority: String) throws -> Int32 {
            try client.submitRequest(
                headers: [
                    HTTP2Header(":method", "POST"), HTTP2Header(":scheme", "https"),
                    HTTP2Header(":path", "/3/device/00"), HTTP2Header(":authority", "localhost"),
                    HTTP2Header("apns-priority", priority),
                ],
                body: ByteBuffer(string: "{}")
            )
        }
        // Trailing white space, a line feed: RFC 9113 calls such requests malformed.
        let bad = [try request(priority: "10 "), try request(priority: "10\n")]
        let good = try request(priority: "10")
        try pump(client, server)
        for stream in bad {
            #expect(clientDelegate.closed[stream] == .protocolError, "\(clientDelegate.closed)")
            #expect(serverDelegate.ended.contains(stream) == false, "the server never took it as a request")
        }
        #expect(clientDelegate.headers[good]?.first(where: { $0.0 == ":status" })?.1 == "200")
    }

    @Test("a request queued behind the peer's stream limit has not sent its HEADERS, and a reset cancels it unsent")
    func queuedRequestCancelled() throws {
        let serverDelegate = RecordingDelegate()
        let clientDelegate = RecordingDelegate()
        var options = HTTP2SessionOptions()
        options.assumedPeerMaxConcurrentStreams = 1
        let server = try HTTP2Session(role: .server, delegate: serverDelegate)
        let client = try HTTP2Session(role: .client, delegate: clientDelegate, options: options)
        try client.submitSettings([])
        let headers = [
            HTTP2Header(":method", "POST"), HTTP2Header(":scheme", "https"),
            HTTP2Header(":path", "/3/device/00", neverIndex: true), HTTP2Header(":authority", "localhost"),
        ]
        let first = try client.submitRequest(headers: headers, body: ByteBuffer(string: "{}"))
        let second = try client.submitRequest(headers: headers, body: ByteBuffer(string: "{}"))
        var wire = ByteBuffer()
        try client.produceOutput(into: &wire)
        #expect(client.hasSentHeaders(on: first))
        #expect(!client.hasSentHeaders(on: second), "one stream allowed: the second waits in the session")

        try client.submitResetStream(second, errorCode: .cancel)
        // The cancelled request leaves the queue once a stream is free: the first one answered.
        serverDelegate.respond = { session, stream in try? session.submitResponse(stream: stream, headers: [HTTP2Header(":status", "200")]) }
        try server.submitSettings([.maxConcurrentStreams(1)])
        try server.receive(wire)
        try pump(client, server)
        #expect(clientDelegate.closed[first] == .noError)
        #expect(clientDelegate.closed[second] == .cancel, "the queued request ends, and its body with it")
        #expect(serverDelegate.headers[first] != nil)
        #expect(serverDelegate.headers[second] == nil, "never written")
    }

    @Test("PING, SETTINGS changes, RST_STREAM and GOAWAY with opaque data")
    func controlFrames() throws {
        let (server, _, client, clientDelegate) = try sessionPair(maxConcurrentStreams: 1000)
        try client.submitPing(opaqueData: 0x0102_0304_0506_0708)
        try pump(client, server)
        #expect(clientDelegate.pingAcks == [0x0102_0304_0506_0708])

        try server.submitSettings([.maxConcurrentStreams(1)])
        try pump(client, server)
        #expect(client.remoteSetting(.maxConcurrentStreams) == 1)

        let stream = try client.submitRequest(headers: [
            HTTP2Header(":method", "POST"), HTTP2Header(":scheme", "http"), HTTP2Header(":path", "/"), HTTP2Header(":authority", "x"),
        ], body: ByteBuffer(string: "{}"))
        try pump(client, server)
        try server.submitResetStream(stream, errorCode: .refusedStream)
        try pump(client, server)
        #expect(clientDelegate.closed[stream] == .refusedStream)

        try server.submitGoAway(errorCode: .noError, opaqueData: Array(#"{"reason":"Shutdown"}"#.utf8))
        try pump(client, server)
        #expect(clientDelegate.goAways.first.map { String(decoding: $0.opaqueData, as: UTF8.self) } == #"{"reason":"Shutdown"}"#)
        #expect(clientDelegate.goAways.first?.lastStreamID == stream)
    }

    @Test("a peer opening more streams than the SETTINGS it acknowledged gets libnghttp2's GOAWAY, which the delegate hears of")
    func goAwayForTooManyStreams() throws {
        let delegate = RecordingDelegate()
        let server = try HTTP2Session(role: .server, delegate: delegate)
        try server.submitSettings([.maxConcurrentStreams(1)])
        var settings = ByteBuffer()
        try server.produceOutput(into: &settings)
        #expect(delegate.sentGoAways.isEmpty)

        // A client written by hand (a library would queue the second request): preface, empty
        // SETTINGS, the ACK of the server's, then two requests, the first still unanswered.
        func frame(_ type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
            let length = UInt32(payload.count)
            return [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), type, flags,
                    UInt8(stream >> 24 & 0x7F), UInt8(stream >> 16 & 0xFF), UInt8(stream >> 8 & 0xFF), UInt8(stream & 0xFF)] + payload
        }
        // HPACK, static table: :method POST, :scheme https, :path /, then :authority "x" as a literal.
        let request: [UInt8] = [0x83, 0x87, 0x84, 0x41, 0x01, UInt8(ascii: "x")]
        var bytes = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        bytes += frame(0x4, flags: 0x0, stream: 0, [])
        bytes += frame(0x4, flags: 0x1, stream: 0, [])
        bytes += frame(0x1, flags: 0x4, stream: 1, request)
        bytes += frame(0x1, flags: 0x4, stream: 3, request)
        try? server.receive(ByteBuffer(bytes: bytes))
        var out = ByteBuffer()
        try server.produceOutput(into: &out)
        let sent = try #require(delegate.sentGoAways.first)
        #expect(sent.errorCode == .protocolError)
        #expect(sent.lastStreamID == 1)
        #expect(delegate.sentGoAways.count == 1)
    }

    @Test("garbage instead of a connection preface is a fatal error")
    func badPreface() throws {
        let server = try HTTP2Session(role: .server, delegate: RecordingDelegate())
        #expect(throws: HTTP2Error.self) { try server.receive(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: x\r\n\r\n")) }
    }
}
