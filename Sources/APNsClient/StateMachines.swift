import APNsCore

// Pure state machines (no I/O, no clock of their own): the connection and the pool execute
// what they decide. Each is unit-tested directly.

// MARK: - Stream budget

/// How many streams one connection may have open now.
///
/// The limit is the smallest of: the client's own cap, the server's latest
/// SETTINGS_MAX_CONCURRENT_STREAMS, 1 while a token-auth connection has had no successful
/// response (APNs allows one stream until a valid token is seen), and 0 once GOAWAY arrived or
/// before the server's first SETTINGS.
public struct StreamBudget: Sendable, Hashable {
    public let localLimit: Int
    /// The server's MAX_CONCURRENT_STREAMS; nil until its first SETTINGS.
    public private(set) var remoteLimit: Int?
    /// True for a token-auth connection until its first successful response.
    public private(set) var singleStreamUntilSuccess: Bool
    public private(set) var inFlight = 0
    public private(set) var goingAway = false

    public init(localLimit: Int, tokenAuthentication: Bool) {
        self.localLimit = max(1, localLimit)
        self.singleStreamUntilSuccess = tokenAuthentication
    }

    public var limit: Int {
        guard !goingAway, let remoteLimit else { return 0 }
        return singleStreamUntilSuccess ? min(1, remoteLimit) : min(localLimit, remoteLimit)
    }

    public var free: Int { max(0, limit - inFlight) }
    public var isUsable: Bool { !goingAway && remoteLimit != nil }

    /// SETTINGS arrived; `maxConcurrentStreams` is nil when the frame did not carry it.
    public mutating func settingsReceived(maxConcurrentStreams: UInt32?) {
        if let maxConcurrentStreams {
            remoteLimit = Int(min(maxConcurrentStreams, UInt32(Int32.max)))
        } else if remoteLimit == nil {
            // RFC 9113: unlimited until the peer says otherwise; the local cap applies.
            remoteLimit = Int(Int32.max)
        }
    }

    /// Takes a stream if one is free.
    public mutating func open() -> Bool {
        guard free > 0 else { return false }
        inFlight += 1
        return true
    }

    /// A stream ended; `tokenAccepted` when its answer proves the provider token valid.
    public mutating func close(tokenAccepted: Bool) {
        inFlight = max(0, inFlight - 1)
        if tokenAccepted { singleStreamUntilSuccess = false }
    }

    /// `count` streams ended; `tokenAccepted` when an answer among them proves the token valid.
    public mutating func close(streams count: Int, tokenAccepted: Bool) {
        inFlight = max(0, inFlight - count)
        if tokenAccepted { singleStreamUntilSuccess = false }
    }

    public mutating func goAwayReceived() {
        goingAway = true
    }

    /// Whether an answer shows APNs accepted the provider token: 200, or an answer that needs
    /// the device looked up after authenticating (410 Unregistered, 429 TooManyRequests). Not a
    /// 413 or a 5xx, which a front end can give before it checks the token: with a wrong key,
    /// one such answer would lift a new connection's one-stream limit (sending a burst of
    /// requests to be rejected 403 for good) and clear the pool's configuration error.
    public static func provesTokenValid(status: Int, reason: APNsReason?) -> Bool {
        switch status {
        case 200, 410: true
        case 429: reason == .tooManyRequests
        default: false
        }
    }
}

// MARK: - Provider token schedule

/// When a connection mints its provider token.
///
/// One token per connection, minted when the connection starts and replaced when it reaches
/// `refreshAge` (clamped to 21…55 minutes: APNs rejects tokens older than an hour, and answers
/// TooManyProviderTokenUpdates to changes more often than every 20 minutes). Times are whole
/// seconds on a clock that does not jump (`APNsClock.elapsed`), not the token's `iat`: a minute
/// of margin at the low end covers the truncation, five at the high end the host's clock
/// against APNs's and a request that waits for its stream before it goes out.
public struct ProviderTokenSchedule: Sendable, Hashable {
    public static let minimumAge: Int64 = 21 * 60
    public static let maximumAge: Int64 = 55 * 60

    public enum Decision: Sendable, Hashable {
        case keep
        case mint
    }

    public let refreshAge: Int64
    public private(set) var mintedAt: Int64?

    public init(refreshAge: Int64) {
        self.refreshAge = min(max(refreshAge, Self.minimumAge), Self.maximumAge)
    }

    /// What to do before sending at `time`.
    public func decide(at time: Int64) -> Decision {
        guard let mintedAt else { return .mint }
        // A clock that went backwards (an injected one) never causes an early change.
        return time - mintedAt >= refreshAge ? .mint : .keep
    }

