/// One notification of the legacy binary interface (gateway port 2195).
///
/// Command 0 is the simple format, command 1 the enhanced format (identifier and expiry), and
/// command 2 the later frame format (items). All integers are big-endian.
public struct LegacyNotification: Sendable, Hashable {
    /// The interface's payload limit (the binary interface reference, simple and enhanced formats).
    public static let maximumPayloadBytes = 256
    /// The frame format's (command 2) payload limit.
    public static let maximumFramePayloadBytes = 2048
    /// Device tokens on the binary interface are 32 bytes.
    public static let tokenBytes = 32

    public enum Format: UInt8, Sendable, Hashable {
        case simple = 0
        case enhanced = 1
        case frame = 2
    }

    public var format: Format
    /// The provider's identifier, echoed in an error-response (0 in the simple format).
    public var identifier: UInt32
    /// Unix seconds; 0 means "do not store" (absent in the simple format).
    public var expiry: UInt32
    public var token: [UInt8]
    public var payload: [UInt8]
    /// Only the frame format carries a priority.
    public var priority: UInt8?

    public init(format: Format = .enhanced, identifier: UInt32 = 0, expiry: UInt32 = 0, token: [UInt8], payload: [UInt8], priority: UInt8? = nil) {
        self.format = format
        self.identifier = identifier
        self.expiry = expiry
        self.token = token
        self.payload = payload
        self.priority = priority
    }

    /// The PDU bytes, ready to write to the gateway.
    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(16 + token.count + payload.count)
        out.append(format.rawValue)
        switch format {
        case .simple:
            out.appendBigEndian(UInt16(truncatingIfNeeded: token.count))
            out += token
            out.appendBigEndian(UInt16(truncatingIfNeeded: payload.count))
            out += payload
        case .enhanced:
            out.appendBigEndian(identifier)
            out.appendBigEndian(expiry)
            out.appendBigEndian(UInt16(truncatingIfNeeded: token.count))
            out += token
            out.appendBigEndian(UInt16(truncatingIfNeeded: payload.count))
            out += payload
        case .frame:
            var items: [UInt8] = []
            func item(_ id: UInt8, _ data: [UInt8]) {
                items.append(id)
                items.appendBigEndian(UInt16(truncatingIfNeeded: data.count))
                items += data
            }
            item(1, token)
            item(2, payload)
            var id: [UInt8] = []
            id.appendBigEndian(identifier)
            item(3, id)
            var expiryBytes: [UInt8] = []
            expiryBytes.appendBigEndian(expiry)
            item(4, expiryBytes)
            if let priority { item(5, [priority]) }
            out.appendBigEndian(UInt32(items.count))
            out += items
        }
        return out
    }
}

/// The error-response packet (command 8): a status from Table 5-1 and the failed identifier.
/// The gateway closes the connection after sending it.
public struct LegacyErrorResponse: Sendable, Hashable {
    public static let byteCount = 6
    public var status: LegacyErrorStatus
    public var identifier: UInt32

    public init(status: LegacyErrorStatus, identifier: UInt32) {
        self.status = status
        self.identifier = identifier
    }

    public func encoded() -> [UInt8] {
        var out: [UInt8] = [8, status.code]
        out.appendBigEndian(identifier)
        return out
    }

    /// Reads an error-response from the first six bytes, nil when they are not one.
    public init?(bytes: some Collection<UInt8>) {
        let b = Array(bytes.prefix(Self.byteCount))
        guard b.count == Self.byteCount, b[0] == 8 else { return nil }
        status = LegacyErrorStatus(code: b[1])
        identifier = UInt32(bigEndianBytes: b[2..<6])
    }
}

/// One tuple of the feedback service: when APNs learned the app was gone, and the token.
public struct FeedbackTuple: Sendable, Hashable {
    /// Unix seconds.
    public var timestamp: UInt32
    public var token: [UInt8]

