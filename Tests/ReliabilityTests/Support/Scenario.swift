import FleetLoad
import FleetTestSupport
import Foundation
import Testing

/// What one run of a fleet under faults came to, judged by what a user would notice.
struct RunOutcome: Sendable {
    var jobs: Int
    var notifications: Int
    var lost: Int
    var duplicates: Int
    /// When the redone work was first done, one entry per duplicate (the worker's clock, ms).
    var duplicatedWorkDoneAtMs: [Int64]
    var wrongOutcomes: Int
    var wrongExamples: [String]
    var deliveredButAbsent: Int
    var deadLetters: Int
    var unusableJobs: Int
    var exitStatuses: [String: Int32]
    var publishFailures: [String]
    var peakWorkerRSSMB: Double
}

extension ReliabilityFleet {
    /// Publishes jobs at `rate` while `faults` runs (after every partition is being served), then
    /// lets every job finish, stops the workers with SIGTERM, reads the results topic to its end
    /// and counts: jobs, notifications, lost, duplicates and wrong outcomes.
    func runUnderFaults(rate: Double, limit: Int, faults: @Sendable (ReliabilityFleet) async throws -> Void) async throws -> RunOutcome {
        let stop = Shared(false)
        let sent = try await withThrowingTaskGroup(of: Int.self) { group in
            group.addTask { try await self.publish(rate: rate, limit: limit, stop: stop) }
            do {
                let start = Self.nowMillis()
                _ = try await waitForEveryPartitionServed(after: start, timeout: 60, what: "the start")
                try await faults(self)
                // A little more work after the last fault, so that recovery is shown on fresh jobs.
                let end = Self.nowMillis()
                _ = try await waitForEveryPartitionServed(after: end, timeout: 60, what: "the last fault")
            } catch {
                stop.update { $0 = true }
                throw error
            }
            stop.update { $0 = true }
            return try await group.next() ?? 0
        }
        note("published \(sent) jobs")
        try await waitForAllResults(published: sent, timeout: 120)
        let statuses = try await stopWorkers()
        try await readEverything(timeout: 30)
        let snapshot = tally.snapshot
        let unusable = snapshot.jobsByKind.filter { $0.key.isUnusable }.reduce(0) { $0 + $1.value }
        return RunOutcome(
            jobs: snapshot.jobsRegistered,
            notifications: snapshot.notificationsExpected,
            lost: snapshot.notificationsExpected - snapshot.notificationsSeen,
            duplicates: snapshot.duplicates,
            duplicatedWorkDoneAtMs: snapshot.duplicatedWorkDoneAtMs,
            wrongOutcomes: snapshot.mismatches,
            wrongExamples: snapshot.mismatchExamples,
            deliveredButAbsent: unplaced.neverSeen.count,
            deadLetters: snapshot.deadLetters,
            unusableJobs: unusable,
            exitStatuses: statuses,
            publishFailures: publishFailures.value,
            peakWorkerRSSMB: peakWorkerRSSMegabytes
        )
    }
}

extension RunOutcome {
    /// The checks every suite makes: nothing lost, every outcome right, the DLQ complete, every
    /// worker drained cleanly at the end.
    func expectNothingLost(sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(jobs > 0, "jobs were published", sourceLocation: sourceLocation)
        #expect(lost == 0, "\(lost) notifications have no result", sourceLocation: sourceLocation)
        #expect(wrongOutcomes == 0, "\(wrongOutcomes) wrong outcomes, e.g. \(wrongExamples)", sourceLocation: sourceLocation)
        #expect(deadLetters >= unusableJobs, "DLQ copies: \(deadLetters) of \(unusableJobs) unusable jobs", sourceLocation: sourceLocation)
        #expect(exitStatuses.values.allSatisfy { $0 == 0 }, "SIGTERM drains and exits 0: \(exitStatuses)", sourceLocation: sourceLocation)
        #expect(publishFailures.isEmpty, "Kafka refused jobs: \(publishFailures.prefix(3))", sourceLocation: sourceLocation)
    }
}

extension Duration {
    var secondsValue: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
