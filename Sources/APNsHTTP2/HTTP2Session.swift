import CNGHTTP2
import NIOCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a session reports to the code that uses it. All calls happen on the channel's event
/// loop: from inside `HTTP2Session.receive(_:)`, or from inside the session producing output
/// (`flush()`, wherever it is called: stream closes, sent resets and GOAWAYs, a request body
/// being read), or, for `http2SessionDidClose`, from the driver. A delegate must therefore not
/// assume it is called only while input is read.
public protocol HTTP2SessionDelegate: AnyObject {
    /// A request (server) or response (client) header block begins on `stream`.
    func http2(_ session: HTTP2Session, didBeginHeadersOn stream: Int32)
    /// One header field; the field's bytes are only valid during the call.
    func http2(_ session: HTTP2Session, didReceiveHeader field: HTTP2HeaderField, on stream: Int32)
    /// A complete header block (request, response or trailers) arrived.
    func http2(_ session: HTTP2Session, didReceiveHeadersOn stream: Int32)
    /// Body bytes; the chunk is only valid during the call.
    func http2(_ session: HTTP2Session, didReceiveData chunk: HTTP2DataChunk, on stream: Int32)
    /// The peer ended its side of `stream` (END_STREAM on HEADERS or DATA).
    func http2(_ session: HTTP2Session, didReceiveEndStreamOn stream: Int32)
    /// `stream` is closed, normally (`.noError`) or by RST_STREAM or a refusal.
    func http2(_ session: HTTP2Session, didCloseStream stream: Int32, errorCode: HTTP2ErrorCode)
    func http2(_ session: HTTP2Session, didReceiveGoAway goAway: HTTP2GoAway)
    func http2(_ session: HTTP2Session, didReceivePingAck opaqueData: UInt64)
    func http2(_ session: HTTP2Session, didReceiveSettings settings: [HTTP2Setting])
    /// The session sent RST_STREAM (for example REFUSED_STREAM above MAX_CONCURRENT_STREAMS).
    func http2(_ session: HTTP2Session, didSendResetStream stream: Int32, errorCode: HTTP2ErrorCode)
    /// The session wrote a GOAWAY: one submitted by the delegate, or libnghttp2's own for a
    /// protocol violation by the peer.
    func http2(_ session: HTTP2Session, didSendGoAway goAway: HTTP2GoAway)
    /// Called once before the driver writes what the session produced (once per read burst):
    /// a place to publish per-burst work such as counters.
    func http2SessionWillFlush(_ session: HTTP2Session)
    /// The connection under the session is gone.
    func http2SessionDidClose(_ session: HTTP2Session)
}

extension HTTP2SessionDelegate {
    public func http2(_ session: HTTP2Session, didBeginHeadersOn stream: Int32) {}
    public func http2(_ session: HTTP2Session, didReceiveHeadersOn stream: Int32) {}
    public func http2(_ session: HTTP2Session, didReceiveData chunk: HTTP2DataChunk, on stream: Int32) {}
    public func http2(_ session: HTTP2Session, didCloseStream stream: Int32, errorCode: HTTP2ErrorCode) {}
    public func http2(_ session: HTTP2Session, didReceiveGoAway goAway: HTTP2GoAway) {}
    public func http2(_ session: HTTP2Session, didReceivePingAck opaqueData: UInt64) {}
    public func http2(_ session: HTTP2Session, didReceiveSettings settings: [HTTP2Setting]) {}
    public func http2(_ session: HTTP2Session, didSendResetStream stream: Int32, errorCode: HTTP2ErrorCode) {}
    public func http2(_ session: HTTP2Session, didSendGoAway goAway: HTTP2GoAway) {}
    public func http2SessionWillFlush(_ session: HTTP2Session) {}
    public func http2SessionDidClose(_ session: HTTP2Session) {}
}

/// A received header field, borrowed from libnghttp2's buffers for the duration of a delegate call.
public struct HTTP2HeaderField {
    let nameBytes: UnsafeRawBufferPointer
    let valueBytes: UnsafeRawBufferPointer

    public var name: String { String(decoding: nameBytes, as: UTF8.self) }
    public var value: String { String(decoding: valueBytes, as: UTF8.self) }
    public var nameCount: Int { nameBytes.count }
    public var valueCount: Int { valueBytes.count }

