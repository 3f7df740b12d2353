import CNGHTTP2

/// The C callbacks libnghttp2 calls. Each finds its `HTTP2Session` through the session's user
/// data (an unretained `Unmanaged` reference: the session owns the nghttp2 session, so it is
/// alive whenever libnghttp2 can call back) and forwards to Swift.
enum HTTP2Callbacks {
    static func install(on callbacks: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, onFrameSent)
    }

    /// A data provider whose read callback drains the session's body in `slot`.
    static func bodyProvider(slot: Int) -> nghttp2_data_provider {
        nghttp2_data_provider(source: nghttp2_data_source(ptr: slotPointer(slot)), read_callback: readBody)
    }

    /// A body slot as an opaque pointer (slot + 1, so that slot 0 is not null).
    static func slotPointer(_ slot: Int) -> UnsafeMutableRawPointer? {
        UnsafeMutableRawPointer(bitPattern: slot + 1)
    }

    static func slot(_ pointer: UnsafeMutableRawPointer?) -> Int? {
        guard let pointer else { return nil }
        return Int(bitPattern: pointer) - 1
    }

    /// Calls `body` with the session behind `userData`, without retaining it (the callbacks
    /// run several times per request; the session outlives every one of them).
    @inline(__always)
    private static func withSession<R>(_ userData: UnsafeMutableRawPointer?, failure: R, _ body: (HTTP2Session) -> R) -> R {
        guard let userData else { return failure }
        return Unmanaged<HTTP2Session>.fromOpaque(userData)._withUnsafeGuaranteedRef(body)
    }

    private static let failure = NGHTTP2_ERR_CALLBACK_FAILURE.rawValue

    private static let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
        guard let frame else { return HTTP2Callbacks.failure }
        return HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
            let category = frame.pointee.headers.cat
            if category == NGHTTP2_HCAT_REQUEST || category == NGHTTP2_HCAT_RESPONSE {
                session.delegate?.http2(session, didBeginHeadersOn: frame.pointee.hd.stream_id)
            }
            return 0
        }
    }

    private static let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
        guard let frame else { return HTTP2Callbacks.failure }
        return HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
            let field = HTTP2HeaderField(
                nameBytes: UnsafeRawBufferPointer(start: name, count: nameLength),
                valueBytes: UnsafeRawBufferPointer(start: value, count: valueLength)
            )
            session.delegate?.http2(session, didReceiveHeader: field, on: frame.pointee.hd.stream_id)
            return 0
        }
    }

    private static let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
        guard let frame else { return HTTP2Callbacks.failure }
        return HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
            let header = frame.pointee.hd
            let endStream = header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
            switch UInt32(header.type) {
            case NGHTTP2_HEADERS.rawValue:
                session.delegate?.http2(session, didReceiveHeadersOn: header.stream_id)
                if endStream { session.delegate?.http2(session, didReceiveEndStreamOn: header.stream_id) }
            case NGHTTP2_DATA.rawValue:
                if endStream { session.delegate?.http2(session, didReceiveEndStreamOn: header.stream_id) }
            case NGHTTP2_GOAWAY.rawValue:
                session.delegate?.http2(session, didReceiveGoAway: HTTP2Callbacks.goAway(frame.pointee.goaway))
            case NGHTTP2_PING.rawValue where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
                var ping = frame.pointee.ping
                let value = withUnsafeBytes(of: &ping.opaque_data) { $0.loadUnaligned(as: UInt64.self) }
                session.delegate?.http2(session, didReceivePingAck: UInt64(bigEndian: value))
            case NGHTTP2_SETTINGS.rawValue where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0:
                let settings = frame.pointee.settings
                var received: [HTTP2Setting] = []
                if let entries = settings.iv {
                    for entry in UnsafeBufferPointer(start: entries, count: settings.niv) {
                        received.append(HTTP2Setting(HTTP2Setting.Identifier(rawValue: entry.settings_id), entry.value))
                    }
                }
                session.delegate?.http2(session, didReceiveSettings: received)
            default:
                break
            }
            return 0
        }
    }

    private static func goAway(_ frame: nghttp2_goaway) -> HTTP2GoAway {
        var opaque: [UInt8] = []
        if let data = frame.opaque_data, frame.opaque_data_len > 0 {
            opaque = Array(UnsafeBufferPointer(start: data, count: frame.opaque_data_len))
        }
        return HTTP2GoAway(lastStreamID: frame.last_stream_id, errorCode: HTTP2ErrorCode(rawValue: frame.error_code), opaqueData: opaque)
    }

    private static let onFrameSent: nghttp2_on_frame_send_callback = { _, frame, userData in
        guard let frame else { return HTTP2Callbacks.failure }
        switch UInt32(frame.pointee.hd.type) {
        case NGHTTP2_RST_STREAM.rawValue:
            return HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
                session.delegate?.http2(session, didSendResetStream: frame.pointee.hd.stream_id, errorCode: HTTP2ErrorCode(rawValue: frame.pointee.rst_stream.error_code))
                return 0
            }
        case NGHTTP2_GOAWAY.rawValue:
            return HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
                session.delegate?.http2(session, didSendGoAway: HTTP2Callbacks.goAway(frame.pointee.goaway))
                return 0
            }
        default:
            return 0
        }
    }

    private static let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, userData in
        HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
            session.delegate?.http2(session, didReceiveData: HTTP2DataChunk(bytes: UnsafeRawBufferPointer(start: data, count: length)), on: streamID)
            return 0
        }
    }

    private static let onStreamClose: nghttp2_on_stream_close_callback = { _, streamID, errorCode, userData in
        HTTP2Callbacks.withSession(userData, failure: HTTP2Callbacks.failure) { session in
            session.streamClosed(streamID, errorCode: errorCode)
            return 0
        }
    }

    private static let readBody: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, source, userData in
        let failure = Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
        guard let buffer, let flags, let slot = HTTP2Callbacks.slot(source?.pointee.ptr) else { return failure }
        return HTTP2Callbacks.withSession(userData, failure: failure) { session in
            session.readBody(slot: slot, stream: streamID, into: buffer, length: length, flags: flags)
        }
    }
}
