import APNsCore
import DequeModule

/// What the gateway made of one notification.
public enum LegacyGatewayVerdict: Sendable, Hashable, CustomStringConvertible {
    /// The gateway took it: a later error-response showed it passed, or the quiet period
    /// passed after it was written with no error-response.
    case accepted
    /// The gateway answered with an error-response naming this notification.
    case rejected(LegacyErrorStatus)
    /// Never written: the gateway would have answered `status` (payload or token size, an empty
    /// payload), so the client said it instead of breaking a connection over it.
    case refused(LegacyErrorStatus, detail: String)
    /// No verdict: the deadline passed, no connection could be made, the client shut down, or a
    /// connection kept closing before the quiet period passed. The text says which.
    case notAnswered(String)

    public var description: String {
        switch self {
        case .accepted: "accepted"
        case .rejected(let status): "rejected: status \(status)"
        case .refused(let status, let detail): "refused before sending (\(status.meaning)): \(detail)"
        case .notAnswered(let why): "not answered: \(why)"
        }
    }
}

/// The bookkeeping of the legacy gateway client, without I/O: which notifications wait to be
/// written, which are on which connection unconfirmed, and what an error-response, a close or
/// the passing of time means for each of them. The client executes what the methods return.
///
/// The binary interface answers nothing on success. So a connection keeps a *window* of written,
/// unconfirmed notifications in write order. An error-response (command 8) names one of them:
/// the ones before it passed, it failed, and the gateway dropped the ones after it (they go back
/// to the front of the queue for another connection). A notification with no error-response
/// for `quietPeriod` after it was written counts as accepted.
///
/// Generic over the waiter so that it stays pure and testable.
struct GatewayStateMachine<Waiter> {
    typealias Instant = ContinuousClock.Instant

    struct Configuration {
        /// Written, unconfirmed notifications per connection at most.
        var windowSize: Int
        var quietPeriod: Duration
        /// Times a notification is written again after a connection closed before its quiet
        /// period ended (the gateway may or may not have taken it).
        var maximumResends: Int
        /// False for the simple format: it carries no identifier, so an error-response cannot
        /// name its notification.
        var identifiesNotifications: Bool
    }

    struct Entry {
        var bytes: [UInt8]
        /// When the caller must have its verdict.
        var deadline: Instant
        /// When it must have been written (the job's cutoff): not written, or written again,
        /// after that. Nil for no such limit.
        var sendBy: Instant?
        /// Nil once the caller has its verdict (e.g. its deadline passed while written): the entry
        /// stays in its window so error-responses are still attributed correctly, and is not re-sent.
        var waiter: Waiter?
        /// Times it was written again after an unexplained close.
        var resends = 0
    }

    struct Written {
        var key: UInt32
        /// When its bytes reached the socket (the kernel's send buffer); nil while they wait in
        /// the channel. The quiet period counts from here, so a channel that cannot write
        /// cannot make a notification look accepted. Bytes the kernel took but the gateway never
        /// received (a flow dropped silently) can: see the README's known limitations.
        var writtenAt: Instant?
    }

    struct Connection {
        var window: Deque<Written> = []
        /// How many entries at the window's end are not stamped yet (`writtenAt == nil`).
        var unstamped = 0
        var drainScheduled = false
        /// After an error-response: nothing more is written; the gateway closes it.
        var closing = false
        /// Notifications ever written on it. The simple format's error-response names none: it
        /// is one's own only on a connection that carried no other (one already confirmed by
        /// its quiet period may be the one a late error-response is about).
        var carried = 0
        /// The last notification its quiet period confirmed: the one a maintenance Shutdown names
        /// when it dropped everything written after it.
        var lastConfirmed: UInt32?
    }

    /// A verdict for a caller.
    struct Resume {
        var waiter: Waiter
        var verdict: LegacyGatewayVerdict
    }

    /// What the client does after an event: resume these callers, and run a write pass on these
    /// connections (on their event loops).
    struct Actions {
        var resumes: [Resume] = []
        var drains: [UInt64] = []
        /// Notifications written again on another connection (for metrics).
        var resent = 0
        /// An error-response that named no notification in the window (for a log line).
        var unattributed: LegacyErrorResponse?
    }

    let configuration: Configuration
    private(set) var entries: [UInt32: Entry] = [:]
    private(set) var pending: Deque<UInt32> = []
    private(set) var connections: [UInt64: Connection] = [:]
    private(set) var shuttingDown = false
    private var nextIdentifier: UInt32 = 0

