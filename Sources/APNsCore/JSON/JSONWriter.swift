/// An object key for ``JSONWriter``. A literal key is written as it is, without the escaping
/// scan a value gets: result fields are written for every notification, and scanning their
/// constant names showed in profiles. Literal keys must therefore need no escaping (checked in
/// debug builds); a key made at run time goes through ``init(_:)`` and is escaped.
public struct JSONKey: ExpressibleByStringLiteral, Sendable {
    fileprivate enum Storage: Sendable {
        case literal(StaticString)
        case dynamic(String)
    }

    fileprivate let storage: Storage

    public init(stringLiteral value: StaticString) {
        assert(value.withUTF8Buffer { !$0.contains { JSONWriter.escapeFlag($0) != 0 } }, "a literal JSON key must need no escaping")
        storage = .literal(value)
    }

    /// A key known only at run time (escaped when written).
    public init(_ name: String) {
        storage = .dynamic(name)
    }
}

/// Appends compact JSON to a byte buffer. Results are written on the hot path, so this avoids
/// Foundation's encoders and writes fields in a fixed order.
public struct JSONWriter {
    public private(set) var bytes: [UInt8]
    /// Per open object or array, whether the next member needs a comma: one bit per level, the
    /// innermost in bit `depth - 1` (levels past 64, which no contract has, go to `deeper`).
    private var commaBits: UInt64 = 0
    private var depth = 0
    private var deeper: [Bool] = []

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    public mutating func beginObject() {
        separator()
        bytes.append(UInt8(ascii: "{"))
        pushLevel()
    }

    /// Opens an object as the value of `key` inside the current object.
    public mutating func beginObject(_ key: JSONKey) {
        writeKey(key)
        bytes.append(UInt8(ascii: "{"))
        pushLevel()
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        popLevel()
    }

    public mutating func beginArray(_ key: JSONKey) {
        writeKey(key)
        bytes.append(UInt8(ascii: "["))
        pushLevel()
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        popLevel()
    }

    public mutating func field(_ key: JSONKey, _ value: String?) {
        writeKey(key)
        guard let value else { return appendLiteral("null") }
        appendString(value)
    }

    public mutating func field(_ key: JSONKey, _ value: Int64?) {
        writeKey(key)
        guard let value else { return appendLiteral("null") }
        appendInteger(value)
    }

    public mutating func field(_ key: JSONKey, _ value: Bool) {
        writeKey(key)
        appendLiteral(value ? "true" : "false")
    }

    public mutating func field(_ key: JSONKey, _ value: Int?) {
        field(key, value.map(Int64.init))
    }

    /// A number with at most `decimals` fraction digits (latencies); non-finite values become null.
    public mutating func field(_ key: JSONKey, _ value: Double, decimals: Int = 3) {
        writeKey(key)
        guard value.isFinite else { return appendLiteral("null") }
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        if rounded == rounded.rounded(), abs(rounded) < 1e15 {
            appendInteger(Int64(rounded))
        } else if decimals <= 6, abs(value * scale) < 1e15 {
            // Digits written directly, as `Double.description` would give them for a value that
            // is a whole number of 10^-decimals: the integer part, then the fraction without
            // trailing zeros (no String per number on the result path).
            let units = Int64((value * scale).rounded())
            var unitsPerWhole: Int64 = 1
            for _ in 0..<decimals { unitsPerWhole *= 10 }
            let magnitude = units.magnitude
            if units < 0 { bytes.append(UInt8(ascii: "-")) }
            appendInteger(Int64(magnitude / UInt64(unitsPerWhole)))
            var fraction = magnitude % UInt64(unitsPerWhole)
            var width = decimals
            while fraction % 10 == 0, width > 0 {
                fraction /= 10
                width -= 1
            }
            // A fraction that rounded away (999999999999999.6 with no decimals) leaves a whole number.
            if width > 0 {
                bytes.append(UInt8(ascii: "."))
                appendDigits(fraction, width: width)
            }
        } else if rounded.isFinite {
            bytes.append(contentsOf: "\(rounded)".utf8)
        } else {
            // JSON has no inf or nan (value * scale can overflow for a finite value).
            appendLiteral("null")
        }
    }

    /// `"2026-11-22T10:00:00.123Z"`, written in place.
    public mutating func field(_ key: JSONKey, _ value: UnixMillis) {
        writeKey(key)
        bytes.append(UInt8(ascii: "\""))
        value.appendRFC3339(to: &bytes)
        bytes.append(UInt8(ascii: "\""))
    }