    public init(timestamp: UInt32, token: [UInt8]) {
        self.timestamp = timestamp
        self.token = token
    }

    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.appendBigEndian(timestamp)
        out.appendBigEndian(UInt16(truncatingIfNeeded: token.count))
        return out + token
    }
}

/// What the next bytes of a gateway stream hold.
public enum LegacyParseResult: Sendable, Hashable {
    case notification(LegacyNotification, consumed: Int)
    /// The PDU is not complete yet; call again with more bytes.
    case needMoreBytes
    /// Unintelligible: answer with this error-response and close the connection.
    case malformed(LegacyErrorResponse, detail: String)
}

/// Parses gateway PDUs from a byte stream that may split or merge them at any byte.
public struct LegacyGatewayDecoder: Sendable {
    /// Token length the interface takes. Default: 32.
    public var tokenBytes: Int
    /// Payload limit of the simple and enhanced formats; the reference says 256 bytes.
    public var maximumPayloadBytes: Int
    /// Payload limit of the frame format. Default: 2048.
    public var maximumFramePayloadBytes: Int

    private var buffer: [UInt8] = []
    private var start = 0

    public init(
        tokenBytes: Int = LegacyNotification.tokenBytes, maximumPayloadBytes: Int = LegacyNotification.maximumPayloadBytes,
        maximumFramePayloadBytes: Int = LegacyNotification.maximumFramePayloadBytes
    ) {
        self.tokenBytes = tokenBytes
        self.maximumPayloadBytes = maximumPayloadBytes
        self.maximumFramePayloadBytes = maximumFramePayloadBytes
    }

