/// An APNs device token, kept as the lowercase hex text that goes into `:path`.
///
/// APNs tokens are 32 bytes today; the contract accepts 32 to 100 bytes because Apple has
/// said token length may grow.
public struct DeviceToken: Sendable, Hashable, CustomStringConvertible {
    public static let minimumBytes = 32
    public static let maximumBytes = 100

    /// Lowercase hex, an even number of digits.
    public let hex: String

    /// Validates a hex token; the error says exactly what is wrong with it.
    public init(hex text: String) throws(JobRejection) {
        let utf8 = text.utf8
        guard !utf8.isEmpty else { throw JobRejection(field: "token", "device token is empty") }
        // Every job's token passes here: scanned as contiguous bytes when the String has them.
        let (firstInvalid, needsLowercasing) = utf8.withContiguousStorageIfAvailable(Self.scan) ?? Self.scan(Array(utf8))
        if let (offset, byte) = firstInvalid {
            throw JobRejection(field: "token", "device token is not hex: character \(offset + 1) is \(Self.describe(byte))")
        }
        guard utf8.count % 2 == 0 else {
            throw JobRejection(field: "token", "device token has an odd number of hex digits (\(utf8.count))")
        }
        let decoded = utf8.count / 2
        guard decoded >= Self.minimumBytes, decoded <= Self.maximumBytes else {
            throw JobRejection(
                field: "token",
                "device token is \(decoded) bytes; it must be \(Self.minimumBytes) to \(Self.maximumBytes) bytes (\(Self.minimumBytes * 2) to \(Self.maximumBytes * 2) hex digits)"
            )
        }
        self.hex = needsLowercasing ? text.lowercased() : text
    }

    /// The first byte that is not a hex digit (with its offset), and whether any digit is uppercase.
    private static func scan(_ bytes: some Collection<UInt8>) -> (firstInvalid: (Int, UInt8)?, needsLowercasing: Bool) {
        var needsLowercasing = false
        var offset = 0
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"):
                break
            case UInt8(ascii: "A")...UInt8(ascii: "F"):
                needsLowercasing = true
            default:
                return ((offset, byte), needsLowercasing)
            }
            offset += 1
        }
        return (nil, needsLowercasing)
    }

    /// A token from its binary form (the legacy interfaces carry tokens as bytes).
    public init(bytes: some Collection<UInt8>) throws(JobRejection) {
        var text = ""
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(Self.hexDigits[Int(byte >> 4)])
            text.append(Self.hexDigits[Int(byte & 0x0F)])
        }
        try self.init(hex: text)
    }

    /// The token's bytes, for the legacy binary interface.
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(hex.utf8.count / 2)
        var high: UInt8 = 0
        for (offset, byte) in hex.utf8.enumerated() {
            let nibble = JSONParser.hexValue(byte) ?? 0
            if offset % 2 == 0 { high = nibble } else { out.append(high << 4 | nibble) }
        }
        return out
    }

    /// The first and last few digits, for logs: enough to correlate, not enough to target a device.
    public var redacted: String {
        guard hex.count > 12 else { return hex }
        return "\(hex.prefix(6))…\(hex.suffix(4))"
    }

    public var description: String { hex }

    private static let hexDigits: [Character] = Array("0123456789abcdef")

    private static func describe(_ byte: UInt8) -> String {
        switch byte {
        case 0x21..<0x7F: "'\(Character(UnicodeScalar(byte)))'"
        default: "byte 0x\(String(byte, radix: 16, uppercase: false))"
        }
    }
}
