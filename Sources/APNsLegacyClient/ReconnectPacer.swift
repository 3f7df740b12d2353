/// Paces reconnects: up to `burst` at once, then one per `interval` (a generic cell rate
/// algorithm, so a long quiet spell earns back the whole burst, and no more).
public struct ReconnectPacer: Sendable {
    public struct Rate: Sendable, Hashable {
        public var burst: Int
        public var interval: Duration

        public init(burst: Int, interval: Duration) {
            self.burst = burst
            self.interval = interval
        }
    }

    private let interval: Duration
    /// How far ahead of now the schedule may run: the burst, less the one reconnect it admits.
    private let tolerance: Duration
    /// When the next reconnect is due if they came at exactly the steady pace.
    private var due: ContinuousClock.Instant?

    public init(_ rate: Rate) {
        interval = max(rate.interval, .zero)
        tolerance = interval * (max(rate.burst, 1) - 1)
    }

    /// How long to wait before the reconnect asked for at `now`; counts it as made.
    public mutating func delay(now: ContinuousClock.Instant) -> Duration {
        let scheduled = max(due ?? now, now)
        due = scheduled + interval
        return max(.zero, scheduled - tolerance - now)
    }
}
