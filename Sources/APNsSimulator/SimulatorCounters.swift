import Synchronization

/// Counts of one connection or of the whole simulator.
public struct SimulatorCounts: Sendable, Hashable, Codable {
    /// Requests whose stream ended (complete requests), answered or not yet.
    public var requests = 0
    /// Responses sent, by status code ("200", "410", ...).
    public var byStatus: [String: Int] = [:]
    /// Responses sent, by reason ("BadDeviceToken", ...); 200s are not listed.
    public var byReason: [String: Int] = [:]
    /// JWT signature verifications performed.
    public var tokenVerifications = 0
    /// Streams the peer reset or that closed before an answer.
    public var streamsReset = 0
    /// Streams refused (RST_STREAM REFUSED_STREAM) because they exceeded MAX_CONCURRENT_STREAMS.
    public var streamsRefused = 0
    /// GOAWAY frames sent.
    public var goAwaysSent = 0

    public init() {}

    public var answered: Int { byStatus.values.reduce(0, +) }

    mutating func apply(_ body: (inout SimulatorCounts) -> Void) { body(&self) }

    mutating func add(_ other: SimulatorCounts) {
        requests += other.requests
        for (key, value) in other.byStatus { byStatus[key, default: 0] += value }
        for (key, value) in other.byReason { byReason[key, default: 0] += value }
        tokenVerifications += other.tokenVerifications
        streamsReset += other.streamsReset
        streamsRefused += other.streamsRefused
        goAwaysSent += other.goAwaysSent
    }
}

/// One connection's identity and counts.
public struct ConnectionCounts: Sendable, Hashable, Codable {
    public var id: UInt64
    /// "h2", "h2c" (cleartext) or "h2-prior-knowledge" (TLS without ALPN).
    public var transport: String
    /// "token", "certificate".
    public var authentication: String
    public var remoteAddress: String
    public var open: Bool
    public var counts: SimulatorCounts
}

/// Everything counted so far.
public struct SimulatorCountersSnapshot: Sendable, Hashable, Codable {
    public var connectionsOpened: Int
    /// Over every connection so far.
    public var totals: SimulatorCounts
    /// The open connections and the last ``SimulatorCounters/closedConnectionsListed`` closed ones.
    public var connections: [ConnectionCounts]

    /// Responses sent with this status.
    public func count(status: Int) -> Int { totals.byStatus[String(status), default: 0] }

    /// Responses sent with this reason.
    public func count(reason: String) -> Int { totals.byReason[reason, default: 0] }

    /// A readable multi-line summary (printed at exit).
    public var summary: String {
        var lines = ["connections: \(connectionsOpened)", "requests: \(totals.requests), answered: \(totals.answered), token verifications: \(totals.tokenVerifications), streams reset: \(totals.streamsReset), streams refused: \(totals.streamsRefused), GOAWAYs sent: \(totals.goAwaysSent)"]
        for (status, count) in totals.byStatus.sorted(by: { $0.key < $1.key }) { lines.append("  status \(status): \(count)") }
        for (reason, count) in totals.byReason.sorted(by: { $0.key < $1.key }) { lines.append("  reason \(reason): \(count)") }
        for connection in connections {
            lines.append("connection #\(connection.id) \(connection.transport) \(connection.authentication) \(connection.remoteAddress)\(connection.open ? " (open)" : ""): requests \(connection.counts.requests), answered \(connection.counts.answered)")
        }
        return lines.joined(separator: "\n")
    }
}

/// The simulator's counters, shared by all event loops.
///
/// Each connection counts into its own slot under one lock; with one lock acquisition per
/// answered request the cost is a few tens of nanoseconds and the counts are exact.
public final class SimulatorCounters: Sendable {
    private struct State {
        var nextID: UInt64 = 1
        var connectionsOpened = 0
        /// Open connections.
        var connections: [UInt64: ConnectionCounts] = [:]
        /// Counts of every connection closed so far.
        var closedTotals = SimulatorCounts()
        /// The last closed connections, oldest first: a simulator serving for days under churning
        /// connections (GOAWAY every few thousand streams) must not keep them all.
        var recentlyClosed: [ConnectionCounts] = []
    }

    /// How many closed connections the snapshot lists (their counts stay in the totals).
    public static let closedConnectionsListed = 256

    private let state = Mutex(State())

    public init() {}

    func openConnection(transport: String, authentication: String, remoteAddress: String) -> UInt64 {
        state.withLock { state in
            let id = state.nextID
            state.nextID += 1
            state.connectionsOpened += 1
            state.connections[id] = ConnectionCounts(id: id, transport: transport, authentication: authentication, remoteAddress: remoteAddress, open: true, counts: SimulatorCounts())
            return id
        }
    }

    /// Call after the connection's last counts were published: later ones are not counted.
    func closeConnection(_ id: UInt64) {
        state.withLock { state in
            guard var connection = state.connections.removeValue(forKey: id) else { return }
            connection.open = false
            state.closedTotals.add(connection.counts)
            if state.recentlyClosed.count >= Self.closedConnectionsListed {
                state.recentlyClosed.removeFirst(state.recentlyClosed.count - Self.closedConnectionsListed + 1)
            }
            state.recentlyClosed.append(connection)
        }
    }

    /// Applies `body` to connection `id`'s counts under the lock.
    func update(_ id: UInt64, _ body: (inout SimulatorCounts) -> Void) {
        state.withLock { state in
            state.connections[id]?.counts.apply(body)
        }
    }

    /// Adds a connection's pending counts and clears them, under one lock acquisition.
    func publish(_ id: UInt64, _ pending: inout PendingCounts) {
        state.withLock { state in
            state.connections[id]?.counts.apply { counts in
                counts.requests += pending.requests
                counts.streamsReset += pending.streamsReset
                counts.streamsRefused += pending.streamsRefused
                for answer in pending.answers {
                    counts.byStatus[Self.statusText(answer.status), default: 0] += answer.count
                    if let reason = answer.reason { counts.byReason[reason, default: 0] += answer.count }
                }
            }
        }
        pending.reset()
    }

    /// The totals over every connection so far; the open connections and the last
    /// ``closedConnectionsListed`` closed ones, by id.
    public func snapshot() -> SimulatorCountersSnapshot {
        let (opened, closedTotals, recentlyClosed, open) = state.withLock { state in
            (state.connectionsOpened, state.closedTotals, state.recentlyClosed, Array(state.connections.values))
        }
        // Summed and sorted outside the lock, which every connection's answers need.
        var totals = closedTotals
        for connection in open { totals.add(connection.counts) }
        let connections = recentlyClosed + open.sorted { $0.id < $1.id }
        return SimulatorCountersSnapshot(connectionsOpened: opened, totals: totals, connections: connections.sorted { $0.id < $1.id })
    }

    private static let statusTexts: [Int: String] = Dictionary(uniqueKeysWithValues: [200, 400, 403, 404, 405, 410, 413, 429, 500, 503].map { ($0, String($0)) })
    static func statusText(_ status: Int) -> String { statusTexts[status] ?? String(status) }
}
