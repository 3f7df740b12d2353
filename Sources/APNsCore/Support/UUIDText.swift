/// Lowercase canonical UUID text (version 4), such as an `apns-id`, from a fast generator.
/// Foundation's `UUID().uuidString` reads the system's random source and formats through
/// `printf` on every call; a worker or the simulator makes one per notification.
public enum UUIDText {
    /// The length of the canonical text: 32 hex digits and 4 dashes.
    public static let count = 36

    public static func random(using generator: inout some RandomNumberGenerator) -> String {
        RandomUUID(using: &generator).text
    }
}

/// The 128 bits of a version 4 UUID, written out as text only where it is needed (into a
/// header block, say, without making a String).
public struct RandomUUID: Sendable, Hashable {
    public let high: UInt64
    public let low: UInt64

    public init(using generator: inout some RandomNumberGenerator) {
        high = (generator.next() & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        low = (generator.next() & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 1
    }

    public var text: String {
        String(unsafeUninitializedCapacity: UUIDText.count) { buffer in
            write(into: buffer)
            return UUIDText.count
        }
    }

    /// Writes the 36 bytes of the canonical text at the start of `buffer` (which must hold them).
    public func write(into buffer: UnsafeMutableBufferPointer<UInt8>) {
        precondition(buffer.count >= UUIDText.count, "a UUID's text needs 36 bytes")
        guard let base = buffer.baseAddress else { return }
        let digits = Self.hexDigits.utf8Start
        var position = 0
        for nibble in 0..<32 {
            if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                base[position] = UInt8(ascii: "-")
                position += 1
            }
            let word = nibble < 16 ? high : low
            base[position] = digits[Int(truncatingIfNeeded: (word >> UInt64(60 - 4 * (nibble & 15))) & 0xF)]
            position += 1
        }
    }

    private static let hexDigits: StaticString = "0123456789abcdef"
}
