import CNGHTTP2

/// Which end of the connection a session plays.
public enum HTTP2Role: Sendable, Hashable {
    case client
    case server
}

/// One header field to send.
///
/// `neverIndex` sends the field as a literal never indexed (`NGHTTP2_NV_FLAG_NO_INDEX`), as APNs
/// asks for `:path` and `authorization`.
public struct HTTP2Header: Sendable, Hashable {
    public var name: String
    public var value: String
    public var neverIndex: Bool

    public init(_ name: String, _ value: String, neverIndex: Bool = false) {
        self.name = name
        self.value = value
        self.neverIndex = neverIndex
    }
}

/// Header fields laid out back to back in one byte array, for senders that submit many
/// requests: refilled after `removeAll()`, it allocates nothing once it has grown, and no
/// `String` is built per field.
public struct HTTP2HeaderBlock: Sendable {
    struct Field: Sendable {
        var nameCount: Int
        var valueCount: Int
        var neverIndex: Bool
    }

    private(set) var bytes: [UInt8] = []
    private(set) var fields: [Field] = []

    public init(byteCapacity: Int = 1024, fieldCapacity: Int = 16) {
        bytes.reserveCapacity(byteCapacity)
        fields.reserveCapacity(fieldCapacity)
    }

    public var count: Int { fields.count }

    public mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        fields.removeAll(keepingCapacity: true)
    }

    public mutating func append(_ name: StaticString, _ value: StaticString, neverIndex: Bool = false) {
        let nameCount = appendBytes(name)
        let valueCount = appendBytes(value)
        fields.append(Field(nameCount: nameCount, valueCount: valueCount, neverIndex: neverIndex))
    }

    public mutating func append(_ name: StaticString, _ value: String, neverIndex: Bool = false) {
        let nameCount = appendBytes(name)
        bytes.append(contentsOf: value.utf8)
        fields.append(Field(nameCount: nameCount, valueCount: value.utf8.count, neverIndex: neverIndex))
    }

    /// A field whose value is `prefix` followed by `value` (such as `:path /3/device/<token>`).
    public mutating func append(_ name: StaticString, prefix: StaticString, _ value: String, neverIndex: Bool = false) {
        let nameCount = appendBytes(name)
        let prefixCount = appendBytes(prefix)
        bytes.append(contentsOf: value.utf8)
        fields.append(Field(nameCount: nameCount, valueCount: prefixCount + value.utf8.count, neverIndex: neverIndex))
    }

    /// A field whose value is `value` in decimal.
    public mutating func append(_ name: StaticString, decimal value: Int64, neverIndex: Bool = false) {
        let nameCount = appendBytes(name)
        let start = bytes.count
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        let digitsStart = bytes.count
        var magnitude = value.magnitude
        repeat {
            bytes.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
            magnitude /= 10
        } while magnitude > 0
        bytes[digitsStart...].reverse()
        fields.append(Field(nameCount: nameCount, valueCount: bytes.count - start, neverIndex: neverIndex))
    }

    /// A field whose `valueCount` value bytes `writeValue` writes in place (no String is made).
    public mutating func append(
        _ name: StaticString, valueCount: Int, neverIndex: Bool = false,
        writeValue: (UnsafeMutableBufferPointer<UInt8>) -> Void
    ) {
        let nameCount = appendBytes(name)
        let start = bytes.count
        bytes.append(contentsOf: repeatElement(0, count: valueCount))
        bytes.withUnsafeMutableBufferPointer { all in
            writeValue(UnsafeMutableBufferPointer(rebasing: all[start ..< start + valueCount]))
        }
        fields.append(Field(nameCount: nameCount, valueCount: valueCount, neverIndex: neverIndex))
    }

    public mutating func append(_ header: HTTP2Header) {
        bytes.append(contentsOf: header.name.utf8)
        bytes.append(contentsOf: header.value.utf8)
        fields.append(Field(nameCount: header.name.utf8.count, valueCount: header.value.utf8.count, neverIndex: header.neverIndex))
    }

    private mutating func appendBytes(_ text: StaticString) -> Int {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
        return text.utf8CodeUnitCount
    }
}