    init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// Notifications written and not yet confirmed, over all connections.
    var unconfirmedCount: Int { connections.values.reduce(0) { $0 + $1.window.count } }
    var activeConnectionCount: Int { connections.values.filter { !$0.closing }.count }

    /// The identifier the next enqueued notification will carry (it must be in its bytes).
    /// Never 0, so that an error-response for a simple-format PDU cannot name one; skips
    /// identifiers still in use after a wrap.
    mutating func takeIdentifier() -> UInt32 {
        repeat {
            nextIdentifier &+= 1
        } while nextIdentifier == 0 || entries[nextIdentifier] != nil
        return nextIdentifier
    }

    // MARK: Callers

    /// Queues a notification whose PDU (carrying `identifier`) is `bytes`.
    mutating func enqueue(identifier: UInt32, bytes: [UInt8], deadline: Instant, sendBy: Instant? = nil, waiter: Waiter) -> Actions {
        var actions = Actions()
        if shuttingDown {
            actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered("the legacy gateway client is shutting down; it was not sent")))
            return actions
        }
        entries[identifier] = Entry(bytes: bytes, deadline: deadline, sendBy: sendBy, waiter: waiter)
        pending.append(identifier)
        scheduleDrains(&actions)
        return actions
    }

    // MARK: Connections

    mutating func connectionActive(_ id: UInt64) -> Actions {
        var actions = Actions()
        connections[id] = Connection()
        scheduleDrains(&actions)
        return actions
    }

    /// A write pass on connection `id` at `now`: the PDUs to write, in order. Their notifications
    /// join the connection's window now, so the window's order is the wire's order as long as
    /// write passes of one connection run one after another (they do, on its event loop). A
    /// notification past its deadline or send-by time is answered instead of written (between
    /// ticks, `tick` has not caught it yet).
    mutating func drain(_ id: UInt64, now: Instant) -> (writes: [[UInt8]], actions: Actions) {
        var actions = Actions()
        guard var connection = connections[id] else { return ([], actions) }
        connection.drainScheduled = false
        var writes: [[UInt8]] = []
        if !connection.closing {
            while connection.window.count < configuration.windowSize, let key = pending.popFirst() {
                guard let entry = entries[key] else { continue }
                guard let waiter = entry.waiter else {
                    entries[key] = nil
                    continue
                }
                if let why = tooLateToWrite(entry, now: now) {
                    entries[key] = nil
                    actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered(why)))
                    continue
                }
                connection.window.append(Written(key: key, writtenAt: nil))
                connection.carried += 1
                connection.unstamped += 1
                writes.append(entry.bytes)
            }
        }
        connections[id] = connection
        // What did not fit goes to another connection with room.
        scheduleDrains(&actions)
        return (writes, actions)
    }

    /// The first `count` unstamped PDUs of connection `id` reached the socket (write passes
    /// complete in order).
    mutating func written(_ id: UInt64, count: Int, now: Instant) {
        guard var connection = connections[id] else { return }
        let stamp = min(count, connection.unstamped)
        let start = connection.window.count - connection.unstamped
        for index in start..<(start + stamp) { connection.window[index].writtenAt = now }
        connection.unstamped -= stamp
        connections[id] = connection
    }

    /// Connection `id` received an error-response: settle its whole window.
    mutating func errorResponse(_ id: UInt64, _ response: LegacyErrorResponse, now: Instant) -> Actions {
        var actions = Actions()
        guard var connection = connections[id] else { return actions }
        connection.closing = true
        let window = connection.window
        connection.window = []
        connection.unstamped = 0
        connections[id] = connection

        // Status 10 ("Shutdown", documented after Table 5-1 was written) and 0 name the last
        // notification that passed rather than one that failed.
        let passed = response.status.code == 0 || response.status.code == 10
        let index = configuration.identifiesNotifications ? window.firstIndex(where: { $0.key == response.identifier }) : nil
        if let index {
            for written in window[..<index] { finish(written.key, .accepted, &actions) }
            finish(window[index].key, passed ? .accepted : .rejected(response.status), &actions)
            // Dropped by the gateway, certainly not processed: re-sending cannot duplicate them.
            requeue(window[(index + 1)...].map(\.key), countsAsResend: false, because: response, &actions)
        } else if !configuration.identifiesNotifications, !passed, connection.carried == 1, let only = window.first {
            // The simple format names nothing, but on a connection that carried one notification
            // a failure can only be its own. With others before it (confirmed by their quiet
            // period), a late error-response may be theirs: rejecting this one would invalidate
            // a good token. A "passed" status names nothing in this format (its identifier is
            // not the notification's), so that case is re-sent below.
            finish(only.key, .rejected(response.status), &actions)
        } else if configuration.identifiesNotifications, passed, response.identifier == connection.lastConfirmed {
            // A "passed" status (a maintenance Shutdown) naming the last one its quiet period
            // confirmed: everything still in the window came after it and was dropped, so it is
            // re-sent without spending its allowance, and the gateway is not in trouble. (Naming
            // anything else, it says nothing certain: the path below.)
            requeue(window.map(\.key), countsAsResend: false, because: response, &actions)
        } else {
            // Nothing to attribute it to: a failure naming one already confirmed (a late
            // error-response, then everything still in the window came after it and was
            // dropped), a garbage identifier, or a format that has none. Re-send all, bounded by
            // the resend limit.
            actions.unattributed = response
            requeue(window.map(\.key), countsAsResend: true, because: response, &actions)
        }
        scheduleDrains(&actions)
        return actions
    }

    /// Connection `id` closed. Without an error-response the window's fate is unknown: what
    /// outlived its quiet period counts as accepted, the rest is written again (at-least-once).
    mutating func connectionClosed(_ id: UInt64, now: Instant) -> Actions {
        var actions = Actions()
        guard let connection = connections.removeValue(forKey: id) else { return actions }
        var unsure: [UInt32] = []
        for written in connection.window {
            if let writtenAt = written.writtenAt, now >= writtenAt + configuration.quietPeriod {
                finish(written.key, .accepted, &actions)
            } else {
                unsure.append(written.key)
            }
        }
        requeue(unsure, countsAsResend: true, because: nil, &actions)
        scheduleDrains(&actions)
        return actions
    }

    // MARK: Time

    /// Confirms what passed its quiet period and answers callers whose deadline passed.
    mutating func tick(now: Instant) -> Actions {
        var actions = Actions()
        for id in connections.keys.sorted() {
            guard var connection = connections[id] else { continue }
            while let first = connection.window.first, let writtenAt = first.writtenAt, now >= writtenAt + configuration.quietPeriod {
                connection.window.removeFirst()
                connection.lastConfirmed = first.key
                finish(first.key, .accepted, &actions)
            }
            // Written and waiting for the quiet period: answer a caller whose deadline passed,
            // but keep the entry so later error-responses are still attributed right.
            for written in connection.window {
                if let entry = entries[written.key], let waiter = entry.waiter, now >= entry.deadline {
                    entries[written.key]?.waiter = nil
                    actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered("the deadline passed after it was written, before the gateway's quiet period ended (it may have been delivered)")))
                }
            }
            connections[id] = connection
        }
        if pending.contains(where: { entries[$0].map { tooLateToWrite($0, now: now) != nil } ?? true }) {
            var kept: Deque<UInt32> = []
            for key in pending {
                guard let entry = entries[key] else { continue }
                if let why = tooLateToWrite(entry, now: now) {
                    entries[key] = nil
                    if let waiter = entry.waiter {
                        actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered(why)))
                    }
                } else {
                    kept.append(key)
                }
            }
            pending = kept
        }
        scheduleDrains(&actions)
        return actions
    }

    // MARK: Shutdown

    /// Stops taking work and answers everything not yet written; written notifications still
    /// get their verdicts until the connections close.
    mutating func shutdown() -> Actions {
        var actions = Actions()
        shuttingDown = true
        for key in pending {
            guard let entry = entries.removeValue(forKey: key) else { continue }
            if let waiter = entry.waiter {
                actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered("the legacy gateway client shut down before it was written; it was not sent")))
            }
        }
        pending = []
        return actions
    }

    /// Answers everything still waiting (after the connections closed for good).
    mutating func finishAll(_ why: String) -> Actions {
        var actions = Actions()
        shuttingDown = true
        for (_, entry) in entries {
            if let waiter = entry.waiter { actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered(why))) }
        }
        entries = [:]
        pending = []
        for id in connections.keys {
            // The window and its count of unwritten PDUs go together: a write completing later
            // would otherwise index an empty window.
            connections[id]?.window = []
            connections[id]?.unstamped = 0
        }
        return actions
    }

    /// True when nothing waits for a verdict.
    var isIdle: Bool { pending.isEmpty && unconfirmedCount == 0 }

    // MARK: Helpers

    /// How often the client calls `tick`: a fifth of the quiet period, 5 to 100 ms.
    static func tickInterval(_ quietPeriod: Duration) -> Duration {
        min(max(quietPeriod / 5, .milliseconds(5)), .milliseconds(100))
    }

    /// Time beyond the quiet period that confirming a notification written now may take: a
    /// tick, and 100 ms for its bytes to reach the socket behind others.
    static func confirmationMargin(_ quietPeriod: Duration) -> Duration {
        tickInterval(quietPeriod) + .milliseconds(100)
    }

    /// Why a queued notification must no longer be written at `now`, if it must not.
    private func tooLateToWrite(_ entry: Entry, now: Instant) -> String? {
        let passed: String
        if now >= entry.deadline {
            passed = "the deadline"
        } else if let sendBy = entry.sendBy, now >= sendBy {
            passed = "its send-by time (the job's deadline or expiration)"
        } else if now + configuration.quietPeriod + Self.confirmationMargin(configuration.quietPeriod) > entry.deadline {
            // Written now, its deadline would pass before it is confirmed: the caller would hear
            // "may have been delivered", retry, and the device could get it twice. Unsent, a
            // retry is safe. Confirming takes the quiet period from when the bytes reach the
            // socket, seen at the next tick: the margin allows for both.
            passed = "the time to confirm it (its deadline is less than the gateway's quiet period away)"
        } else {
            return nil
        }
        if entry.resends > 0 {
            return "\(passed) passed before it could be written again (the earlier write may have been delivered)"
        }
        return connections.isEmpty
            ? "\(passed) passed with no connection to the gateway; it was not sent"
            : "\(passed) passed before it could be written; it was not sent"
    }

    private mutating func finish(_ key: UInt32, _ verdict: LegacyGatewayVerdict, _ actions: inout Actions) {
        guard let entry = entries.removeValue(forKey: key), let waiter = entry.waiter else { return }
        actions.resumes.append(Resume(waiter: waiter, verdict: verdict))
    }

    /// Puts `keys` back at the front of the queue, in their order.
    private mutating func requeue(_ keys: [UInt32], countsAsResend: Bool, because response: LegacyErrorResponse?, _ actions: inout Actions) {
        var again: [UInt32] = []
        for key in keys {
            guard var entry = entries[key] else { continue }
            guard let waiter = entry.waiter else {
                entries[key] = nil
                continue
            }
            if shuttingDown {
                entries[key] = nil
                // Not counted as a re-send: the gateway dropped it after an earlier failure.
                let why = !countsAsResend && response != nil && entry.resends == 0
                    ? "the gateway dropped it after an error-response for an earlier notification, and the legacy gateway client shut down before writing it again (it was not delivered)"
                    : "the legacy gateway client shut down before the gateway's quiet period ended (it may have been delivered)"
                actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered(why)))
                continue
            }
            if countsAsResend {
                entry.resends += 1
                if entry.resends > configuration.maximumResends {
                    entries[key] = nil
                    let why: String
                    if let response, !configuration.identifiesNotifications {
                        why = "the gateway answered status \(response.status) but the simple format carries no identifier to say which notification failed; gave up after \(configuration.maximumResends) re-sends"
                    } else if let response {
                        why = "the gateway answered status \(response.status) naming identifier \(response.identifier), which was not in flight, so every unconfirmed notification was written again; gave up after \(configuration.maximumResends) re-sends (it may have been delivered)"
                    } else {
                        why = "the gateway connection closed before the quiet period ended \(entry.resends) times (it may have been delivered)"
                    }
                    actions.resumes.append(Resume(waiter: waiter, verdict: .notAnswered(why)))
                    continue
                }
            }
            entries[key] = entry
            again.append(key)
        }
        actions.resent += again.count
        pending.insert(contentsOf: again, at: 0)
    }

    /// Asks for a write pass on a connection with room when work is queued and none is asked yet.
    private mutating func scheduleDrains(_ actions: inout Actions) {
        guard !pending.isEmpty else { return }
        if connections.values.contains(where: { $0.drainScheduled && !$0.closing && $0.window.count < configuration.windowSize }) { return }
        let candidate = connections
            .filter { !$0.value.closing && !$0.value.drainScheduled && $0.value.window.count < configuration.windowSize }
            .min { ($0.value.window.count, $0.key) < ($1.value.window.count, $1.key) }
        guard let (id, _) = candidate else { return }
        connections[id]?.drainScheduled = true
        actions.drains.append(id)
    }
}
