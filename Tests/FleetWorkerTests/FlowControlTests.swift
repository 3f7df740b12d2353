import APNsCore
import KafkaTransport
import Logging
import Synchronization
import Testing

@testable import FleetWorker

/// The back-pressure decision and the in-flight bound, without Kafka.
@Suite("Flow control")
struct FlowControlTests {
    @Test("pauses at the high watermark, stays paused down to the low one, then resumes once")
    func hysteresis() {
        var gate = WatermarkGate(capacity: 100)
        #expect(gate.high == 90 && gate.low == 50)
        var actions: [WatermarkGate.Action?] = []
        for inUse in [10, 89, 90, 100, 95, 60, 51, 50, 49, 70, 89, 90] {
            actions.append(gate.update(inUse: inUse))
        }
        #expect(actions == [nil, nil, .pause, nil, nil, nil, nil, .resume, nil, nil, nil, .pause])
        #expect(gate.paused)
    }

    @Test("tiny bounds still have a low watermark below the high one")
    func tinyBounds() {
        var one = WatermarkGate(capacity: 1)
        #expect(one.high == 1 && one.low == 0)
        #expect(one.update(inUse: 1) == .pause)
        #expect(one.update(inUse: 0) == .resume)
        let odd = WatermarkGate(high: 5, low: 9)
        #expect(odd.low < odd.high)
    }

    @Test("the limiter reports crossings in order, and only crossings")
    func limiterReportsCrossings() async {
        let seen = Mutex<[WatermarkGate.Action]>([])
        let limiter = InFlightLimiter(capacity: 10) { action, _ in seen.withLock { $0.append(action) } }
        for _ in 0..<8 { await limiter.acquire(1) }
        #expect(seen.withLock { $0 }.isEmpty)
        await limiter.acquire(1)  // 9 of 10: the high watermark
        #expect(seen.withLock { $0 } == [.pause])
        for _ in 0..<3 { limiter.release(1) }  // 6
        #expect(seen.withLock { $0 } == [.pause])
        limiter.release(1)  // 5: the low watermark
        #expect(seen.withLock { $0 } == [.pause, .resume])
        for _ in 0..<5 { limiter.release(1) }
        #expect(limiter.inUse == 0)
        await limiter.acquire(50)  // a job larger than the bound runs alone, at the bound
        #expect(limiter.inUse == 10)
        limiter.release(50)
        #expect(seen.withLock { $0 } == [.pause, .resume, .pause, .resume])
        #expect(limiter.inUse == 0)
    }

    @Test("at the bound, a waiting acquire wakes once a batch of slots is free, not for each one", .timeLimit(.minutes(1)))
    func limiterWakesInBatches() async throws {
        let limiter = InFlightLimiter(capacity: 64)
        #expect(limiter.wakeBatch == 4)
        await limiter.acquire(64)
        let waiter = Task { await limiter.acquire(1) }
        while limiter.queuedAcquires == 0 { try await Task.sleep(for: .milliseconds(5)) }
        for _ in 0..<3 { limiter.release(1) }
        try await Task.sleep(for: .milliseconds(50))
        #expect(limiter.inUse == 61, "3 free slots must not wake the waiter (it would take one: 62)")
        limiter.release(1)
        await waiter.value
        #expect(limiter.inUse == 61, "the waiter woke with 4 free and took one")
        limiter.release(61)
        #expect(limiter.inUse == 0)
    }

    @Test("an interruptible acquire gives up on interrupt (or if already told to), taking nothing; others keep waiting", .timeLimit(.minutes(1)))
    func interruptibleAcquire() async throws {
        let limiter = InFlightLimiter(capacity: 4)
        await limiter.acquire(4)
        let alreadyInterrupted = await limiter.acquire(1, unless: { true })
        #expect(!alreadyInterrupted, "gives up at once instead of waiting")
        let interruptible = Task { await limiter.acquire(1, unless: { false }) }
        let plain = Task { await limiter.acquire(1) }
        while limiter.queuedAcquires < 2 { try await Task.sleep(for: .milliseconds(5)) }
        limiter.interrupt()
        let took = await interruptible.value
        #expect(!took)
        #expect(limiter.queuedAcquires == 1 && limiter.inUse == 4, "the plain acquire still waits; nothing was taken")
        limiter.release(1)
        await plain.value
        #expect(limiter.inUse == 4)
        limiter.release(4)
        #expect(await limiter.acquire(2, unless: { true }), "free slots are taken whatever the condition")
    }