    public mutating func append(_ bytes: some Sequence<UInt8>) {
        if start > 4096 && start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// Bytes received and not yet consumed.
    public var pendingByteCount: Int { buffer.count - start }

    /// The next complete PDU, `.needMoreBytes`, or `.malformed` (after which the stream is done).
    public mutating func next() -> LegacyParseResult {
        let result = Self.parse(buffer, from: start, tokenBytes: tokenBytes, maximumPayloadBytes: maximumPayloadBytes, maximumFramePayloadBytes: maximumFramePayloadBytes)
        if case .notification(_, let consumed) = result { start += consumed }
        return result
    }

    /// The raw bytes of the PDU the next call would read (for dumps).
    public func peekPending(_ count: Int) -> ArraySlice<UInt8> {
        buffer[start..<min(buffer.count, start + count)]
    }

    static func parse(_ b: [UInt8], from s: Int, tokenBytes: Int, maximumPayloadBytes: Int, maximumFramePayloadBytes: Int) -> LegacyParseResult {
        let available = b.count - s
        guard available >= 1 else { return .needMoreBytes }
        func u16(_ at: Int) -> Int { Int(b[s + at]) << 8 | Int(b[s + at + 1]) }
        func u32(_ at: Int) -> UInt32 { UInt32(bigEndianBytes: b[(s + at)..<(s + at + 4)]) }
        func malformed(_ status: LegacyErrorStatus, _ identifier: UInt32, _ detail: String) -> LegacyParseResult {
            .malformed(LegacyErrorResponse(status: status, identifier: identifier), detail: detail)
        }

        switch b[s] {
        case 0, 1:
            let enhanced = b[s] == 1
            let header = enhanced ? 9 : 1
            guard available >= header + 2 else { return .needMoreBytes }
            let identifier = enhanced ? u32(1) : 0
            let expiry = enhanced ? u32(5) : 0
            let tokenLength = u16(header)
            if tokenLength == 0 { return malformed(.missingDeviceToken, identifier, "token length is 0") }
            if tokenLength != tokenBytes {
                return malformed(.invalidTokenSize, identifier, "token length is \(tokenLength); the interface takes \(tokenBytes)")
            }
            let payloadLengthAt = header + 2 + tokenLength
            guard available >= payloadLengthAt + 2 else { return .needMoreBytes }
            let payloadLength = u16(payloadLengthAt)
            if payloadLength == 0 { return malformed(.missingPayload, identifier, "payload length is 0") }
            if payloadLength > maximumPayloadBytes {
                return malformed(.invalidPayloadSize, identifier, "payload is \(payloadLength) bytes; at most \(maximumPayloadBytes) are allowed")
            }
            let total = payloadLengthAt + 2 + payloadLength
            guard available >= total else { return .needMoreBytes }
            let notification = LegacyNotification(
                format: enhanced ? .enhanced : .simple,
                identifier: identifier,
                expiry: expiry,
                token: Array(b[(s + header + 2)..<(s + payloadLengthAt)]),
                payload: Array(b[(s + payloadLengthAt + 2)..<(s + total)])
            )
            return .notification(notification, consumed: total)

        case 2:
            guard available >= 5 else { return .needMoreBytes }
            let frameLength = Int(u32(1))
            guard frameLength <= 3 * 3 + tokenBytes + maximumFramePayloadBytes + 4 + 4 + 1 + 16 else {
                return malformed(.processingError, 0, "frame length \(frameLength) is larger than any valid frame")
            }
            guard available >= 5 + frameLength else { return .needMoreBytes }
            var token: [UInt8]?
            var payload: [UInt8]?
            var identifier: UInt32 = 0
            var expiry: UInt32 = 0
            var priority: UInt8?
            var at = 5
            while at < 5 + frameLength {
                guard at + 3 <= 5 + frameLength else { return malformed(.processingError, identifier, "truncated frame item") }
                let itemID = b[s + at]
                let length = u16(at + 1)
                let dataStart = at + 3
                guard dataStart + length <= 5 + frameLength else { return malformed(.processingError, identifier, "frame item \(itemID) overruns the frame") }
                let data = Array(b[(s + dataStart)..<(s + dataStart + length)])
                switch itemID {
                case 1: token = data
                case 2: payload = data
                case 3:
                    guard length == 4 else { return malformed(.processingError, identifier, "identifier item is \(length) bytes, not 4") }
                    identifier = UInt32(bigEndianBytes: data[...])
                case 4:
                    guard length == 4 else { return malformed(.processingError, identifier, "expiration item is \(length) bytes, not 4") }
                    expiry = UInt32(bigEndianBytes: data[...])
                case 5:
                    guard length == 1 else { return malformed(.processingError, identifier, "priority item is \(length) bytes, not 1") }
                    priority = data[0]
                default:
                    return malformed(.processingError, identifier, "unknown frame item \(itemID)")
                }
                at = dataStart + length
            }
            guard let token, !token.isEmpty else { return malformed(.missingDeviceToken, identifier, "frame has no device token") }
            guard token.count == tokenBytes else { return malformed(.invalidTokenSize, identifier, "token is \(token.count) bytes; the interface takes \(tokenBytes)") }
            guard let payload, !payload.isEmpty else { return malformed(.missingPayload, identifier, "frame has no payload") }
            guard payload.count <= maximumFramePayloadBytes else {
                return malformed(.invalidPayloadSize, identifier, "payload is \(payload.count) bytes; at most \(maximumFramePayloadBytes) are allowed")
            }
            if let priority, priority != 10, priority != 5 {
                return malformed(.processingError, identifier, "priority \(priority) is not 10 or 5")
            }
            let notification = LegacyNotification(format: .frame, identifier: identifier, expiry: expiry, token: token, payload: payload, priority: priority)
            return .notification(notification, consumed: 5 + frameLength)

        default:
            // Like Apple's gateway and the reference test server: answer with the bytes where an
            // enhanced identifier would be, so the sender can still correlate (waiting for them,
            // so that the answer does not depend on how TCP cut the stream).
            guard available >= 5 else { return .needMoreBytes }
            return malformed(.processingError, u32(1), "unknown command \(b[s])")
        }
    }
}

/// Reads feedback tuples from a stream that may split them anywhere.
public struct FeedbackTupleDecoder: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0
    /// Token lengths a tuple may state: those of device tokens (32 bytes from Apple's service;
    /// `DeviceToken` takes up to 100). Any other means the stream is not feedback tuples, or
    /// has lost its alignment: a 65,535-byte "token" per tuple would otherwise be buffered,
    /// tens of thousands of them before reading pauses, and garbage published as dead tokens.
    public static let tokenLengths = 32...100