    private mutating func appendInteger(_ value: Int64) {
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        let magnitude = value.magnitude
        var width = 1
        var limit: UInt64 = 10
        while magnitude >= limit, width < 20 {
            width += 1
            if limit > UInt64.max / 10 { break }
            limit *= 10
        }
        appendDigits(magnitude, width: width)
    }

    /// `value` in exactly `width` decimal digits (zero-padded; `value` must fit; `width` at most 20).
    private mutating func appendDigits(_ value: UInt64, width: Int) {
        // Made right to left on the stack, then appended at once: a store per digit into the
        // array checked its uniqueness each time.
        var digits = InlineArray<20, UInt8>(repeating: UInt8(ascii: "0"))
        let width = min(width, 20)
        var rest = value
        var index = 19
        while rest > 0, index >= 20 - width {
            digits[index] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: rest % 10)
            rest /= 10
            index -= 1
        }
        bytes.append(addingCapacity: width) { out in
            for index in (20 - width)..<20 { out.append(digits[index]) }
        }
    }

    /// Embeds already-valid JSON bytes verbatim (for example a job's `meta`).
    public mutating func field(_ key: JSONKey, raw: RawJSON?) {
        writeKey(key)
        guard let raw else { return appendLiteral("null") }
        bytes.append(contentsOf: raw.bytes)
    }

    /// A string element inside an array.
    public mutating func element(_ value: String) {
        separator()
        appendString(value)
    }

    private mutating func writeKey(_ key: JSONKey) {
        switch key.storage {
        case .literal(let name):
            // The separator, the quoted name and the colon in one append: a result writes about
            // 15 keys per notification, and an append per byte showed in profiles.
            let comma = needsComma()
            name.withUTF8Buffer { name in
                bytes.append(addingCapacity: name.count + 4) { out in
                    if comma { out.append(UInt8(ascii: ",")) }
                    out.append(UInt8(ascii: "\""))
                    for byte in name { out.append(byte) }
                    out.append(UInt8(ascii: "\""))
                    out.append(UInt8(ascii: ":"))
                }
            }
        case .dynamic(let name):
            separator()
            appendString(name)
            bytes.append(UInt8(ascii: ":"))
        }
    }

    private mutating func separator() {
        if needsComma() { bytes.append(UInt8(ascii: ",")) }
    }

    /// Whether the next member needs a comma before it; notes that the level now has a member.
    private mutating func needsComma() -> Bool {
        guard depth > 0 else { return false }
        if depth > 64 {
            defer { deeper[deeper.count - 1] = true }
            return deeper[deeper.count - 1]
        }
        let bit: UInt64 = 1 << UInt64(depth - 1)
        defer { commaBits |= bit }
        return commaBits & bit != 0
    }

    private mutating func pushLevel() {
        depth += 1
        if depth > 64 {
            deeper.append(false)
        } else {
            commaBits &= ~(1 << UInt64(depth - 1))
        }
    }

    private mutating func popLevel() {
        guard depth > 0 else { return }
        if depth > 64 { deeper.removeLast() }
        depth -= 1
    }

    private mutating func appendLiteral(_ literal: String) {
        bytes.append(contentsOf: literal.utf8)
    }

    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// 1 for a byte that must be escaped (a control character, DEL, a quote or a backslash),
    /// else 0. Bitwise, not `||`: a branch per byte would keep a loop over a string scalar.
    @inline(__always)
    fileprivate static func escapeFlag(_ byte: UInt8) -> UInt8 {
        let control: UInt8 = byte < 0x20 ? 1 : 0
        let quote: UInt8 = byte == UInt8(ascii: "\"") ? 1 : 0
        let backslash: UInt8 = byte == UInt8(ascii: "\\") ? 1 : 0
        let delete: UInt8 = byte == 0x7F ? 1 : 0
        return control | quote | backslash | delete
    }

    private mutating func appendString(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        // Almost every string (tokens, ids, topics, reasons) needs no escaping: copy it in one go.
        let copied = value.utf8.withContiguousStorageIfAvailable { utf8 -> Bool in
            // Every byte is looked at, without an early exit, so that the compiler can check
            // many at once (SIMD); most strings are scanned to the end anyway.
            var special: UInt8 = 0
            for byte in utf8 { special |= Self.escapeFlag(byte) }
            guard special == 0 else { return false }
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
