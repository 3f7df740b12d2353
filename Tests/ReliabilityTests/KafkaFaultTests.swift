import FleetTestSupport
import Foundation
import Testing

/// Kafka faults through kafka-dev's console while jobs flow through two workers: a broker down and
/// back up, leadership moved for every partition, and failed Produce, Fetch and OffsetCommit
/// requests. Three brokers, every topic replicated three times.
@Suite("Reliability: Kafka faults", .timeLimit(.minutes(10)))
struct KafkaFaultTests {
    @Test("broker down/up, leader changes, Produce/Fetch/OffsetCommit errors: nothing lost")
    func kafkaFaults() async throws {
        let scale = RunScale.current
        var figures = ReliabilityFigures(suite: "kafka-faults")
        let began = ContinuousClock.now
        for run in 1...scale.runs {
            var options = ReliabilityFleet.Options(name: "kafka")
            options.brokers = 3
            options.replicationFactor = 3
            options.seed = RunScale.seed &+ 100 &+ UInt64(run)
            let injected = Shared<[String]>([])
            let recoveries = Shared<[Int64]>([])
            let outcome = try await ReliabilityFleet.run(options) { fleet in
                try await fleet.runUnderFaults(rate: scale.rate, limit: 50_000) { fleet in
                    for round in 0..<scale.faultRounds {
                        let broker: Int = 1 + round % 3
                        let partitions = fleet.options.partitions
                        // Each step: inject, then wait until every partition is served again.
                        func step(_ name: String, _ commands: [String], window: Duration? = nil, then restore: [String] = []) async throws {
                            for command in commands { try await fleet.kafkaCommand(command) }
                            // A fault that lasts: its length is part of the fault, not a synchronisation.
                            if let window { try await Task.sleep(for: window) }
                            for command in restore { try await fleet.kafkaCommand(command) }
                            let since = ReliabilityFleet.nowMillis()
                            recoveries.update { $0.append(0) }
                            let recovery = try await fleet.waitForEveryPartitionServed(after: since, timeout: 60, what: name)
                            recoveries.update { $0[$0.count - 1] = recovery }
                            injected.update { $0.append(name) }
                        }
                        try await step("broker \(broker) down 2 s, then up", ["broker-down \(broker)"], window: .seconds(2), then: ["broker-up \(broker)"])
                        // Every partition of the jobs and results topics gets a new leader.
                        var moves: [String] = []
                        for partition in 0..<partitions {
                            let jobsLeader: Int = 1 + (partition + round + 1) % 3
                            let resultsLeader: Int = 1 + (partition + round + 2) % 3
                            moves.append("leader apns.jobs \(partition) \(jobsLeader)")
                            moves.append("leader apns.results \(partition) \(resultsLeader)")
                        }
                        try await step("leader change (every partition of apns.jobs and apns.results)", moves)
                        try await step("Produce errors (NOT_LEADER_FOR_PARTITION ×3, REQUEST_TIMED_OUT ×2)", [
                            "request-errors Produce 3 NOT_LEADER_FOR_PARTITION", "request-errors Produce 2 REQUEST_TIMED_OUT",
                        ])
                        try await step("Fetch errors (NOT_LEADER_FOR_PARTITION ×5)", ["request-errors Fetch 5 NOT_LEADER_FOR_PARTITION"])
                        try await step("OffsetCommit errors (NOT_COORDINATOR ×3, REQUEST_TIMED_OUT ×2)", [
                            "request-errors OffsetCommit 3 NOT_COORDINATOR", "request-errors OffsetCommit 2 REQUEST_TIMED_OUT",
                        ])
                    }
                }
            }
            outcome.expectNothingLost()
            figures.add(outcome, recoveries: recoveries.value, faults: injected.value)
        }
        figures.seconds = (ContinuousClock.now - began).secondsValue
        #expect(figures.peakWorkerRSSMB < 1024, "worker peak RSS \(figures.peakWorkerRSSMB) MB")
        figures.report()
    }
}
