/// Lowercase canonical UUID text (version 4), such as an `apns-id`, from a fast generator.
/// Foundation's `UUID().uuidString` reads the system's random source and formats through
/// `printf` on every call; a worker or the simulator makes one per notification.
public enum UUIDText {
    public static func random(using generator: inout some RandomNumberGenerator) -> String {
        let high = (generator.next() & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        let low = (generator.next() & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 1
        return String(unsafeUninitializedCapacity: 36) { buffer in
            var position = 0
            write(high, firstNibble: 0, into: buffer, at: &position)
            write(low, firstNibble: 16, into: buffer, at: &position)
            return position
        }
    }

    /// Writes the 16 hex digits of `word`, with the dashes that fall among nibbles
    /// `firstNibble ..< firstNibble + 16` of the 32.
    private static func write(_ word: UInt64, firstNibble: Int, into buffer: UnsafeMutableBufferPointer<UInt8>, at position: inout Int) {
        for index in 0..<16 {
            let nibble = firstNibble + index
            if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                buffer[position] = UInt8(ascii: "-")
                position += 1
            }
            let digit = UInt8(truncatingIfNeeded: (word >> UInt64(60 - 4 * index)) & 0xF)
            buffer[position] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
            position += 1
        }
    }
}