    /// Compares the name without making a String.
    public func nameEquals(_ literal: StaticString) -> Bool {
        literal.withUTF8Buffer { literal in
            guard literal.count == nameBytes.count else { return false }
            guard let left = literal.baseAddress, let right = nameBytes.baseAddress else { return literal.isEmpty }
            return memcmp(left, right, literal.count) == 0
        }
    }

    /// Calls `body` with the value's bytes (valid only inside `body`).
    public func withValueBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(valueBytes)
    }
}

/// Received body bytes, borrowed for the duration of a delegate call.
public struct HTTP2DataChunk {
    let bytes: UnsafeRawBufferPointer

    public var count: Int { bytes.count }

    public func append(to buffer: inout ByteBuffer) {
        buffer.writeBytes(bytes)
    }
}

/// Tuning of a session at creation.
public struct HTTP2SessionOptions: Sendable {
    /// The peer's MAX_CONCURRENT_STREAMS assumed before its SETTINGS arrives (clients). Default: 100.
    public var assumedPeerMaxConcurrentStreams: UInt32 = 100
    /// Let libnghttp2 check HTTP semantics (pseudo-headers, content-length). Default: true.
    public var httpMessaging = true

    public init() {}
}

/// One HTTP/2 connection's state: a libnghttp2 session fed and drained through memory
/// (`nghttp2_session_mem_recv` / `nghttp2_session_mem_send`), for clients and servers alike.
///
/// Not thread-safe: create, use and drop it on one event loop (which is why its buffers skip
/// the runtime's exclusivity checks: they run several times per request). It owns its `nghttp2_session`
/// and frees it in `deinit`. Usually driven by an `HTTP2ChannelHandler`.
public final class HTTP2Session {
    public let role: HTTP2Role
    /// Receives the session's events. Held strongly; the delegate should hold the session weakly.
    public var delegate: (any HTTP2SessionDelegate)?

    private let raw: OpaquePointer
    /// Bodies still to send. A stream's data provider carries its slot index (plus one) as
    /// `source.ptr`, and so does the stream's user data, so finding a body hashes nothing;
    /// freed slots are reused.
    @exclusivity(unchecked) private var bodies: [PendingBody] = []
    @exclusivity(unchecked) private var freeBodySlots: [Int] = []
    /// Reused storage for header fields and nghttp2_nv entries, so submitting headers does not
    /// allocate in steady state.
    @exclusivity(unchecked) private var scratchHeaders = HTTP2HeaderBlock()
    @exclusivity(unchecked) private var nameValues: [nghttp2_nv] = []
    /// The channel handler that moves bytes, set when a handler adopts the session and cleared
    /// when it is removed (a strong reference: weak ones make every retain take a slow path).
    var driver: HTTP2ChannelHandler?

