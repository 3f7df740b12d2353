import APNsCore
import FleetLoad
import KafkaTransport
import Testing

@Suite("Job generator and run tally")
struct JobGeneratorTests {
    @Test("every generated job decodes as its kind says, or is refused when it should be")
    func kindsDecode() throws {
        var generator = JobGenerator(mix: .realistic, topic: "com.example.app", app: "demo", fanoutSize: 5, deadTokenCount: 3, idPrefix: "t")
        let decoder = JobDecoder()
        var seen = Set<JobMix.Kind>()
        for _ in 0..<2000 {
            let job = generator.next(now: 1_000)
            seen.insert(job.kind)
            let decoded = try? decoder.decode(value: job.value, headers: job.headers)
            switch job.kind {
            case .good, .headers, .unregistered, .unknownApp:
                #expect(decoded?.tokens.count == 1, "\(job.kind)")
            case .fanout:
                #expect(decoded?.tokens.count == 5)
                #expect(job.expected.filter { $0.outcome == "delivered" }.count == 4)
            case .badToken, .malformed:
                #expect(decoded == nil, "\(job.kind) must not decode")
            case .oversize:
                #expect(job.value.count > 4096)
            }
            if job.kind != .malformed, job.kind != .headers {
                #expect(decoded == nil || decoded?.id == job.id)
            }
        }
        #expect(seen == Set(JobMix.Kind.allCases), "the realistic mix makes every kind")
        #expect(generator.usedDeadTokens.isSubset(of: Set(generator.deadTokens)))
    }

    @Test("with a few real tokens given, a fan-out job still names each token once, so its run can complete")
    func fanoutWithFixedTokens() throws {
        let real = [String(repeating: "a", count: 64), String(repeating: "b", count: 64), String(repeating: "a", count: 64)]
        var generator = JobGenerator(mix: try JobMix(parsing: "fanout=1"), topic: "t", fanoutSize: 10, fixedTokens: real)
        let tally = RunTally(idPrefix: "job")
        for _ in 0..<20 {
            let job = generator.next(now: 1_000)
            let tokens = job.expected.map(\.token)
            #expect(Set(tokens).count == tokens.count, "\(tokens)")
            #expect(tokens.count == 3, "two distinct real tokens and a dead one")
            tally.expect(jobID: job.id, tokens: job.expected, kind: job.kind)
        }
        #expect(tally.snapshot.notificationsExpected == 60)
    }

    @Test("the same seed makes the same jobs")
    func repeatable() {
        var first = JobGenerator(mix: .realistic, topic: "t", seed: 7)
        var second = JobGenerator(mix: .realistic, topic: "t", seed: 7)
        for _ in 0..<100 {
            #expect(first.next(now: 5).value == second.next(now: 5).value)
        }
    }

    @Test("a mix that is not kind=weight is refused with the part named")
    func badMix() {
        #expect(throws: JobMixError.self) { try JobMix(parsing: "good=1,bogus=2") }
        #expect(throws: JobMixError.self) { try JobMix(parsing: "good=-1") }
        #expect(throws: JobMixError.self) { try JobMix(parsing: "good=0") }
        // Weights whose total would overflow when drawing (it crashed the generator).
        #expect(throws: JobMixError.self) { try JobMix(parsing: "good=9223372036854775807,fanout=1") }
        #expect((try? JobMix(parsing: "good=3, fanout=1"))?.description == "good=3,fanout=1")
        #expect((try? JobMix(parsing: "good=1000000,fanout=1000000"))?.description == "good=1000000,fanout=1000000")
    }

    @Test("a DLQ copy read twice (redelivered after a rebalance) counts as one job; copies of two jobs as two")
    func deadLettersDistinctBySource() {
        let tally = RunTally(idPrefix: "t-")
        tally.recordDeadLetter(source: "apns.jobs-0-7")
        tally.recordDeadLetter(source: "apns.jobs-0-7")
        tally.recordDeadLetter(source: "apns.jobs-1-3")
        #expect(tally.snapshot.deadLetters == 2)
        #expect(tally.snapshot.deadLetterCopies == 3)
    }

    @Test("the tally counts records the reader never saw: gaps in a partition's offsets")
    func skippedRecords() {
        let tally = RunTally(idPrefix: "run")
        func records(_ partition: Int32, _ offsets: [Int64]) -> [KafkaRecord] {
            offsets.map { KafkaRecord(topic: "apns.results", partition: partition, offset: $0, key: nil, value: [], headers: [], timestamp: nil, assignmentEpoch: 1) }
        }
        // The first record of a partition is where the reader starts, whatever its offset.
        tally.noteRead(records(0, [500, 501, 502]) + records(1, [0, 1]), topic: "apns.results")
        tally.noteRead(records(1, [2, 3]), topic: "apns.results")
        #expect(tally.snapshot.recordsSkipped == 0)
        // kafka-dev dropped 503..<900 before the reader got there.
        tally.noteRead(records(0, [900, 901]), topic: "apns.results")
        // Other topics are not followed (a compacted one has gaps by design).
        tally.noteRead(records(0, [5000]), topic: "apns.token-events")
        #expect(tally.snapshot.recordsSkipped == 397)
        #expect(RunTally.skippedRecordsMessage(397).contains("lower --jobs or --rate"))
    }

    @Test("the tally matches results to expectations, counts duplicates and mismatches")
    func tally() {
        let tally = RunTally(idPrefix: "run")
        let token = String(repeating: "a", count: 64)
        func result(_ job: String, _ outcome: Outcome, status: Int? = nil, reason: String? = nil, token: String = token, sentAt: Int64 = 150) -> NotificationResult {
            NotificationResult(
                jobID: job, token: token, topic: "t", app: "a", outcome: outcome, status: status, reason: reason,
                attempts: 1, latencyMs: 1, sentAt: UnixMillis(sentAt), worker: "w",
                meta: RawJSON(#"{"published_at":100}"#), source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 0)
            )
        }
        // A result that arrives before its job is registered waits for it.
        tally.record(result("run-2", .rejected, status: 410, reason: "Unregistered"), derivedIDPrefix: "apns.jobs-")
        tally.expect(jobID: "run-1", tokens: [(token, "delivered")])
        tally.expect(jobID: "run-2", tokens: [(token, "rejected/410/Unregistered")])
        tally.record(result("run-1", .delivered, status: 200), derivedIDPrefix: "apns.jobs-")
        tally.record(result("run-1", .delivered, status: 200, sentAt: 900), derivedIDPrefix: "apns.jobs-")
        tally.record(result("other-9", .delivered, status: 200), derivedIDPrefix: "apns.jobs-")
        var snapshot = tally.snapshot
        #expect(snapshot.isComplete && snapshot.jobsComplete == 2)
        #expect(snapshot.duplicates == 1 && snapshot.mismatches == 0)
        #expect(snapshot.duplicatedWorkDoneAtMs == [150], "a duplicate is dated by the work it redid")
        #expect(snapshot.outcomes == ["delivered": 1, "rejected/410/Unregistered": 1])
        #expect(snapshot.latenciesMs == [50, 50])
        #expect(snapshot.timings.map(\.sentAtMs) == [150, 150], "first results only")

        tally.expect(jobID: "run-3", tokens: [(token, "delivered")])
        tally.record(result("run-3", .failed, status: 503, reason: "ServiceUnavailable (gave up after 8 attempts)"), derivedIDPrefix: "apns.jobs-")
        snapshot = tally.snapshot
        #expect(snapshot.mismatches == 1)
        #expect(snapshot.mismatchExamples.first == "job run-3: expected delivered, got failed/503/ServiceUnavailable")
    }
}
