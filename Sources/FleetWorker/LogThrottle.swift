import Logging
import Synchronization

/// Keeps a flood of one kind of warning from drowning the log: every job of a producer that
/// ships a bug, every notification during an APNs outage, every result while Kafka refuses
/// writes. The first `burst` lines of each `interval` go out; the rest are only counted, and the
/// next line that goes out says how many were left out. The metrics still count every one.
final class LogThrottle: Sendable {
    /// Whether to log this occurrence, and how many were left out since the last logged one.
    struct Admission {
        var log: Bool
        var leftOut: Int
    }

    private struct Window {
        var start: ContinuousClock.Instant
        var logged = 0
        var leftOut = 0
    }

    let burst: Int
    let interval: Duration
    private let window: Mutex<Window>

    init(burst: Int = 20, interval: Duration = .seconds(10), now: ContinuousClock.Instant = .now) {
        self.burst = max(1, burst)
        self.interval = interval
        self.window = Mutex(Window(start: now))
    }

    /// Logs `message` to `logger` at `level` unless this kind is over its budget; the message and
    /// metadata are only built for a line that goes out, and a line the logger's level would
    /// drop does not use up the budget.
    func log(
        _ level: Logger.Level, _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata, to logger: Logger
    ) {
        guard logger.logLevel <= level else { return }
        let admission = admit()
        guard admission.log else { return }
        logger.log(level: level, message(), metadata: metadata().merging(admission.metadata) { $1 })
    }

    func admit(now: ContinuousClock.Instant = .now) -> Admission {
        window.withLock { window in
            if now - window.start >= interval {
                window.start = now
                window.logged = 0
            }
            guard window.logged < burst else {
                window.leftOut += 1
                return Admission(log: false, leftOut: 0)
            }
            window.logged += 1
            defer { window.leftOut = 0 }
            return Admission(log: true, leftOut: window.leftOut)
        }
    }
}

extension LogThrottle.Admission {
    /// Metadata for a logged line: how many similar lines were left out before it, if any.
    var metadata: Logger.Metadata {
        leftOut > 0 ? ["log.left_out": "\(leftOut)"] : [:]
    }
}
