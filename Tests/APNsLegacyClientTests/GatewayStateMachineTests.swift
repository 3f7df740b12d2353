import APNsCore
import Testing

@testable import APNsLegacyClient

/// The gateway bookkeeping on its own: no sockets, time passed in by hand.
@Suite("Legacy gateway state machine", .timeLimit(.minutes(1)))
struct GatewayStateMachineTests {
    typealias Machine = GatewayStateMachine<Int>

    let start = ContinuousClock.now

    func machine(window: Int = 100, resends: Int = 2, identifies: Bool = true) -> Machine {
        Machine(configuration: .init(windowSize: window, quietPeriod: .seconds(1), maximumResends: resends, identifiesNotifications: identifies))
    }

    /// Enqueues waiters `range` (waiter n carries identifier n) and returns the identifiers.
    @discardableResult
    func enqueue(_ machine: inout Machine, _ range: ClosedRange<Int>) -> [UInt32] {
        range.map { waiter in
            let identifier = machine.takeIdentifier()
            _ = machine.enqueue(identifier: identifier, bytes: [UInt8(waiter & 0xFF)], deadline: start + .seconds(10), waiter: waiter)
            return identifier
        }
    }

    /// A machine with `count` notifications (waiters 1...count) written on connection 1.
    func drained(_ count: Int, window: Int = 100, resends: Int = 2, identifies: Bool = true) -> Machine {
        var machine = machine(window: window, resends: resends, identifies: identifies)
        enqueue(&machine, 1...count)
        _ = machine.connectionActive(1)
        _ = machine.drain(1, now: start)
        return machine
    }

    func verdicts(_ actions: Machine.Actions) -> [Int: LegacyGatewayVerdict] {
        Dictionary(uniqueKeysWithValues: actions.resumes.map { ($0.waiter, $0.verdict) })
    }

    @Test("an error-response settles the window: before it accepted, it rejected, after it re-sent on the next connection")
    func errorInTheMiddle() {
        var machine = machine()
        let identifiers = enqueue(&machine, 1...10)
        #expect(identifiers == Array(1...10))
        let activated = machine.connectionActive(1)
        #expect(activated.drains == [1])
        let pass = machine.drain(1, now: start)
        #expect(pass.writes.count == 10)
        machine.written(1, count: 10, now: start)

        let actions = machine.errorResponse(1, LegacyErrorResponse(status: .invalidToken, identifier: 4), now: start + .milliseconds(10))
        let got = verdicts(actions)
        #expect(got.count == 4)
        #expect((1...3).allSatisfy { got[$0] == .accepted })
        #expect(got[4] == .rejected(.invalidToken))
        #expect(actions.resent == 6)
        #expect(Array(machine.pending) == [5, 6, 7, 8, 9, 10], "re-sent in their original order")
        #expect(actions.drains.isEmpty, "the connection is closing; nothing else to write to")

        _ = machine.connectionClosed(1, now: start + .milliseconds(20))
        let next = machine.connectionActive(2)
        #expect(next.drains == [2])
        let again = machine.drain(2, now: start)
        #expect(again.writes == (5...10).map { [UInt8($0)] })
        machine.written(2, count: 6, now: start + .milliseconds(30))
        let quiet = machine.tick(now: start + .milliseconds(1030))
        #expect(verdicts(quiet) == Dictionary(uniqueKeysWithValues: (5...10).map { ($0, LegacyGatewayVerdict.accepted) }))
        #expect(machine.isIdle)
    }

    @Test("the quiet period counts from when the bytes reached the socket")
    func quietPeriod() {
        var machine = drained(2)
        #expect(machine.tick(now: start + .seconds(5)).resumes.isEmpty, "not yet written to the socket")
        machine.written(1, count: 1, now: start + .seconds(5))
        machine.written(1, count: 1, now: start + .milliseconds(5500))
        #expect(machine.tick(now: start + .milliseconds(5999)).resumes.isEmpty)
        #expect(verdicts(machine.tick(now: start + .seconds(6))) == [1: .accepted])
        #expect(verdicts(machine.tick(now: start + .milliseconds(6500))) == [2: .accepted])
    }