    @Test("waiting for an empty limiter ends when the last slot is released, or when cancelled", .timeLimit(.minutes(1)))
    func waitUntilIdle() async throws {
        let limiter = InFlightLimiter(capacity: 10)
        await limiter.waitUntilIdle()  // nothing in flight: returns at once
        await limiter.acquire(3)
        let released = Task { await limiter.waitUntilIdle() }
        let cancelled = Task { await limiter.waitUntilIdle() }
        try await Task.sleep(for: .milliseconds(50))
        // A shutdown that cancels the wait must not hang on work that never finishes.
        cancelled.cancel()
        await cancelled.value
        #expect(limiter.inUse == 3)
        limiter.release(2)
        limiter.release(1)
        await released.value
        #expect(limiter.inUse == 0)
    }

    @Test("a waiting retry record wakes when due, or at once when its partition is handed back")
    func retryWaits() async {
        let waits = RetryWaits()
        let clock = ContinuousClock()
        let started = clock.now
        #expect(await waits.wait(partition: .init(topic: "r", partition: 0), milliseconds: 50) { nil } == .due)
        #expect(clock.now - started >= .milliseconds(50))

        let early = clock.now
        async let woken = waits.wait(partition: .init(topic: "r", partition: 1), milliseconds: 60_000) { nil }
        async let other = waits.wait(partition: .init(topic: "r", partition: 2), milliseconds: 100) { nil }
        while waits.count < 2 { try? await Task.sleep(for: .milliseconds(5)) }
        waits.handBack([.init(topic: "r", partition: 1)])
        #expect(await woken == .handBack)
        #expect(await other == .due)
        #expect(clock.now - early < .seconds(10))
        #expect(waits.count == 0)

        // A wait that begins after its partition's hand-back (the record was still in a batch
        // then) is handed back at once, not left to hold up the revocation's drain for a minute.
        let late = clock.now
        #expect(await waits.wait(partition: .init(topic: "r", partition: 1), milliseconds: 60_000) { .handBack } == .handBack)
        #expect(clock.now - late < .seconds(10))
        #expect(waits.count == 0)

        // A partition lost just before the wait began: dropped at once, not paused for a minute.
        let lost = clock.now
        #expect(await waits.wait(partition: .init(topic: "r", partition: 3), milliseconds: 60_000) { .dropped } == .dropped)
        #expect(clock.now - lost < .seconds(10))
        #expect(waits.count == 0)
    }

    @Test("a flood of one warning: the first lines of each interval go out, the next one says how many were left out")
    func logThrottle() {
        let start = ContinuousClock.now
        let throttle = LogThrottle(burst: 3, interval: .seconds(10), now: start)
        let first = (0..<10).map { throttle.admit(now: start + .milliseconds($0)) }
        #expect(first.map(\.log) == [true, true, true] + Array(repeating: false, count: 7))
        #expect(first.allSatisfy { $0.leftOut == 0 })
        // The next interval: lines go out again, the first one carrying the count.
        let next = throttle.admit(now: start + .seconds(10))
        #expect(next.log && next.leftOut == 7)
        #expect(next.metadata["log.left_out"] == "7")
        let after = throttle.admit(now: start + .seconds(11))
        #expect(after.log && after.leftOut == 0 && after.metadata.isEmpty)
    }

    @Test("a waiting retry record takes slots for the tokens it names, not for every token of its job")
    func retryRecordWeight() {
        func record(_ value: String, _ headers: [RecordHeader] = []) -> KafkaRecord {
            KafkaRecord(topic: "apns.jobs.retry", partition: 0, offset: 0, key: nil, value: Array(value.utf8), headers: headers, timestamp: nil, assignmentEpoch: 1)
        }
        let job = #"{"tokens":["aa","bb","cc","dd","ee"],"payload":{}}"#
        #expect(PushWorker.weight(of: record(job)) == 5)
        #expect(PushWorker.weight(of: record(job, [RecordHeader("retry-tokens", "bb,dd")])) == 2)
        #expect(PushWorker.weight(of: record(job, [RecordHeader("retry-tokens", "cc")])) == 1)
        #expect(PushWorker.weight(of: record(#"{"token":"aa","payload":{}}"#)) == 1)
    }
}
