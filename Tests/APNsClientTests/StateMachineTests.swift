import APNsCore
import Testing

@testable import APNsClient

@Suite("Client state machines", .timeLimit(.minutes(1)))
struct StateMachineTests {
    @Test("The stream budget follows SETTINGS, the one-stream-first rule and GOAWAY")
    func streamBudget() {
        var budget = StreamBudget(localLimit: 500, tokenAuthentication: true)
        #expect(budget.limit == 0, "nothing before the server's SETTINGS")
        let r1 = budget.open()
        #expect(!r1)
        budget.settingsReceived(maxConcurrentStreams: 1000)
        #expect(budget.limit == 1, "token auth: one stream until a success")
        let r2 = budget.open()
        #expect(r2)
        let r3 = budget.open()
        #expect(!r3)
        budget.close(tokenAccepted: false)
        #expect(budget.limit == 1)
        let r4 = budget.open()
        #expect(r4)
        budget.close(tokenAccepted: true)
        #expect(budget.limit == 500, "the local cap applies once the token is accepted")
        budget.settingsReceived(maxConcurrentStreams: 2)
        #expect(budget.limit == 2)
        let r5 = budget.open()
        let r6 = budget.open()
        #expect(r5 && r6)
        let r7 = budget.open()
        #expect(!r7)
        budget.settingsReceived(maxConcurrentStreams: 1)
        #expect(budget.free == 0, "a dropped limit leaves in-flight streams alone but opens none")
        budget.close(tokenAccepted: true)
        #expect(budget.free == 0)
        budget.close(tokenAccepted: true)
        #expect(budget.free == 1)
        budget.goAwayReceived()
        #expect(budget.limit == 0 && !budget.isUsable)
    }

    @Test("Certificate auth uses the server's limit from the start")
    func certificateBudget() {
        var budget = StreamBudget(localLimit: 1000, tokenAuthentication: false)
        budget.settingsReceived(maxConcurrentStreams: 300)
        #expect(budget.limit == 300)
        budget.settingsReceived(maxConcurrentStreams: nil)
        #expect(budget.limit == 300, "SETTINGS without the field keeps the limit")
    }

    @Test("Answers that prove the provider token valid")
    func tokenProof() {
        #expect(StreamBudget.provesTokenValid(status: 200, reason: nil))
        #expect(StreamBudget.provesTokenValid(status: 410, reason: .unregistered))
        #expect(!StreamBudget.provesTokenValid(status: 403, reason: .expiredProviderToken))
        #expect(!StreamBudget.provesTokenValid(status: 400, reason: .badDeviceToken))
        #expect(!StreamBudget.provesTokenValid(status: 429, reason: .tooManyProviderTokenUpdates))
        #expect(StreamBudget.provesTokenValid(status: 429, reason: .tooManyRequests))
        // A front end may answer these before checking the token.
        #expect(!StreamBudget.provesTokenValid(status: 503, reason: .serviceUnavailable))
        #expect(!StreamBudget.provesTokenValid(status: 500, reason: .internalServerError))
        #expect(!StreamBudget.provesTokenValid(status: 413, reason: .payloadTooLarge))
    }

    @Test("Tokens are minted first, kept under the refresh age, replaced at it")
    func tokenSchedule() {
        var schedule = ProviderTokenSchedule(refreshAge: 50 * 60)
        #expect(schedule.decide(at: 1000) == .mint)
        schedule.minted(at: 1000)
        #expect(schedule.decide(at: 1000 + 49 * 60) == .keep)
        #expect(schedule.decide(at: 1000 + 50 * 60) == .mint)
        #expect(schedule.decide(at: 500) == .keep, "a clock going backwards never causes a change")
    }

    @Test("The refresh age is clamped to 21…55 minutes: a margin on both sides of APNs's 20 and 60")
    func tokenAgeClamp() {
        #expect(ProviderTokenSchedule(refreshAge: 60).refreshAge == 21 * 60)
        #expect(ProviderTokenSchedule(refreshAge: 2 * 3600).refreshAge == 55 * 60)
        var schedule = ProviderTokenSchedule(refreshAge: 0)
        schedule.minted(at: 0)
        // Whole seconds, truncated: 20 × 60 on this clock may be a second short of 20 minutes.
        #expect(schedule.decide(at: 20 * 60) == .keep, "never more often than every 20 minutes")
        #expect(schedule.decide(at: 21 * 60) != .keep)
    }

    @Test("Repeated token rejections become a configuration error once")
    func tokenRejections() {
        var tracker = TokenRejectionTracker(threshold: 2)
        let r8 = tracker.rejected(connection: 1)
        #expect(r8 == .replaceConnection)
        let r9 = tracker.rejected(connection: 1)
        #expect(r9 == .none, "one connection's burst counts once")
        let r10 = tracker.rejected(connection: 2)
        #expect(r10 == .replaceConnectionAndReport(consecutive: 2))
        #expect(tracker.isFailing)
        let r11 = tracker.rejected(connection: 3)
        #expect(r11 == .replaceConnection, "reported once")
        tracker.accepted()
        #expect(!tracker.isFailing && tracker.consecutive == 0)
        let r12 = tracker.rejected(connection: 4)
        #expect(r12 == .replaceConnection)
        // A connection replaced before the success, still draining, answers its last requests
        // with the same rejection: it was already told to go, and its token was not a fresh one.
        #expect(tracker.rejected(connection: 3) == .none)
        #expect(tracker.consecutive == 1)
        // Once it closed, its id could only come back as a new connection's.
        tracker.connectionGone(3)
        #expect(tracker.rejected(connection: 3) == .replaceConnectionAndReport(consecutive: 2))
    }