    public mutating func minted(at time: Int64) {
        mintedAt = time
    }
}

// MARK: - Token rejections

/// Counts ExpiredProviderToken / InvalidProviderToken answers across a pool's connections.
///
/// The first rejection replaces the connection (a new connection mints a new token). If fresh
/// tokens keep being rejected, the key id, team id or key is wrong (or the clock is far off):
/// a configuration error, reported once until a request succeeds again.
public struct TokenRejectionTracker: Sendable, Hashable {
    public enum Action: Sendable, Hashable {
        /// Nothing to do (the connection was already being replaced).
        case none
        /// Close this connection and open a new one with a fresh token.
        case replaceConnection
        /// Also report a configuration error.
        case replaceConnectionAndReport(consecutive: Int)
    }

    public let threshold: Int
    public private(set) var consecutive = 0
    public private(set) var reported = false
    /// Connections already told to go, so one connection's burst of rejections counts once; kept
    /// until they close (a success elsewhere does not clear them: a retiring connection's late
    /// rejections would count again, against fresh tokens they say nothing about).
    private var replaced: Set<UInt64> = []

    public init(threshold: Int) {
        self.threshold = max(1, threshold)
    }

    public var isFailing: Bool { reported }

    public mutating func rejected(connection: UInt64) -> Action {
        guard replaced.insert(connection).inserted else { return .none }
        consecutive += 1
        if consecutive >= threshold, !reported {
            reported = true
            return .replaceConnectionAndReport(consecutive: consecutive)
        }
        return .replaceConnection
    }

    public mutating func accepted() {
        consecutive = 0
        reported = false
    }

    public mutating func connectionGone(_ connection: UInt64) {
        replaced.remove(connection)
    }
}

// MARK: - Reconnect backoff

/// Exponential backoff with jitter: attempt n waits between half and all of
/// `min(maximum, base × 2ⁿ)`. Reset once a connection proved healthy.
public struct ReconnectBackoff: Sendable, Hashable {
    public let base: Duration
    public let maximum: Duration
    public private(set) var failures = 0

    public init(base: Duration, maximum: Duration) {
        self.base = max(base, .milliseconds(1))
        self.maximum = max(maximum, self.base)
    }

    /// The wait before the next attempt; `jitter` is uniform in [0, 1].
    public mutating func nextDelay(jitter: Double) -> Duration {
        let exponent = min(failures, 30)
        failures += 1
        let ceiling = min(maximum, base * (1 << exponent))
        return ceiling * (0.5 + 0.5 * min(max(jitter, 0), 1))
    }

    public mutating func reset() {
        failures = 0
    }
}

// MARK: - Pool assignment

/// Which connection gets the next request, and who waits when none can take it.
///
/// A request goes to the usable connection with the most free streams, so a connection whose
/// limit APNs lowered (throttling) gets less work. When none has a free stream the caller
/// waits in FIFO order; waiters are handed a connection as streams free up. Generic over the
/// waiter so that it stays pure.
public struct PoolAssignment<Waiter> {
    public struct Entry: Sendable {
        public let id: UInt64
        public var budget: StreamBudget
    }

    public private(set) var entries: [Entry] = []
    /// Waiters by ticket, with the deadline (a monotonic clock reading) each gives up at.
    private var waiters: [UInt64: (waiter: Waiter, deadline: UInt64)] = [:]
    /// No waiter's deadline is earlier than this (it may be earlier than the earliest left, as
    /// waiters that are served do not raise it): `expire` scans only once it has passed.
    private var earliestDeadline: UInt64 = .max
    private var order: [UInt64] = []
    private var orderHead = 0
    private var nextTicket: UInt64 = 0
    public private(set) var shuttingDown = false

    public init() {}

    public var waiterCount: Int { waiters.count }
    public var inFlight: Int { entries.reduce(0) { $0 + $1.budget.inFlight } }

    public func budget(of connection: UInt64) -> StreamBudget? {
        entries.first { $0.id == connection }?.budget
    }

    /// Takes a stream on the connection with the most free streams.
    public mutating func acquire() -> UInt64? {
        guard !shuttingDown else { return nil }
        var best = -1
        var bestFree = 0
        for index in entries.indices {
            let free = entries[index].budget.free
            if free > bestFree {
                best = index
                bestFree = free
            }
        }
        guard best >= 0, entries[best].budget.open() else { return nil }
        return entries[best].id
    }

