/// Remembers which token invalidations have been published, so that duplicate results (the
/// pipeline is at-least-once) do not repeat a token event.
///
/// A repeat is the same reason for the same key. Only 410 Unregistered carries a time of its own
/// (APNs's timestamp of when the token stopped being valid): a job redone after a crash meets the
/// same dead token and gets the same timestamp, so it is a repeat, while a later timestamp is a
/// new invalidation (the token was registered again and died again). BadDeviceToken and
/// DeviceTokenNotForTopic carry only the send time, as does a 410 without a usable timestamp: a
/// repeat at least `repeatInterval` after the published event is news, since readers take a
/// token back when the app registers it again after an event's time (apps do so on every
/// launch), and a token still bad must then be invalidated again; closer repeats (a redone job,
/// a producer sending to it in a loop) are duplicates, so one bad token costs at most one event
/// a minute, whichever of the two reasons each answer gives. Two stated 410 times are compared
/// to the second: the feedback service states whole seconds, and its tuple and a 410 for the
/// same invalidation must not make two events. Another reason is news unless it was observed
/// before what was published: a redelivered old result must not follow a newer event onto the
/// compacted topic, where the last value for a key is the one readers keep. (By when each was
/// observed, not by their times: a 410's stated time lies before the BadDeviceToken send time
/// an earlier, wrong-environment job gave the key, and that 410 is still news.)
///
/// Memory is bounded: past `capacity` keys the oldest is forgotten first. Forgetting costs at
/// most one repeated event for that key, which the compacted topic absorbs. Keys are kept as
/// 64-bit hashes, and reasons as a code: a million keys took 92 MB, against 309 MB as strings
/// (over the feedback pod's memory limit); a reason too long for Swift's inline strings
/// (DeviceTokenNotForTopic) added a heap copy per key. A new key sharing the hash of one of a million remembered keys, and so
/// its event taken for a repeat, has a chance of about 1 in 10^13.
public struct InvalidationLedger: Sendable {
    private struct Entry: Sendable {
        var reason: ReasonCode
        var invalidatedAt: Int64
        var observedAt: Int64

        init(_ event: TokenEvent) {
            reason = ReasonCode(event.reason)
            invalidatedAt = event.invalidatedAt
            observedAt = event.observedAt
        }
    }

    /// The reasons an event can have, as the ledger tells them apart: any other 410 reason
    /// (Apple has added some) is `otherGone`.
    private enum ReasonCode: UInt8, Sendable {
        case unregistered, badDeviceToken, deviceTokenNotForTopic, otherGone

        init(_ reason: String) {
            switch reason {
            case APNsReason.unregistered.rawValue: self = .unregistered
            case APNsReason.badDeviceToken.rawValue: self = .badDeviceToken
            case APNsReason.deviceTokenNotForTopic.rawValue: self = .deviceTokenNotForTopic
            default: self = .otherGone
            }
        }

        /// BadDeviceToken and DeviceTokenNotForTopic: their events carry only the time of the send.
        var carriesSendTime: Bool { self == .badDeviceToken || self == .deviceTokenNotForTopic }
    }

    public let capacity: Int
    /// How much later an event dated by its send time (BadDeviceToken, DeviceTokenNotForTopic,
    /// a 410 without APNs's timestamp) must come to be news again.
    public static let repeatIntervalMilliseconds: Int64 = 60_000
    private var entries: [Int: Entry] = [:]
    /// Key hashes in the order they were first remembered; `head` is the oldest still in use.
    private var order: [Int] = []
    private var head = 0

    public init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    /// The number of keys remembered.
    public var count: Int { entries.count }

    /// Whether `event` is news. If it is, it is remembered and the caller publishes it.
    public mutating func admit(_ event: TokenEvent) -> Bool {
        let key = Self.hash(event.key)
        let reason = ReasonCode(event.reason)
        if let known = entries[key] {
            // Saturating: the ledger takes any event, and times far apart must not trap.
            let difference = event.invalidatedAt.subtractingReportingOverflow(known.invalidatedAt)
            let laterBy = difference.overflow ? (event.invalidatedAt > known.invalidatedAt ? .max : .min) : difference.partialValue
            // The two send-time reasons bound a key together: a producer whose answers alternate
            // between them must not get an event per answer.
            let sameKind = known.reason == reason || (known.reason.carriesSendTime && reason.carriesSendTime)
            let again = sameKind
                && (reason == .unregistered && event.timeIsStated ? laterBy >= 1000 : laterBy >= Self.repeatIntervalMilliseconds)
            let otherReason = !sameKind && event.observedAt >= known.observedAt
            guard otherReason || again else { return false }
            entries[key] = Entry(event)
            return true
        }
        entries[key] = Entry(event)
        order.append(key)
        while entries.count > capacity, head < order.count {
            entries[order[head]] = nil
            head += 1
        }
        // Compact the order list once the forgotten prefix dominates it.
        if head > 1024, head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
        return true
    }

    /// Forgets `event` again, for a publish that never landed: a later duplicate must then be
    /// allowed to publish it.
    public mutating func forget(_ event: TokenEvent) {
        let key = Self.hash(event.key)
        guard let known = entries[key], known.reason == ReasonCode(event.reason), known.invalidatedAt == event.invalidatedAt else { return }
        entries[key] = nil
        // Its slot in `order` stays: evicting a key that is gone is a no-op, and if the key comes
        // back it is merely forgotten a little early.
    }

    /// Seeded per process, like every Swift hash: fine for memory that lives as long as it.
    private static func hash(_ key: String) -> Int {
        var hasher = Hasher()
        hasher.combine(key)
        return hasher.finalize()
    }
}