    @Test("Backoff grows exponentially with jitter, is capped and resets")
    func backoff() {
        var backoff = ReconnectBackoff(base: .milliseconds(100), maximum: .seconds(1))
        let r13 = backoff.nextDelay(jitter: 1)
        #expect(r13 == .milliseconds(100))
        let r14 = backoff.nextDelay(jitter: 1)
        #expect(r14 == .milliseconds(200))
        let r15 = backoff.nextDelay(jitter: 0)
        #expect(r15 == .milliseconds(200))
        for _ in 0..<10 { _ = backoff.nextDelay(jitter: 1) }
        let r16 = backoff.nextDelay(jitter: 1)
        #expect(r16 == .seconds(1))
        let r17 = backoff.nextDelay(jitter: 0)
        #expect(r17 == .milliseconds(500))
        backoff.reset()
        let r18 = backoff.nextDelay(jitter: 1)
        #expect(r18 == .milliseconds(100))
    }

    @Test("Work goes to the connection with the most free streams; waiters are served FIFO")
    func assignment() {
        var pool = PoolAssignment<String>()
        let r19 = pool.acquire()
        #expect(r19 == nil)
        pool.add(connection: 1, budget: StreamBudget(localLimit: 10, tokenAuthentication: false))
        pool.add(connection: 2, budget: StreamBudget(localLimit: 10, tokenAuthentication: false))
        _ = pool.update(connection: 1) { $0.settingsReceived(maxConcurrentStreams: 3) }
        _ = pool.update(connection: 2) { $0.settingsReceived(maxConcurrentStreams: 1) }
        // Connection 2 is throttled (limit 1): it gets one of four.
        var taken: [UInt64] = []
        while let id = pool.acquire() { taken.append(id) }
        #expect(taken.sorted() == [1, 1, 1, 2])
        let first = pool.enqueue("first")
        let second = pool.enqueue("second")
        _ = pool.enqueue("third")
        let r20 = pool.cancel(ticket: second)
        #expect(r20 == "second")
        let served = pool.update(connection: 1) { $0.close(tokenAccepted: true) }
        #expect(served.map(\.waiter) == ["first"])
        let r21 = pool.cancel(ticket: first)
        #expect(r21 == nil, "a served waiter cannot be cancelled")
        let raised = pool.update(connection: 2) { $0.settingsReceived(maxConcurrentStreams: 5) }
        #expect(raised.map(\.waiter) == ["third"] && raised.map(\.connection) == [2])
        #expect(pool.waiterCount == 0)
        _ = pool.enqueue("late")
        let r22 = pool.shutdown()
        #expect(r22 == ["late"])
        let r23 = pool.acquire()
        #expect(r23 == nil)
    }

    @Test("Waiters past their deadline are given up in one sweep, oldest first; the rest keep their place")
    func waiterDeadlines() {
        var pool = PoolAssignment<String>()
        pool.add(connection: 1, budget: StreamBudget(localLimit: 1, tokenAuthentication: false))
        _ = pool.update(connection: 1) { $0.settingsReceived(maxConcurrentStreams: 1) }
        let r1 = pool.acquire()
        #expect(r1 == 1)
        pool.enqueue("patient", deadline: 500)
        pool.enqueue("hasty", deadline: 100)
        pool.enqueue("hastier", deadline: 50)
        let early = pool.expire(now: 10)
        #expect(early.isEmpty)
        let expired = pool.expire(now: 100)
        #expect(expired == ["hasty", "hastier"], "oldest first")
        #expect(pool.waiterCount == 1)
        let served = pool.update(connection: 1) { $0.close(tokenAccepted: true) }
        #expect(served.map(\.waiter) == ["patient"])
        let none = pool.expire(now: 1_000)
        #expect(none.isEmpty, "a served waiter is not given up")
    }

    @Test("Waiters that give up leave nothing behind, however long streams stay stuck")
    func givenUpWaitersDoNotAccumulate() {
        var pool = PoolAssignment<Int>()
        pool.add(connection: 1, budget: StreamBudget(localLimit: 1, tokenAuthentication: false))
        _ = pool.update(connection: 1) { $0.settingsReceived(maxConcurrentStreams: 1) }
        #expect(pool.acquire() == 1)
        // The one stream never frees: every waiter times out, one sweep after another, and one
        // patient waiter stays throughout.
        pool.enqueue(-1, deadline: .max)
        for round in 0..<200 {
            for index in 0..<100 { pool.enqueue(round * 100 + index, deadline: UInt64(round)) }
            #expect(pool.expire(now: UInt64(round)).count == 100)
            if round.isMultiple(of: 2) { _ = pool.cancel(ticket: pool.enqueue(0)) }
        }
        #expect(pool.waiterCount == 1)
        #expect(pool.ticketsQueued < 2_000, "\(pool.ticketsQueued) tickets kept for one waiter")
        let served = pool.update(connection: 1) { $0.close(tokenAccepted: true) }
        #expect(served.map(\.waiter) == [-1], "the patient waiter keeps its place")
    }
}
