/// A strict RFC 8259 JSON parser over raw bytes.
///
/// Written for the worker's hot path and for hostile input:
/// - it can *skip* a value (checking its syntax and UTF-8) without building anything, so a
///   notification payload is validated and then sent as the very bytes the producer wrote;
/// - nesting depth is bounded, so deep input cannot exhaust the stack;
/// - strings must be valid UTF-8 without raw control characters; lone surrogates are rejected.
public struct JSONParser {
    public static let defaultMaxDepth = 64

    private let bytes: [UInt8]
    private(set) var index: Int
    private let end: Int
    private let maxDepth: Int
    /// The depth of values read through the public calls: 1 once ``beginObject()`` has entered
    /// the top-level object by hand, so that its members count that level too.
    private var baseDepth = 0

    /// Parses `bytes[range]`; the whole range must be one JSON text.
    public init(bytes: [UInt8], range: Range<Int>? = nil, maxDepth: Int = JSONParser.defaultMaxDepth) {
        self.bytes = bytes
        let range = range ?? 0..<bytes.count
        self.index = range.lowerBound
        self.end = range.upperBound
        self.maxDepth = maxDepth
    }

    /// Parses one complete JSON document.
    public static func parse(_ bytes: [UInt8], maxDepth: Int = JSONParser.defaultMaxDepth) throws(JSONSyntaxError) -> JSONValue {
        var parser = JSONParser(bytes: bytes, maxDepth: maxDepth)
        let value = try parser.parseValue()
        try parser.expectEnd()
        return value
    }

    /// Checks that `bytes[range]` is exactly one JSON object, without building it.
    public static func validateObject(_ bytes: [UInt8], range: Range<Int>, maxDepth: Int = JSONParser.defaultMaxDepth) throws(JSONSyntaxError) {
        var parser = JSONParser(bytes: bytes, range: range, maxDepth: maxDepth)
        parser.skipWhitespace()
        guard parser.peek() == UInt8(ascii: "{") else {
            throw JSONSyntaxError("expected a JSON object", at: parser.index)
        }
        try parser.skipValue()
        try parser.expectEnd()
    }

    // MARK: - Streaming access used by the envelope decoder

    /// Consumes the opening brace of an object.
    mutating func beginObject() throws(JSONSyntaxError) {
        skipWhitespace()
        guard peek() == UInt8(ascii: "{") else {
            if index >= end { throw JSONSyntaxError("empty input, expected a JSON object", at: index) }
            throw JSONSyntaxError("expected a JSON object", at: index)
        }
        index += 1
        baseDepth = 1
    }

    /// Reads the next member key of the current object, or returns nil at its closing brace.
    /// `first` tells whether a comma is expected before the key.
    mutating func nextKey(first: Bool) throws(JSONSyntaxError) -> String? {
        guard let key = try nextRawKey(first: first) else { return nil }
        return try string(of: key)
    }

    /// A member key as it sits in the input: `range` is the text between the quotes.
    struct RawKey {
        var range: Range<Int>
        var hasEscapes: Bool
    }

