/// UTF-8 validation without allocating: used for JSON strings and Kafka header values.
public enum UTF8Validation {
    /// Returns the index just past the multi-byte scalar starting at `index`, or throws when the
    /// bytes there are not well-formed UTF-8 (overlong forms, surrogates and values above
    /// U+10FFFF are rejected, as RFC 3629 requires).
    static func scalarEnd(_ bytes: [UInt8], at index: Int, end: Int) throws(JSONSyntaxError) -> Int {
        let lead = bytes[index]
        let length: Int
        var lower: UInt8 = 0x80
        var upper: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; lower = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; upper = 0x9F
        case 0xF0: length = 4; lower = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; upper = 0x8F
        default: throw JSONSyntaxError("invalid UTF-8 byte 0x\(String(lead, radix: 16))", at: index)
        }
        guard index + length <= end else { throw JSONSyntaxError("truncated UTF-8 sequence", at: index) }
        let second = bytes[index + 1]
        guard second >= lower && second <= upper else {
            throw JSONSyntaxError("invalid UTF-8 sequence", at: index)
        }
        for k in 2..<max(2, length) where bytes[index + k] & 0xC0 != 0x80 {
            throw JSONSyntaxError("invalid UTF-8 sequence", at: index)
        }
        return index + length
    }

    /// Whether the whole byte sequence is well-formed UTF-8.
    public static func isValid(_ bytes: [UInt8]) -> Bool {
        var index = 0
        while index < bytes.count {
            if bytes[index] < 0x80 {
                index += 1
                continue
            }
            guard let next = try? scalarEnd(bytes, at: index, end: bytes.count) else { return false }
            index = next
        }
        return true
    }
}
