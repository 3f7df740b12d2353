import APNsCore
import NIOCore
import Synchronization

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