    /// Like ``nextKey(first:)``, without making a String: the envelope decoder matches the keys
    /// it knows on their bytes and asks for ``string(of:)`` only when it needs the text.
    mutating func nextRawKey(first: Bool) throws(JSONSyntaxError) -> RawKey? {
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            index += 1
            return nil
        }
        if !first {
            try expect(UInt8(ascii: ","), "expected ',' or '}' in object")
            skipWhitespace()
        }
        guard peek() == UInt8(ascii: "\"") else {
            throw JSONSyntaxError("expected a string key in object", at: index)
        }
        let start = index + 1
        // scanString checks every escape, surrogate pairs included, so a key is not decoded here.
        let (hasEscapes, closing) = try scanString()
        skipWhitespace()
        try expect(UInt8(ascii: ":"), "expected ':' after object key")
        return RawKey(range: start..<closing, hasEscapes: hasEscapes)
    }

    /// The text of a key read by ``nextRawKey(first:)``, escapes resolved.
    func string(of key: RawKey) throws(JSONSyntaxError) -> String {
        key.hasEscapes ? try unescape(key.range) : String(decoding: bytes[key.range], as: UTF8.self)
    }

    /// Whether a key read by ``nextRawKey(first:)`` without escapes is exactly `name`.
    func key(_ key: RawKey, is name: StaticString) -> Bool {
        guard key.range.count == name.utf8CodeUnitCount else { return false }
        return name.withUTF8Buffer { bytes[key.range].elementsEqual($0) }
    }

    /// Skips the next value and returns the byte range it occupied.
    mutating func skipValueReturningRange() throws(JSONSyntaxError) -> Range<Int> {
        skipWhitespace()
        let start = index
        try skipValue(depth: baseDepth)
        return start..<index
    }

    /// The byte at the current position after whitespace, without consuming it.
    mutating func peekSignificant() -> UInt8? {
        skipWhitespace()
        return peek()
    }

    mutating func expectEnd() throws(JSONSyntaxError) {
        skipWhitespace()
        if index < end {
            throw JSONSyntaxError("unexpected data after the JSON value", at: index)
        }
    }

    // MARK: - Values

    public mutating func parseValue() throws(JSONSyntaxError) -> JSONValue {
        try parseValue(depth: baseDepth)
    }

    private mutating func parseValue(depth: Int) throws(JSONSyntaxError) -> JSONValue {
        skipWhitespace()
        guard let byte = peek() else { throw JSONSyntaxError("unexpected end of input", at: index) }
        switch byte {
        case UInt8(ascii: "{"):
            guard depth < maxDepth else { throw tooDeep() }
            index += 1
            var members: [JSONMember] = []
            skipWhitespace()
            if peek() == UInt8(ascii: "}") {
                index += 1
                return .object(members)
            }
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\"") else { throw JSONSyntaxError("expected a string key in object", at: index) }
                let key = try parseString()
                skipWhitespace()
                try expect(UInt8(ascii: ":"), "expected ':' after object key")
                let value = try parseValue(depth: depth + 1)
                members.append(JSONMember(key: key, value: value))
                skipWhitespace()
                if peek() == UInt8(ascii: ",") { index += 1; continue }
                try expect(UInt8(ascii: "}"), "expected ',' or '}' in object")
                return .object(members)
            }
        case UInt8(ascii: "["):
            guard depth < maxDepth else { throw tooDeep() }
            index += 1
            var elements: [JSONValue] = []
            skipWhitespace()
            if peek() == UInt8(ascii: "]") {
                index += 1
                return .array(elements)
            }
            while true {
                elements.append(try parseValue(depth: depth + 1))
                skipWhitespace()
                if peek() == UInt8(ascii: ",") { index += 1; continue }
                try expect(UInt8(ascii: "]"), "expected ',' or ']' in array")
                return .array(elements)
            }
        case UInt8(ascii: "\""):
            return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            let range = try scanNumber()
            return .number(literal: String(decoding: bytes[range], as: UTF8.self))
        default:
            throw JSONSyntaxError("unexpected character '\(printable(byte))'", at: index)
        }
    }

    /// Validates one value without building it. Depth and UTF-8 are checked as in `parseValue`.
    private mutating func skipValue(depth: Int = 0) throws(JSONSyntaxError) {
        skipWhitespace()
        guard let byte = peek() else { throw JSONSyntaxError("unexpected end of input", at: index) }
        switch byte {
        case UInt8(ascii: "{"):
            guard depth < maxDepth else { throw tooDeep() }
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "}") { index += 1; return }
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\"") else { throw JSONSyntaxError("expected a string key in object", at: index) }
                try skipString()
                skipWhitespace()
                try expect(UInt8(ascii: ":"), "expected ':' after object key")
                try skipValue(depth: depth + 1)
                skipWhitespace()
                if peek() == UInt8(ascii: ",") { index += 1; continue }
                try expect(UInt8(ascii: "}"), "expected ',' or '}' in object")
                return
            }
        case UInt8(ascii: "["):
            guard depth < maxDepth else { throw tooDeep() }
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") { index += 1; return }
            while true {
                try skipValue(depth: depth + 1)
                skipWhitespace()
                if peek() == UInt8(ascii: ",") { index += 1; continue }
                try expect(UInt8(ascii: "]"), "expected ',' or ']' in array")
                return
            }
        case UInt8(ascii: "\""):
            try skipString()
        case UInt8(ascii: "t"): try expectLiteral("true")
        case UInt8(ascii: "f"): try expectLiteral("false")
        case UInt8(ascii: "n"): try expectLiteral("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            _ = try scanNumber()
        default:
            throw JSONSyntaxError("unexpected character '\(printable(byte))'", at: index)
        }
    }

    // MARK: - Strings

    private mutating func parseString() throws(JSONSyntaxError) -> String {
        let start = index + 1
        let (hasEscapes, closing) = try scanString()
        if !hasEscapes {
            // Validated by scanString, so decoding cannot replace anything.
            return String(decoding: bytes[start..<closing], as: UTF8.self)
        }
        return try unescape(start..<closing)
    }

    private mutating func skipString() throws(JSONSyntaxError) {
        _ = try scanString()
    }

    /// Scans a string starting at the opening quote; validates UTF-8, control characters and
    /// escape syntax; leaves `index` after the closing quote.
    private mutating func scanString() throws(JSONSyntaxError) -> (hasEscapes: Bool, closing: Int) {
        let opening = index
        index += 1
        var hasEscapes = false
        while index < end {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                let closing = index
                index += 1
                return (hasEscapes, closing)
            case UInt8(ascii: "\\"):
                hasEscapes = true
                // A backslash as the last byte: the string cannot end. (A bare `break` here left
                // the switch with `index` unchanged and spun forever; found by `make fuzz`.)
                guard index + 1 < end else { throw JSONSyntaxError("unterminated string", at: opening) }
                switch bytes[index + 1] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                    UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 2
                case UInt8(ascii: "u"):
                    guard let unit = escapedUnit(at: index) else { throw JSONSyntaxError("invalid \\u escape", at: index) }
                    // Surrogates are checked here too, not only when the string is unescaped: a
                    // skipped value (a payload, meta) must not carry a lone one either.
                    if (0xD800...0xDBFF).contains(unit) {
                        guard let low = escapedUnit(at: index + 6), bytes[index + 6] == UInt8(ascii: "\\"), (0xDC00...0xDFFF).contains(low) else {
                            throw JSONSyntaxError("unpaired UTF-16 surrogate in \\u escape", at: index)
                        }
                        index += 12
                    } else if (0xDC00...0xDFFF).contains(unit) {
                        throw JSONSyntaxError("unpaired UTF-16 surrogate in \\u escape", at: index)
                    } else {
                        index += 6
                    }
                default:
                    throw JSONSyntaxError("invalid escape sequence", at: index)
                }
            case 0x00..<0x20:
                throw JSONSyntaxError("raw control character 0x\(String(byte, radix: 16)) in string", at: index)
            case 0x20..<0x80:
                index += 1
            default:
                index = try UTF8Validation.scalarEnd(bytes, at: index, end: end)
            }
        }
        throw JSONSyntaxError("unterminated string", at: opening)
    }

    private func unescape(_ range: Range<Int>) throws(JSONSyntaxError) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(range.count)
        var i = range.lowerBound
        while i < range.upperBound {
            let byte = bytes[i]
            guard byte == UInt8(ascii: "\\") else {
                out.append(byte)
                i += 1
                continue
            }
            let escaped = bytes[i + 1]
            i += 2
            switch escaped {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = hex4(at: i)
                i += 4
                if (0xD800...0xDBFF).contains(scalar) {
                    // A high surrogate must be followed by an escaped low surrogate.
                    guard i + 6 <= range.upperBound,
                        bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u")
                    else { throw JSONSyntaxError("unpaired UTF-16 surrogate in \\u escape", at: i) }
                    let low = hex4(at: i + 2)
                    guard (0xDC00...0xDFFF).contains(low) else {
                        throw JSONSyntaxError("unpaired UTF-16 surrogate in \\u escape", at: i)
                    }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw JSONSyntaxError("unpaired UTF-16 surrogate in \\u escape", at: i - 6)
                }
                guard let unicode = Unicode.Scalar(scalar) else {
                    throw JSONSyntaxError("invalid \\u escape", at: i)
                }
                out.append(contentsOf: unicode.utf8)
            default: out.append(escaped)  // \" \\ \/
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private func hex4(at i: Int) -> UInt32 {
        var value: UInt32 = 0
        for k in 0..<4 { value = value << 4 | UInt32(Self.hexValue(bytes[i + k]) ?? 0) }
        return value
    }

    /// The UTF-16 unit of a `\\uXXXX` escape starting at `at` (the backslash), if well formed.
    private func escapedUnit(at position: Int) -> UInt16? {
        guard position + 5 < end, bytes[position] == UInt8(ascii: "\\"), bytes[position + 1] == UInt8(ascii: "u") else { return nil }
        var unit: UInt16 = 0
        for offset in 2...5 {
            guard let digit = Self.hexValue(bytes[position + offset]) else { return nil }
            unit = unit << 4 | UInt16(digit)
        }
        return unit
    }

    static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    // MARK: - Numbers and literals

    private mutating func scanNumber() throws(JSONSyntaxError) -> Range<Int> {
        let start = index
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek(), Self.isDigit(first) else {
            throw JSONSyntaxError("invalid number", at: start)
        }
        if first == UInt8(ascii: "0") {
            index += 1
            if let next = peek(), Self.isDigit(next) { throw JSONSyntaxError("leading zero in number", at: start) }
        } else {
            skipDigits()
        }
        if peek() == UInt8(ascii: ".") {
            index += 1
            guard let next = peek(), Self.isDigit(next) else { throw JSONSyntaxError("invalid number", at: start) }
            skipDigits()
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            guard let next = peek(), Self.isDigit(next) else { throw JSONSyntaxError("invalid number", at: start) }
            skipDigits()
        }
        return start..<index
    }

    private mutating func skipDigits() {
        while let byte = peek(), Self.isDigit(byte) { index += 1 }
    }

    private static func isDigit(_ byte: UInt8) -> Bool {
        byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")
    }

    private mutating func expectLiteral(_ literal: StaticString) throws(JSONSyntaxError) {
        let count = literal.utf8CodeUnitCount
        guard index + count <= end else { throw JSONSyntaxError("unexpected end of input", at: index) }
        let matches = literal.withUTF8Buffer { expected in
            (0..<count).allSatisfy { bytes[index + $0] == expected[$0] }
        }
        guard matches else { throw JSONSyntaxError("invalid literal", at: index) }
        index += count
    }

    // MARK: - Helpers

    private func peek() -> UInt8? {
        index < end ? bytes[index] : nil
    }

    private mutating func expect(_ byte: UInt8, _ message: String) throws(JSONSyntaxError) {
        guard peek() == byte else {
            if index >= end { throw JSONSyntaxError("unexpected end of input (\(message))", at: index) }
            throw JSONSyntaxError(message, at: index)
        }
        index += 1
    }

    private mutating func skipWhitespace() {
        while index < end {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private func tooDeep() -> JSONSyntaxError {
        JSONSyntaxError("nested deeper than \(maxDepth) levels", at: index)
    }

    private func printable(_ byte: UInt8) -> String {
        (0x21..<0x7F).contains(byte) ? String(UnicodeScalar(byte)) : "0x" + String(byte, radix: 16)
    }
}