    @Test("a close without an error-response re-sends what did not pass its quiet period, a bounded number of times")
    func closeWithoutErrorResponse() {
        var machine = drained(3, resends: 1)
        machine.written(1, count: 1, now: start)
        machine.written(1, count: 2, now: start + .milliseconds(600))
        let closed = machine.connectionClosed(1, now: start + .seconds(1))
        #expect(verdicts(closed) == [1: .accepted], "1 outlived its quiet period")
        #expect(Array(machine.pending) == [2, 3])

        _ = machine.connectionActive(2)
        _ = machine.drain(2, now: start)
        let closedAgain = machine.connectionClosed(2, now: start + .seconds(2))
        let got = verdicts(closedAgain)
        #expect(got.count == 2)
        for waiter in [2, 3] {
            guard case .notAnswered(let why)? = got[waiter] else {
                Issue.record("waiter \(waiter): \(String(describing: got[waiter]))")
                continue
            }
            #expect(why.contains("closed before the quiet period ended 2 times"))
        }
        #expect(machine.isIdle)
    }

    @Test("an error-response naming nothing in the window re-sends the whole window")
    func unattributed() {
        var machine = drained(3)
        let actions = machine.errorResponse(1, LegacyErrorResponse(status: .processingError, identifier: 999), now: start)
        #expect(actions.resumes.isEmpty)
        #expect(actions.unattributed == LegacyErrorResponse(status: .processingError, identifier: 999))
        #expect(Array(machine.pending) == [1, 2, 3])

        // Once the re-sends are used up, the verdict says what happened: not a closed connection.
        var exhausted = drained(1, resends: 0)
        let got = verdicts(exhausted.errorResponse(1, LegacyErrorResponse(status: .processingError, identifier: 999), now: start))
        guard case .notAnswered(let why)? = got[1] else {
            Issue.record("\(got)")
            return
        }
        #expect(why.contains("naming identifier 999, which was not in flight"), "\(why)")
    }

    @Test("a Shutdown naming the last notification confirmed re-sends the window without spending its re-sends; naming another, it counts")
    func shutdownNamingAConfirmedOne() {
        // Maintenance closes in a row must not use up a notification's re-sends.
        var machine = drained(1, resends: 0)
        machine.written(1, count: 1, now: start)
        #expect(verdicts(machine.tick(now: start + .seconds(2))) == [1: .accepted])
        enqueue(&machine, 2...3)
        _ = machine.drain(1, now: start + .seconds(2))
        let actions = machine.errorResponse(1, LegacyErrorResponse(status: LegacyErrorStatus(code: 10), identifier: 1), now: start + .seconds(2))
        #expect(actions.resumes.isEmpty, "\(verdicts(actions))")
        #expect(actions.unattributed == nil, "a gateway going away is not a gateway in trouble")
        #expect(Array(machine.pending) == [2, 3])

        // A Shutdown naming nothing this connection confirmed (a garbage identifier): the window's
        // fate is unknown, so re-sends count (none are left here) and the gateway is in trouble.
        var unknown = drained(2, resends: 0)
        let garbage = LegacyErrorResponse(status: LegacyErrorStatus(code: 10), identifier: 999)
        let got = unknown.errorResponse(1, garbage, now: start)
        #expect(got.unattributed == garbage)
        #expect(verdicts(got).count == 2, "re-sends used up")
    }

    @Test("the simple format can only blame a notification when it was alone in the window")
    func simpleFormat() {
        var machine = drained(1, identifies: false)
        let alone = machine.errorResponse(1, LegacyErrorResponse(status: .invalidToken, identifier: 0), now: start)
        #expect(verdicts(alone) == [1: .rejected(.invalidToken)])

        var crowded = drained(2, resends: 0, identifies: false)
        let got = verdicts(crowded.errorResponse(1, LegacyErrorResponse(status: .invalidToken, identifier: 0), now: start))
        guard case .notAnswered(let why)? = got[1] else {
            Issue.record("\(got)")
            return
        }
        #expect(why.contains("simple format carries no identifier"))

        // Alone in the window, but after another the quiet period confirmed: a late
        // error-response may be about that one, so this one is not blamed (its token would be
        // invalidated); it is written again instead.
        var late = self.machine(resends: 2, identifies: false)
        enqueue(&late, 1...1)
        _ = late.connectionActive(1)
        _ = late.drain(1, now: start)
        late.written(1, count: 1, now: start)
        enqueue(&late, 2...2)
        _ = late.drain(1, now: start + .milliseconds(600))
        late.written(1, count: 1, now: start + .milliseconds(600))
        #expect(verdicts(late.tick(now: start + .seconds(1))) == [1: .accepted])
        let afterConfirmed = late.errorResponse(1, LegacyErrorResponse(status: .invalidToken, identifier: 0), now: start + .milliseconds(1100))
        #expect(verdicts(afterConfirmed).isEmpty, "not rejected: \(verdicts(afterConfirmed))")
        #expect(Array(late.pending) == [2], "queued to be written again")

        // A "passed" status (10, shutdown) names no notification in this format: the one in the
        // window is written again, never rejected.
        var shutdown = drained(1, identifies: false)
        let answered = shutdown.errorResponse(1, LegacyErrorResponse(status: LegacyErrorStatus(code: 10), identifier: 0), now: start)
        #expect(answered.resumes.isEmpty)
        #expect(Array(shutdown.pending) == [1], "queued to be written again")
    }