/// A SETTINGS parameter.
public struct HTTP2Setting: Sendable, Hashable, CustomStringConvertible {
    public struct Identifier: Sendable, Hashable, CustomStringConvertible {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        public static let headerTableSize = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_HEADER_TABLE_SIZE.rawValue))
        public static let enablePush = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue))
        public static let maxConcurrentStreams = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue))
        public static let initialWindowSize = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue))
        public static let maxFrameSize = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_MAX_FRAME_SIZE.rawValue))
        public static let maxHeaderListSize = Identifier(rawValue: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue))

        public var description: String {
            switch self {
            case .headerTableSize: "HEADER_TABLE_SIZE"
            case .enablePush: "ENABLE_PUSH"
            case .maxConcurrentStreams: "MAX_CONCURRENT_STREAMS"
            case .initialWindowSize: "INITIAL_WINDOW_SIZE"
            case .maxFrameSize: "MAX_FRAME_SIZE"
            case .maxHeaderListSize: "MAX_HEADER_LIST_SIZE"
            default: "SETTING_\(rawValue)"
            }
        }
    }

    public var identifier: Identifier
    public var value: UInt32

    public init(_ identifier: Identifier, _ value: UInt32) {
        self.identifier = identifier
        self.value = value
    }

    public static func maxConcurrentStreams(_ value: UInt32) -> HTTP2Setting { HTTP2Setting(.maxConcurrentStreams, value) }

    public var description: String { "\(identifier)=\(value)" }
}

/// An HTTP/2 error code (RST_STREAM, GOAWAY).
public struct HTTP2ErrorCode: Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let noError = HTTP2ErrorCode(rawValue: NGHTTP2_NO_ERROR.rawValue)
    public static let protocolError = HTTP2ErrorCode(rawValue: NGHTTP2_PROTOCOL_ERROR.rawValue)
    public static let internalError = HTTP2ErrorCode(rawValue: NGHTTP2_INTERNAL_ERROR.rawValue)
    public static let flowControlError = HTTP2ErrorCode(rawValue: NGHTTP2_FLOW_CONTROL_ERROR.rawValue)
    public static let streamClosed = HTTP2ErrorCode(rawValue: NGHTTP2_STREAM_CLOSED.rawValue)
    public static let refusedStream = HTTP2ErrorCode(rawValue: NGHTTP2_REFUSED_STREAM.rawValue)
    public static let cancel = HTTP2ErrorCode(rawValue: NGHTTP2_CANCEL.rawValue)
    public static let enhanceYourCalm = HTTP2ErrorCode(rawValue: NGHTTP2_ENHANCE_YOUR_CALM.rawValue)

    public var description: String { String(cString: nghttp2_http2_strerror(rawValue)) }
}

/// A failure reported by libnghttp2, or a misuse of the session.
public struct HTTP2Error: Error, Sendable, Hashable, CustomStringConvertible {
    /// libnghttp2's (negative) error code, 0 when the error is not from the library.
    public let libraryCode: Int32
    public let message: String

    public init(libraryCode: Int32 = 0, _ message: String) {
        self.libraryCode = libraryCode
        self.message = message
    }

    init(_ operation: String, code: Int) {
        self.libraryCode = Int32(truncatingIfNeeded: code)
        self.message = "\(operation): \(String(cString: nghttp2_strerror(Int32(truncatingIfNeeded: code))))"
    }

    /// The connection has used up its stream ids (2^31, odd ones for a client): a new
    /// connection is needed.
    public var isStreamIDExhausted: Bool { libraryCode == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE.rawValue }

    /// Whether the connection can go on (a stream-level problem) or must close.
    public var isFatal: Bool { libraryCode != 0 && nghttp2_is_fatal(libraryCode) != 0 }

    public var description: String { "HTTP/2: \(message)" }
}

/// A GOAWAY frame, sent or received.
public struct HTTP2GoAway: Sendable, Hashable {
    public var lastStreamID: Int32
    public var errorCode: HTTP2ErrorCode
    /// The debug data; APNs puts `{"reason": "..."}` here.
    public var opaqueData: [UInt8]

    public init(lastStreamID: Int32, errorCode: HTTP2ErrorCode, opaqueData: [UInt8]) {
        self.lastStreamID = lastStreamID
        self.errorCode = errorCode
        self.opaqueData = opaqueData
    }
}
