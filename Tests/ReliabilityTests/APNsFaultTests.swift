import APNsSimulator
import FleetTestSupport
import Foundation
import Testing

/// APNs faults through the simulator's admin endpoint while jobs flow through two workers:
/// GOAWAY mid-flight, a TCP reset, a TLS close_notify, bursts of 500 and of 503, answers later
/// than the workers' request deadline, and the stream limit dropping to 1 after rejections.
/// Every fault window closes on a condition the simulator counted (so many 500s answered, so
/// many streams given up by the client), not after a fixed time.
@Suite("Reliability: APNs faults", .timeLimit(.minutes(10)))
struct APNsFaultTests {
    @Test("GOAWAY, TCP reset, close_notify, 500/503 bursts, late answers, one-stream limit: nothing lost, outcomes right, memory bounded")
    func apnsFaults() async throws {
        let scale = RunScale.current
        var figures = ReliabilityFigures(suite: "apns-faults")
        let began = ContinuousClock.now
        for run in 1...scale.runs {
            var options = ReliabilityFleet.Options(name: "apns")
            options.seed = RunScale.seed &+ 200 &+ UInt64(run)
            // Answers take 20 ms, so that every fault finds requests in flight; the deadline is short
            // so that "later than the deadline" is quick to reach.
            options.simulatorArguments = ["--latency-ms", "20", "--seed", String(RunScale.seed)]
            options.requestTimeoutSeconds = 1
            let injected = Shared<[String]>([])
            let recoveries = Shared<[Int64]>([])
            let outcome = try await ReliabilityFleet.run(options) { fleet in
                try await fleet.runUnderFaults(rate: scale.rate, limit: 50_000) { fleet in
                    func recovered(_ name: String) async throws {
                        let since = ReliabilityFleet.nowMillis()
                        let recovery = try await fleet.waitForEveryPartitionServed(after: since, timeout: 60, what: name)
                        recoveries.update { $0.append(recovery) }
                        injected.update { $0.append(name) }
                    }
                    /// Waits until the simulator's counters show the fault took effect.
                    func until(_ what: String, _ condition: @escaping @Sendable (SimulatorCountersSnapshot) -> Bool) async throws {
                        try await waitUntil(what, timeout: 30) {
                            (try? fleet.simulatorCounters()).map(condition) ?? false
                        }
                    }
                    for _ in 0..<scale.faultRounds {
                        var before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/goaway?reason=Shutdown")
                        try await until("GOAWAY sent and connections replaced") { [before] in
                            $0.totals.goAwaysSent > before.totals.goAwaysSent && $0.connectionsOpened > before.connectionsOpened
                        }
                        try await recovered("GOAWAY mid-flight")

                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/reset")
                        try await until("connections replaced after the TCP reset") { [before] in $0.connectionsOpened > before.connectionsOpened }
                        try await recovered("TCP reset")

                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/close-notify")
                        try await until("connections replaced after close_notify") { [before] in $0.connectionsOpened > before.connectionsOpened }
                        try await recovered("TLS close_notify")

                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/faults?error_500_rate=0.5")
                        try await until("a burst of 500s") { [before] in $0.count(status: 500) >= before.count(status: 500) + 40 }
                        try fleet.simulatorAdmin("DELETE", "/faults")
                        try await recovered("burst of 500 InternalServerError (50 %)")

                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/faults?error_503_rate=0.5")
                        try await until("a burst of 503s") { [before] in $0.count(status: 503) >= before.count(status: 503) + 40 }
                        try fleet.simulatorAdmin("DELETE", "/faults")
                        try await recovered("burst of 503 ServiceUnavailable (50 %)")

                        // Answers 1.5 s late against a 1 s deadline: the workers give the streams up
                        // (RST_STREAM, counted by the simulator) and retry.
                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/faults?latency_ms=1500")
                        try await until("requests given up at their deadline") { [before] in
                            $0.totals.streamsReset >= before.totals.streamsReset + 20
                        }
                        try fleet.simulatorAdmin("DELETE", "/faults")
                        try await recovered("answers after the deadline (1.5 s vs 1 s)")

                        // Every 410 (a dead token) drops the limit to 1 until a request is accepted.
                        before = try fleet.simulatorCounters()
                        try fleet.simulatorAdmin("POST", "/faults?drop_to_one_stream=true")
                        try await until("rejections under the one-stream rule") { [before] in $0.count(status: 410) >= before.count(status: 410) + 30 }
                        try fleet.simulatorAdmin("DELETE", "/faults")
                        try await recovered("stream limit 1 after each rejection")
                    }
                }
            }
            outcome.expectNothingLost()
            figures.add(outcome, recoveries: recoveries.value, faults: injected.value)
        }
        figures.seconds = (ContinuousClock.now - began).secondsValue
        // Debug builds, two connections, 64 in flight: a worker that grew past this under faults
        // would be keeping something it should not.
        #expect(figures.peakWorkerRSSMB < 512, "worker peak RSS \(figures.peakWorkerRSSMB) MB")
        figures.report()
    }
}