    @Test("the window bounds what is written; the rest waits for room")
    func windowBound() {
        var machine = machine(window: 2)
        enqueue(&machine, 1...5)
        _ = machine.connectionActive(1)
        #expect(machine.drain(1, now: start).writes.count == 2)
        #expect(machine.pending.count == 3)
        machine.written(1, count: 2, now: start)
        let tick = machine.tick(now: start + .seconds(1))
        #expect(tick.resumes.count == 2)
        #expect(tick.drains == [1], "room again: another write pass")
        #expect(machine.drain(1, now: start).writes.count == 2)
    }

    @Test("deadlines: queued notifications are answered unsent; written ones keep their place in the window")
    func deadlines() {
        var machine = machine()
        let identifier = machine.takeIdentifier()
        _ = machine.enqueue(identifier: identifier, bytes: [1], deadline: start + .milliseconds(100), waiter: 1)
        let expired = verdicts(machine.tick(now: start + .milliseconds(100)))
        guard case .notAnswered(let why)? = expired[1] else {
            Issue.record("\(expired)")
            return
        }
        #expect(why.contains("no connection"))
        #expect(machine.isIdle)

        // Written with more than the quiet period left, but its bytes reached the socket late:
        // the deadline comes inside the quiet period.
        let second = machine.takeIdentifier()
        _ = machine.enqueue(identifier: second, bytes: [2], deadline: start + .milliseconds(1350), waiter: 2)
        let third = machine.takeIdentifier()
        _ = machine.enqueue(identifier: third, bytes: [3], deadline: start + .seconds(10), waiter: 3)
        _ = machine.connectionActive(1)
        #expect(machine.drain(1, now: start).writes == [[2], [3]])
        machine.written(1, count: 2, now: start + .milliseconds(400))
        #expect(machine.tick(now: start + .milliseconds(1360)).resumes.map(\.waiter) == [2])
        // The gateway then names the third: the second (already answered) counted as passed.
        let actions = machine.errorResponse(1, LegacyErrorResponse(status: .invalidToken, identifier: third), now: start + .milliseconds(1370))
        #expect(verdicts(actions) == [3: .rejected(.invalidToken)])
    }

    @Test("a write pass answers instead of writing what is past its send-by time or deadline, and writes again only in time")
    func sendBy() {
        var machine = machine()
        _ = machine.connectionActive(1)
        let late = machine.takeIdentifier()
        _ = machine.enqueue(identifier: late, bytes: [1], deadline: start + .seconds(10), sendBy: start + .milliseconds(50), waiter: 1)
        let overdue = machine.takeIdentifier()
        _ = machine.enqueue(identifier: overdue, bytes: [2], deadline: start + .milliseconds(60), waiter: 2)
        let inTime = machine.takeIdentifier()
        _ = machine.enqueue(identifier: inTime, bytes: [3], deadline: start + .seconds(10), sendBy: start + .seconds(1), waiter: 3)
        // Between ticks: the pass itself must not write the first two.
        let pass = machine.drain(1, now: start + .milliseconds(70))
        #expect(pass.writes == [[3]])
        let answered = verdicts(pass.actions)
        guard case .notAnswered(let first)? = answered[1], case .notAnswered(let second)? = answered[2] else {
            Issue.record("\(answered)")
            return
        }
        #expect(first.contains("send-by time") && first.contains("not sent"), "\(first)")
        #expect(second.contains("deadline passed before it could be written"), "\(second)")
        #expect(answered[3] == nil)

        // The connection closes inside the quiet period: it is not written again after its send-by.
        machine.written(1, count: 1, now: start + .milliseconds(70))
        _ = machine.connectionClosed(1, now: start + .milliseconds(100))
        _ = machine.connectionActive(2)
        let again = machine.drain(2, now: start + .seconds(2))
        #expect(again.writes.isEmpty)
        guard case .notAnswered(let why)? = verdicts(again.actions)[3] else {
            Issue.record("\(again.actions.resumes)")
            return
        }
        #expect(why.contains("may have been delivered"), "\(why)")
        #expect(machine.isIdle)
    }

