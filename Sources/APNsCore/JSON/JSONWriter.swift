/// Appends compact JSON to a byte buffer. Results are written on the hot path, so this avoids
/// Foundation's encoders and writes fields in a fixed order.
public struct JSONWriter {
    public private(set) var bytes: [UInt8]
    private var needsComma: [Bool] = []

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    public mutating func beginObject() {
        separator()
        bytes.append(UInt8(ascii: "{"))
        needsComma.append(false)
    }

    /// Opens an object as the value of `key` inside the current object.
    public mutating func beginObject(_ key: String) {
        writeKey(key)
        bytes.append(UInt8(ascii: "{"))
        needsComma.append(false)
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma.removeLast()
    }

    public mutating func beginArray(_ key: String) {
        writeKey(key)
        bytes.append(UInt8(ascii: "["))
        needsComma.append(false)
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma.removeLast()
    }

    public mutating func field(_ key: String, _ value: String?) {
        writeKey(key)
        guard let value else { return appendLiteral("null") }
        appendString(value)
    }

    public mutating func field(_ key: String, _ value: Int64?) {
        writeKey(key)
        guard let value else { return appendLiteral("null") }
        bytes.append(contentsOf: String(value).utf8)
    }

    public mutating func field(_ key: String, _ value: Bool) {
        writeKey(key)
        appendLiteral(value ? "true" : "false")
    }

    public mutating func field(_ key: String, _ value: Int?) {
        field(key, value.map(Int64.init))
    }

    /// A number with at most `decimals` fraction digits (latencies); non-finite values become null.
    public mutating func field(_ key: String, _ value: Double, decimals: Int = 3) {
        writeKey(key)
        guard value.isFinite else { return appendLiteral("null") }
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        if rounded == rounded.rounded(), abs(rounded) < 1e15 {
            bytes.append(contentsOf: String(Int64(rounded)).utf8)
        } else {
            bytes.append(contentsOf: "\(rounded)".utf8)
        }
    }

    /// Embeds already-valid JSON bytes verbatim (for example a job's `meta`).
    public mutating func field(_ key: String, raw: RawJSON?) {
        writeKey(key)
        guard let raw else { return appendLiteral("null") }
        bytes.append(contentsOf: raw.bytes)
    }

    /// A string element inside an array.
    public mutating func element(_ value: String) {
        separator()
        appendString(value)
    }

    private mutating func writeKey(_ key: String) {
        separator()
        appendString(key)
        bytes.append(UInt8(ascii: ":"))
    }

    private mutating func separator() {
        guard let last = needsComma.last else { return }
        if last { bytes.append(UInt8(ascii: ",")) }
        needsComma[needsComma.count - 1] = true
    }

    private mutating func appendLiteral(_ literal: String) {
        bytes.append(contentsOf: literal.utf8)
    }

    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    private static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == 0x7F || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
    }

    private mutating func appendString(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        // Almost every string (tokens, ids, topics, reasons) needs no escaping: copy it in one go.
        let copied = value.utf8.withContiguousStorageIfAvailable { utf8 -> Bool in
            guard !utf8.contains(where: Self.needsEscape) else { return false }
            bytes.append(contentsOf: utf8)
            return true
        }
        if copied == true {
            bytes.append(UInt8(ascii: "\""))
            return
        }
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x0A: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0x00..<0x20, 0x7F:
                bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                bytes.append(Self.hex[Int(byte >> 4)])
                bytes.append(Self.hex[Int(byte & 0x0F)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }
}