    /// Queues a waiter that gives up at `deadline` (any monotonic clock, in the caller's unit);
    /// returns its ticket (for `cancel`).
    @discardableResult
    public mutating func enqueue(_ waiter: Waiter, deadline: UInt64 = .max) -> UInt64 {
        nextTicket += 1
        waiters[nextTicket] = (waiter, deadline)
        earliestDeadline = min(earliestDeadline, deadline)
        order.append(nextTicket)
        return nextTicket
    }

    /// Removes a waiter that gave up; nil if it was already served.
    public mutating func cancel(ticket: UInt64) -> Waiter? {
        defer { compactOrder() }
        return waiters.removeValue(forKey: ticket)?.waiter
    }

    /// Removes and returns the waiters whose deadline is at or before `now`, oldest first. One
    /// periodic call replaces a timer per waiter.
    public mutating func expire(now: UInt64) -> [Waiter] {
        guard !waiters.isEmpty, earliestDeadline <= now else { return [] }
        var expired: [(ticket: UInt64, waiter: Waiter)] = []
        var earliestLeft = UInt64.max
        for (ticket, entry) in waiters {
            if entry.deadline <= now {
                expired.append((ticket, entry.waiter))
            } else {
                earliestLeft = min(earliestLeft, entry.deadline)
            }
        }
        earliestDeadline = earliestLeft
        for entry in expired { waiters.removeValue(forKey: entry.ticket) }
        compactOrder()
        return expired.sorted { $0.ticket < $1.ticket }.map(\.waiter)
    }

    /// Tickets in the FIFO, given up ones included (for tests).
    var ticketsQueued: Int { order.count - orderHead }

    /// Drops the tickets of waiters that gave up from the FIFO once they are most of it: only
    /// serving pops it, so while every waiter times out (streams stuck) it would grow forever.
    private mutating func compactOrder() {
        if waiters.isEmpty {
            order.removeAll(keepingCapacity: order.count <= 4096)
            orderHead = 0
        } else if order.count - orderHead > 2 * waiters.count + 1024 {
            order = order[orderHead...].filter { waiters[$0] != nil }
            orderHead = 0
        }
    }

    /// Adds a connection (not usable until its SETTINGS arrive).
    public mutating func add(connection id: UInt64, budget: StreamBudget) {
        entries.append(Entry(id: id, budget: budget))
    }

    /// Changes a connection's budget and returns the waiters that can now be served.
    public mutating func update(connection id: UInt64, _ change: (inout StreamBudget) -> Void) -> [(connection: UInt64, waiter: Waiter)] {
        restrict(connection: id, change)
        return serveWaiters()
    }

    /// Changes a connection's budget without serving waiters: for changes that give no other
    /// request a usable stream (a GOAWAY, a stream given back by a connection already gone).
    public mutating func restrict(connection id: UInt64, _ change: (inout StreamBudget) -> Void) {
        if let index = entries.firstIndex(where: { $0.id == id }) {
            change(&entries[index].budget)
        }
    }

    /// Removes a closed connection; its in-flight requests are settled by the connection itself.
    public mutating func remove(connection id: UInt64) {
        entries.removeAll { $0.id == id }
    }

    /// Stops assigning; returns every waiter, to be told the client shut down.
    public mutating func shutdown() -> [Waiter] {
        shuttingDown = true
        return takeAllWaiters()
    }

    /// Removes every waiter (in FIFO order), for example when no connection can be made.
    public mutating func takeAllWaiters() -> [Waiter] {
        var all: [Waiter] = []
        while let next = popWaiter() { all.append(next) }
        return all
    }

    private mutating func serveWaiters() -> [(connection: UInt64, waiter: Waiter)] {
        var served: [(connection: UInt64, waiter: Waiter)] = []
        while !waiters.isEmpty, !shuttingDown {
            guard let connection = acquire() else { break }
            guard let waiter = popWaiter() else {
                // Only cancelled tickets were left: give the stream back.
                if let index = entries.firstIndex(where: { $0.id == connection }) {
                    entries[index].budget.close(tokenAccepted: false)
                }
                break
            }
            served.append((connection, waiter))
        }
        return served
    }

    private mutating func popWaiter() -> Waiter? {
        while orderHead < order.count {
            let ticket = order[orderHead]
            orderHead += 1
            if orderHead > 1024, orderHead * 2 > order.count {
                order.removeFirst(orderHead)
                orderHead = 0
            }
            if let entry = waiters.removeValue(forKey: ticket) { return entry.waiter }
        }
        if orderHead > 0 {
            order.removeAll(keepingCapacity: true)
            orderHead = 0
        }
        return nil
    }
}