    @Test("a notification whose deadline is nearer than the quiet period is answered unsent, not written (written, it could be confirmed too late and sent twice)")
    func deadlineInsideQuietPeriod() {
        var machine = machine()
        _ = machine.connectionActive(1)
        let near = machine.takeIdentifier()
        _ = machine.enqueue(identifier: near, bytes: [1], deadline: start + .milliseconds(900), waiter: 1)
        // Beyond the quiet period (1 s) but not by the time confirming takes: a tick (100 ms
        // here) and 100 ms for a write behind others.
        let barely = machine.takeIdentifier()
        _ = machine.enqueue(identifier: barely, bytes: [3], deadline: start + .milliseconds(1150), waiter: 3)
        let far = machine.takeIdentifier()
        _ = machine.enqueue(identifier: far, bytes: [2], deadline: start + .milliseconds(1250), waiter: 2)
        let pass = machine.drain(1, now: start)
        #expect(pass.writes == [[2]])
        for waiter in [1, 3] {
            guard case .notAnswered(let why)? = verdicts(pass.actions)[waiter] else {
                Issue.record("\(waiter): \(pass.actions.resumes)")
                return
            }
            #expect(why.contains("quiet period") && why.contains("not sent"), "\(why)")
        }
    }

    @Test("shutdown answers what was never written and takes nothing new")
    func shutdown() {
        var machine = machine()
        enqueue(&machine, 1...2)
        let actions = machine.shutdown()
        #expect(actions.resumes.map(\.waiter).sorted() == [1, 2])
        let late = machine.enqueue(identifier: machine.takeIdentifier(), bytes: [3], deadline: start + .seconds(1), waiter: 3)
        #expect(late.resumes.map(\.waiter) == [3])
    }

    @Test("legacy statuses map to the HTTP/2 API's status and reason")
    func mapping() {
        #expect(LegacyGatewayVerdict.accepted.attemptResult == .answered(status: 200, reason: nil))
        #expect(LegacyGatewayVerdict.rejected(.invalidToken).attemptResult == .answered(status: 400, reason: .badDeviceToken))
        #expect(LegacyGatewayVerdict.refused(.invalidPayloadSize, detail: "x").attemptResult == .answered(status: 413, reason: .payloadTooLarge))
        #expect(LegacyGatewayVerdict.rejected(.processingError).attemptResult == .answered(status: 500, reason: APNsReason(rawValue: "ProcessingError")))
        #expect(LegacyGatewayVerdict.rejected(.invalidTokenSize).attemptResult == .answered(status: 400, reason: APNsReason(rawValue: "InvalidTokenSize")))
        #expect(LegacyGatewayVerdict.rejected(.unknown).attemptResult == .answered(status: 500, reason: APNsReason(rawValue: "Unknown")))
        let policy = DeliveryPolicy()
        let decision = policy.after(attempt: 1, result: LegacyGatewayVerdict.rejected(.invalidToken).attemptResult, now: UnixMillis(0), deadline: nil, expiration: nil, jitter: 0)
        #expect(decision == .finish(.rejected, status: 400, reason: "BadDeviceToken"))
    }

    @Test("reconnect pacing: a burst at once, then one per interval; a quiet spell earns back the burst, no more")
    func reconnectPacing() {
        var pacer = ReconnectPacer(.init(burst: 3, interval: .milliseconds(100)))
        let start = ContinuousClock.now
        // Asked for all at once: three free, then each a further interval out.
        #expect((0..<5).map { _ in pacer.delay(now: start) } == [.zero, .zero, .zero, .milliseconds(100), .milliseconds(200)])
        // Asked for when the last paced one was due: the steady pace.
        #expect(pacer.delay(now: start + .milliseconds(200)) == .milliseconds(100))
        // After a long quiet spell the whole burst is back, and no more than it.
        let later = start + .seconds(60)
        #expect((0..<4).map { _ in pacer.delay(now: later) } == [.zero, .zero, .zero, .milliseconds(100)])
    }
}
