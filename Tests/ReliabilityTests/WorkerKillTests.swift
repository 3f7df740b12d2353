import APNsCore
import FleetTestSupport
import Foundation
import Testing

/// Two workers; one of them is killed with SIGKILL at seeded random moments and restarted, several
/// times, while jobs flow. At-least-once means: no token of any job without a result, and only
/// work done around a kill is ever done twice.
@Suite("Reliability: worker kills", .timeLimit(.minutes(20)))
struct WorkerKillTests {
    @Test("SIGKILL a worker at random moments and restart it: nothing lost, only work done around a kill is redone")
    func killAndRestart() async throws {
        let scale = RunScale.current
        var figures = ReliabilityFigures(suite: "worker-kills")
        let began = ContinuousClock.now
        var random = SplitMix64(seed: RunScale.seed)
        print("reliability[worker-kills]: seed \(RunScale.seed) (APNS_FLEET_RELIABILITY_SEED repeats it)")
        for run in 1...scale.runs {
            var options = ReliabilityFleet.Options(name: "kills")
            options.maxInFlight = 64
            options.seed = RunScale.seed &+ UInt64(run)
            let killCount = scale.killsPerRun
            // The moments, decided up front from the seed so that a run can be repeated. Each kill
            // comes a few seconds after the previous recovery, so that some work is done in steady
            // state, outside every kill's window (see `disruption`), where it must not be redone.
            var plan: [KillPlan] = []
            for _ in 0..<killCount {
                let victim = "w\(random.next(in: 1...2))"
                plan.append(KillPlan(victim: victim, after: random.next(in: 6_000...8_000), downFor: random.next(in: 0...1_500)))
            }
            let kills = plan
            let recoveries = Shared<[Int64]>([])
            let disruptions = Shared<[ClosedRange<Int64>]>([])
            let outcome = try await ReliabilityFleet.run(options) { fleet in
                try await fleet.runUnderFaults(rate: scale.rate, limit: 50_000) { fleet in
                    for (index, kill) in kills.enumerated() {
                        try await Task.sleep(for: .milliseconds(kill.after))  // a random moment, not a synchronisation
                        let killedAt = try await fleet.kill(kill.victim)
                        print("reliability[worker-kills]: run \(run) kill \(index + 1)/\(kills.count): SIGKILL \(kill.victim), restart after \(kill.downFor) ms")
                        try await Task.sleep(for: .milliseconds(kill.downFor))  // how long the worker stays dead
                        try fleet.startWorker(kill.victim)
                        // Recovered: every partition (the killed worker's too) has fresh results, and
                        // the restarted worker has taken part in a rebalance and got partitions.
                        let recovery = try await fleet.waitForEveryPartitionServed(after: killedAt, timeout: 60, what: "SIGKILL \(kill.victim)")
                        try await fleet.waitForAssignments(timeout: 60)
                        recoveries.update { $0.append(recovery) }
                        disruptions.update { $0.append(Self.disruption(killedAt: killedAt, settledAt: ReliabilityFleet.nowMillis())) }
                    }
                }
            }
            outcome.expectNothingLost()
            // Work finished in steady state is committed and never redone; a fleet that lost its
            // commits would redo it after the next rebalance.
            let windows = disruptions.value
            let unexplained = outcome.duplicatedWorkDoneAtMs.filter { doneAt in !windows.contains { $0.contains(doneAt) } }
            let origin = windows.first?.lowerBound ?? 0
            let outside = unexplained.count
            #expect(
                outside == 0,
                "\(outside) of \(outcome.duplicates) duplicates redo work done outside every kill's window: windows \(windows.map { "\($0.lowerBound - origin)…\($0.upperBound - origin)" }) ms, work done at \(unexplained.prefix(5).map { $0 - origin }) ms"
            )
            print("reliability[worker-kills]: run \(run): \(outcome.duplicates) duplicates, \(outside) of them outside the kills' windows")
            figures.add(outcome)
            figures.kills += kills.count
            figures.faultsInjected += kills.count
            figures.recoveryMs += recoveries.value
        }
        figures.faults = ["SIGKILL worker + restart"]
        figures.seconds = (ContinuousClock.now - began).secondsValue
        #expect(figures.peakWorkerRSSMB < 1024, "worker peak RSS \(figures.peakWorkerRSSMB) MB")
        figures.report()
    }
}

extension WorkerKillTests {
    /// When work may be redone because of a kill (ms since the epoch, the workers' clock):
    /// - from a little before it: the killed worker's results not yet committed (the commit
    ///   interval is 100 ms; 2 s leaves room for a loaded machine);
    /// - until the group has settled: the dead member leaves only when its session times out, and
    ///   each rebalance on the way (the restart joining, the dead member leaving) moves partitions
    ///   while the mock cluster refuses commits (REBALANCE_IN_PROGRESS, for up to a session
    ///   timeout), so what was done in the meantime is done again by the partitions' next owner.
    ///   `settledAt` comes after the last of those rebalances (both workers have been assigned and
    ///   every partition served since the kill); 3 s after it is slack for a loaded machine.
    static func disruption(killedAt: Int64, settledAt: Int64) -> ClosedRange<Int64> {
        let lastRebalance = max(settledAt, killedAt + ReliabilityFleet.workerSessionTimeoutMs)
        return (killedAt - 2_000)...(lastRebalance + 3_000)
    }
}

/// One kill: which worker, how long after the previous recovery, and how long it stays dead (ms).
struct KillPlan: Sendable {
    var victim: String
    var after: Int
    var downFor: Int
}
