import Testing

@testable import APNsSimulator

@Suite("Simulator counters")
struct SimulatorCountersTests {
    @Test("closed connections stay in the totals, but only the last ones are listed")
    func closedConnectionsAreBounded() {
        let counters = SimulatorCounters()
        let listed = SimulatorCounters.closedConnectionsListed
        var ids: [UInt64] = []
        for _ in 0..<(listed + 44) {
            let id = counters.openConnection(transport: "h2", authentication: "token", remoteAddress: "127.0.0.1")
            counters.update(id) { $0.requests += 2 }
            counters.closeConnection(id)
            ids.append(id)
        }
        let open = counters.openConnection(transport: "h2c", authentication: "token", remoteAddress: "127.0.0.1")
        counters.update(open) { $0.requests += 1 }
        counters.update(ids[0]) { $0.requests += 100 }

        let snapshot = counters.snapshot()
        #expect(snapshot.connectionsOpened == listed + 45)
        #expect(snapshot.totals.requests == 2 * (listed + 44) + 1, "every connection's requests, and nothing after a close")
        #expect(snapshot.connections.count == listed + 1)
        #expect(snapshot.connections.map(\.id) == Array(ids.suffix(listed)) + [open], "the last closed ones, then the open one, by id")
        #expect(snapshot.connections.filter(\.open).map(\.id) == [open])
    }
}
