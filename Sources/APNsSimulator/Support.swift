import APNsCore
import NIOCore
import Synchronization

/// Lowercase canonical UUIDs (version 4) for `apns-id`s the client did not send.
enum UUIDText {
    private static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    static func random(using generator: inout SplitMix64) -> String {
        var high = generator.next()
        var low = generator.next()
        high = (high & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        low = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 1
        return String(unsafeUninitializedCapacity: 36) { buffer in
            var position = 0
            var nibble = 0
            for word in [high, low] {
                for shift in stride(from: 60, through: 0, by: -4) {
                    if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                        buffer[position] = UInt8(ascii: "-")
                        position += 1
                    }
                    buffer[position] = digits[Int((word >> UInt64(shift)) & 0xF)]
                    position += 1
                    nibble += 1
                }
            }
            return position
        }
    }
}

/// The per-device rate limit, shared by every connection (APNs counts per device, not per connection).
final class DeviceRateLimiter: Sendable {
    private struct Window { var start: UInt64; var count: Int }
    private let limit: Int
    private let window: UInt64
    private let windows = Mutex<[String: Window]>([:])

    init(limit: Int, window: Duration) {
        self.limit = limit
        let (seconds, attoseconds) = window.components
        self.window = max(1, UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000))
    }

    /// Counts one request for `token`; false when it is over the limit.
    func admit(_ token: String, now: NIODeadline = .now()) -> Bool {
        let nanoseconds = now.uptimeNanoseconds
        return windows.withLock { windows in
            if windows.count > 100_000 {
                windows = windows.filter { nanoseconds - $0.value.start < window }
            }
            var entry = windows[token] ?? Window(start: nanoseconds, count: 0)
            if nanoseconds - entry.start >= window { entry = Window(start: nanoseconds, count: 0) }
            entry.count += 1
            windows[token] = entry
            return entry.count <= limit
        }
    }
}

/// Readable dumps of requests (`--dump`): headers, a hex dump of the payload and the payload parsed.
enum RequestDump {
    static func hexDump(_ bytes: [UInt8]) -> String {
        var lines: [String] = []
        var offset = 0
        while offset < bytes.count {
            let row = bytes[offset..<min(offset + 16, bytes.count)]
            var line = String(offset, radix: 16).leftPad(4) + "  "
            for (index, byte) in row.enumerated() {
                line += String(byte, radix: 16).leftPad(2) + (index == 7 ? "  " : " ")
            }
            line += String(repeating: " ", count: (16 - row.count) * 3 + (row.count <= 8 ? 1 : 0))
            line += " |" + String(row.map { $0 >= 0x20 && $0 < 0x7F ? Character(UnicodeScalar($0)) : "." }) + "|"
            lines.append(line)
            offset += 16
        }
        return lines.joined(separator: "\n")
    }
}

extension String {
    func leftPad(_ width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