    /// Why decoding stopped: a tuple stated an impossible token length. Nothing after it is read.
    public private(set) var malformation: String?
    /// Bytes from the malformed tuple on, counted rather than kept.
    private var discarded = 0

    public init() {}

    public mutating func append(_ bytes: some Sequence<UInt8>) {
        guard malformation == nil else {
            discarded += bytes.reduce(0) { count, _ in count + 1 }
            return
        }
        if start > 4096 && start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete tuple, or nil until more bytes arrive.
    public mutating func next() -> FeedbackTuple? {
        guard malformation == nil, buffer.count - start >= 6 else { return nil }
        let length = Int(buffer[start + 4]) << 8 | Int(buffer[start + 5])
        guard Self.tokenLengths.contains(length) else {
            malformation = "a tuple states a \(length)-byte token (device tokens are \(Self.tokenLengths.lowerBound) to \(Self.tokenLengths.upperBound)); "
                + "the stream is not feedback tuples from there"
            discarded = buffer.count - start
            buffer = []
            start = 0
            return nil
        }
        guard buffer.count - start >= 6 + length else { return nil }
        let tuple = FeedbackTuple(
            timestamp: UInt32(bigEndianBytes: buffer[start..<(start + 4)]),
            token: Array(buffer[(start + 6)..<(start + 6 + length)])
        )
        start += 6 + length
        return tuple
    }

    /// Bytes of an incomplete tuple left when the server closed (non-zero means a cut stream),
    /// or, after a malformation, every byte from the malformed tuple on.
    public var leftoverByteCount: Int { malformation == nil ? buffer.count - start : discarded }
}

/// A hex dump in the reference test server's layout: offset, 16 bytes in groups of two, ASCII.
public enum HexDump {
    public static func lines(_ bytes: some Collection<UInt8>) -> [String] {
        let all = Array(bytes)
        let digits = Array("0123456789abcdef")
        var lines: [String] = []
        var offset = 0
        while offset < all.count {
            let row = all[offset..<min(offset + 16, all.count)]
            var hex = ""
            for (index, byte) in row.enumerated() {
                hex.append(digits[Int(byte >> 4)])
                hex.append(digits[Int(byte & 0x0F)])
                if index % 2 == 1 { hex.append(" ") }
            }
            let ascii = String(row.map { (0x21..<0x7F).contains($0) ? Character(UnicodeScalar($0)) : "." })
            let paddedHex = hex.padding(to: 40)
            lines.append("\(String(offset, radix: 16).leftPadded(to: 8)): \(paddedHex) \(ascii)")
            offset += 16
        }
        return lines
    }
}

extension String {
    fileprivate func padding(to width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}

extension Array where Element == UInt8 {
    mutating func appendBigEndian(_ value: UInt16) {
        append(UInt8(value >> 8))
        append(UInt8(value & 0xFF))
    }

    mutating func appendBigEndian(_ value: UInt32) {
        append(UInt8(value >> 24))
        append(UInt8(value >> 16 & 0xFF))
        append(UInt8(value >> 8 & 0xFF))
        append(UInt8(value & 0xFF))
    }
}

extension UInt32 {
    init(bigEndianBytes bytes: ArraySlice<UInt8>) {
        var value: UInt32 = 0
        for byte in bytes.prefix(4) { value = value << 8 | UInt32(byte) }
        self = value
    }
}