    public init(role: HTTP2Role, delegate: (any HTTP2SessionDelegate)?, options: HTTP2SessionOptions = HTTP2SessionOptions()) throws(HTTP2Error) {
        self.role = role
        self.delegate = delegate

        var callbacks: OpaquePointer?
        var rc = nghttp2_session_callbacks_new(&callbacks)
        guard rc == 0, let callbacks else { throw HTTP2Error("nghttp2_session_callbacks_new", code: Int(rc)) }
        defer { nghttp2_session_callbacks_del(callbacks) }
        HTTP2Callbacks.install(on: callbacks)

        var option: OpaquePointer?
        rc = nghttp2_option_new(&option)
        guard rc == 0, let option else { throw HTTP2Error("nghttp2_option_new", code: Int(rc)) }
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_peer_max_concurrent_streams(option, options.assumedPeerMaxConcurrentStreams)
        if !options.httpMessaging { nghttp2_option_set_no_http_messaging(option, 1) }

        // The session must exist before `self` is complete, so the user data is set right after
        // creation; no callback can run before the first receive or send.
        var session: OpaquePointer?
        switch role {
        case .server: rc = nghttp2_session_server_new2(&session, callbacks, nil, option)
        case .client: rc = nghttp2_session_client_new2(&session, callbacks, nil, option)
        }
        guard rc == 0, let session else { throw HTTP2Error("nghttp2_session_new", code: Int(rc)) }
        self.raw = session
        nghttp2_session_set_user_data(session, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        nghttp2_session_del(raw)
    }

    // MARK: Moving bytes

    /// Feeds bytes read from the connection. Events reach the delegate during this call.
    public func receive(_ buffer: ByteBuffer) throws(HTTP2Error) {
        let result = buffer.withUnsafeReadableBytes { bytes -> Int in
            guard let base = bytes.baseAddress, bytes.count > 0 else { return 0 }
            return nghttp2_session_mem_recv(raw, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        }
        if result < 0 { throw HTTP2Error("receive", code: result) }
    }

    /// Appends every frame the session has ready to `buffer`.
    public func produceOutput(into buffer: inout ByteBuffer) throws(HTTP2Error) {
        while true {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(raw, &data)
            if count < 0 { throw HTTP2Error("send", code: count) }
            guard count > 0, let data else { return }
            buffer.writeBytes(UnsafeRawBufferPointer(start: data, count: count))
        }
    }

    /// Whether `stream`'s HEADERS have gone out (libnghttp2 opens a submitted request's stream
    /// only when it writes them). For a stream the caller knows is not closed yet, false means
    /// the request is still queued: the peer is not reading, or its stream limit dropped.
    public func hasSentHeaders(on stream: Int32) -> Bool {
        nghttp2_session_find_stream(raw, stream) != nil
    }

    /// Whether the session still wants to read (false after GOAWAY both ways, or a fatal error).
    public var wantsRead: Bool { nghttp2_session_want_read(raw) != 0 }
    /// Whether the session has frames to send.
    public var wantsWrite: Bool { nghttp2_session_want_write(raw) != 0 }

    /// Asks the driver to write what the session has ready (batched when inside a read burst).
    public func flush() {
        driver?.flushOutput()
    }

    /// Closes the connection under the session.
    public func close() {
        driver?.closeConnection()
    }

    // MARK: Submitting frames

    public func submitSettings(_ settings: [HTTP2Setting]) throws(HTTP2Error) {
        let entries = settings.map { nghttp2_settings_entry(settings_id: $0.identifier.rawValue, value: $0.value) }
        let rc = entries.withUnsafeBufferPointer { nghttp2_submit_settings(raw, UInt8(NGHTTP2_FLAG_NONE.rawValue), $0.baseAddress, $0.count) }
        if rc != 0 { throw HTTP2Error("submit SETTINGS", code: Int(rc)) }
    }

    /// Sends a response on `stream`: HEADERS, then `body` as DATA if it has bytes (END_STREAM on the last frame).
    public func submitResponse(stream: Int32, headers: [HTTP2Header], body: ByteBuffer? = nil) throws(HTTP2Error) {
        fillScratch(headers)
        try submitResponse(stream: stream, headers: scratchHeaders, body: body)
    }

    /// Answers `stream` with fields laid out in `headers` (servers that answer many requests
    /// reuse one block), then `body` as DATA.
    public func submitResponse(stream: Int32, headers: HTTP2HeaderBlock, body: ByteBuffer? = nil) throws(HTTP2Error) {
        let slot = body.flatMap { $0.readableBytes > 0 ? storeBody(.buffer($0), stream: stream) : nil }
        // Setting the stream's user data (the body's slot) is also the check that the stream is
        // still open: libnghttp2 1.52 queues a response on a stream the peer already reset and
        // drops it later without a callback, which would leave the slot taken for good.
        var rc = nghttp2_session_set_stream_user_data(raw, stream, slot.flatMap(HTTP2Callbacks.slotPointer))
        if rc != 0 {
            rc = NGHTTP2_ERR_STREAM_CLOSED.rawValue
        } else {
            rc = withNameValues(headers) { nva, count in
                guard let slot else { return nghttp2_submit_response(raw, stream, nva, count, nil) }
                var provider = HTTP2Callbacks.bodyProvider(slot: slot)
                return nghttp2_submit_response(raw, stream, nva, count, &provider)
            }
            if rc != 0 { nghttp2_session_set_stream_user_data(raw, stream, nil) }
        }
        guard rc == 0 else {
            if let slot { releaseBody(slot: slot) }
            throw HTTP2Error("submit response on stream \(stream)", code: Int(rc))
        }
    }

    /// Opens a stream with a request (clients); returns its stream id.
    public func submitRequest(headers: [HTTP2Header], body: ByteBuffer? = nil) throws(HTTP2Error) -> Int32 {
        fillScratch(headers)
        let body = body.flatMap { $0.readableBytes > 0 ? PendingBody.Bytes.buffer($0) : nil }
        return try submitRequest(scratchHeaders, body: body)
    }

    /// Opens a stream with a request (clients) whose fields are laid out in `headers`, and
    /// `body` as DATA (sent as is, without a copy until it goes into a frame); returns its stream id.
    public func submitRequest(_ headers: HTTP2HeaderBlock, body: ArraySlice<UInt8>) throws(HTTP2Error) -> Int32 {
        let pending: PendingBody.Bytes? = body.isEmpty ? nil : .bytes(body)
        return try submitRequest(headers, body: pending)
    }

    private func submitRequest(_ headers: HTTP2HeaderBlock, body: PendingBody.Bytes?) throws(HTTP2Error) -> Int32 {
        let stream: Int32
        if let body {
            // The body is read during a later `produceOutput`; the slot is freed at its end or
            // when the stream closes first.
            let slot = storeBody(body, stream: 0)
            stream = withNameValues(headers) { nva, count in
                var provider = HTTP2Callbacks.bodyProvider(slot: slot)
                return nghttp2_submit_request(raw, nil, nva, count, &provider, HTTP2Callbacks.slotPointer(slot))
            }
            if stream > 0 { bodies[slot].stream = stream } else { releaseBody(slot: slot) }
        } else {
            stream = withNameValues(headers) { nva, count in nghttp2_submit_request(raw, nil, nva, count, nil, nil) }
        }
        if stream < 0 { throw HTTP2Error("submit request", code: Int(stream)) }
        return stream
    }

    public func submitPing(opaqueData: UInt64) throws(HTTP2Error) {
        var bigEndian = opaqueData.bigEndian
        let rc = withUnsafeBytes(of: &bigEndian) { bytes in
            nghttp2_submit_ping(raw, UInt8(NGHTTP2_FLAG_NONE.rawValue), bytes.baseAddress?.assumingMemoryBound(to: UInt8.self))
        }
        if rc != 0 { throw HTTP2Error("submit PING", code: Int(rc)) }
    }

    /// Sends GOAWAY; `lastStreamID` defaults to the last stream the session processed.
    public func submitGoAway(errorCode: HTTP2ErrorCode = .noError, opaqueData: [UInt8] = [], lastStreamID: Int32? = nil) throws(HTTP2Error) {
        let last = lastStreamID ?? lastProcessedStreamID
        let rc = opaqueData.withUnsafeBufferPointer { data in
            nghttp2_submit_goaway(raw, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, errorCode.rawValue, data.baseAddress, data.count)
        }
        if rc != 0 { throw HTTP2Error("submit GOAWAY", code: Int(rc)) }
        isEnding = true
    }

    /// Whether this side sent (or queued) a GOAWAY or ended the session: the connection is on
    /// its way out, so a peer that stops reading must not hold it open.
    public private(set) var isEnding = false

    /// Queues a GOAWAY and ends the session once it is written: the driver then closes the
    /// connection (closing the channel at once could drop the GOAWAY still being written).
    public func terminate(errorCode: HTTP2ErrorCode = .noError) throws(HTTP2Error) {
        let rc = nghttp2_session_terminate_session(raw, errorCode.rawValue)
        if rc != 0 { throw HTTP2Error("terminate the session", code: Int(rc)) }
        isEnding = true
    }

    public func submitResetStream(_ stream: Int32, errorCode: HTTP2ErrorCode) throws(HTTP2Error) {
        let rc = nghttp2_submit_rst_stream(raw, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, errorCode.rawValue)
        if rc != 0 { throw HTTP2Error("submit RST_STREAM on stream \(stream)", code: Int(rc)) }
    }

    // MARK: State

    /// A setting as the peer last sent it (or its protocol default).
    public func remoteSetting(_ identifier: HTTP2Setting.Identifier) -> UInt32 {
        nghttp2_session_get_remote_settings(raw, nghttp2_settings_id(rawValue: UInt32(identifier.rawValue)))
    }

    /// The highest stream id the session has handed to the application.
    public var lastProcessedStreamID: Int32 { nghttp2_session_get_last_proc_stream_id(raw) }

    // MARK: Callbacks (called by `HTTP2Callbacks` on the event loop, inside receive/produceOutput)

    func readBody(slot: Int, stream: Int32, into destination: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard slot >= 0, slot < bodies.count, bodies[slot].stream == stream else {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let offset = bodies[slot].offset
        let count: Int
        switch bodies[slot].bytes {
        case .bytes(let bytes):
            count = min(length, bytes.count - offset)
            bytes.withUnsafeBytes { source in
                if let base = source.baseAddress, count > 0 {
                    UnsafeMutableRawPointer(destination).copyMemory(from: base + offset, byteCount: count)
                }
            }
        case .buffer(let buffer):
            count = min(length, buffer.readableBytes - offset)
            buffer.withUnsafeReadableBytes { source in
                if let base = source.baseAddress, count > 0 {
                    UnsafeMutableRawPointer(destination).copyMemory(from: base + offset, byteCount: count)
                }
            }
        case .none:
            count = 0
        }
        bodies[slot].offset = offset + count
        if count == 0 || bodies[slot].isDrained {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            releaseBody(slot: slot)
        }
        return count
    }

    func streamClosed(_ stream: Int32, errorCode: UInt32) {
        // A body not sent in full (the stream was reset first) gives its slot back.
        if bodies.count > freeBodySlots.count,
           let slot = HTTP2Callbacks.slot(nghttp2_session_get_stream_user_data(raw, stream)),
           slot < bodies.count, bodies[slot].stream == stream {
            releaseBody(slot: slot)
        }
        delegate?.http2(self, didCloseStream: stream, errorCode: HTTP2ErrorCode(rawValue: errorCode))
    }

    private func storeBody(_ bytes: PendingBody.Bytes, stream: Int32) -> Int {
        if let slot = freeBodySlots.popLast() {
            bodies[slot] = PendingBody(stream: stream, bytes: bytes)
            return slot
        }
        bodies.append(PendingBody(stream: stream, bytes: bytes))
        return bodies.count - 1
    }

    private func releaseBody(slot: Int) {
        bodies[slot] = PendingBody(stream: 0, bytes: .none)
        freeBodySlots.append(slot)
    }

    private func fillScratch(_ headers: [HTTP2Header]) {
        scratchHeaders.removeAll()
        for header in headers { scratchHeaders.append(header) }
    }

    /// Lays the fields out as `nghttp2_nv` entries pointing into the block's bytes (nghttp2
    /// copies them during the submit call).
    private func withNameValues<R>(_ headers: HTTP2HeaderBlock, _ body: (UnsafePointer<nghttp2_nv>?, Int) -> R) -> R {
        headers.bytes.withUnsafeBufferPointer { bytes in
            nameValues.removeAll(keepingCapacity: true)
            guard let base = bytes.baseAddress else { return body(nil, 0) }
            let start = UnsafeMutablePointer(mutating: base)
            var position = 0
            for field in headers.fields {
                nameValues.append(
                    nghttp2_nv(
                        name: start + position,
                        value: start + position + field.nameCount,
                        namelen: field.nameCount,
                        valuelen: field.valueCount,
                        flags: UInt8(field.neverIndex ? NGHTTP2_NV_FLAG_NO_INDEX.rawValue : NGHTTP2_NV_FLAG_NONE.rawValue)
                    )
                )
                position += field.nameCount + field.valueCount
            }
            return nameValues.withUnsafeBufferPointer { body($0.baseAddress, $0.count) }
        }
    }
}

/// A body waiting to be sent as DATA.
private struct PendingBody {
    enum Bytes {
        case bytes(ArraySlice<UInt8>)
        case buffer(ByteBuffer)
        case none
    }

    /// 0 while free (or before the stream id is known).
    var stream: Int32
    var bytes: Bytes
    var offset = 0

    var isDrained: Bool {
        switch bytes {
        case .bytes(let bytes): offset >= bytes.count
        case .buffer(let buffer): offset >= buffer.readableBytes
        case .none: true
        }
    }
}
