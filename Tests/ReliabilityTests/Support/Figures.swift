import APNsCore
import FleetTestSupport
import Foundation

/// The size of a run: small and bounded inside `make test`; bigger with `APNS_FLEET_SOAK=1`
/// (`make soak`).
struct RunScale: Sendable {
    /// Fresh fleets, one after another.
    var runs: Int
    /// Worker kills per run.
    var killsPerRun: Int
    /// Times each fault sequence is repeated per run.
    var faultRounds: Int
    /// Jobs per second the test publishes while faults are injected.
    var rate: Double

    static let isSoak = ProcessInfo.processInfo.environment["APNS_FLEET_SOAK"] == "1"

    static var current: RunScale {
        isSoak ? RunScale(runs: 3, killsPerRun: 6, faultRounds: 3, rate: 200) : RunScale(runs: 1, killsPerRun: 3, faultRounds: 1, rate: 120)
    }

    /// The seed of the random moments (kill times, victims); `APNS_FLEET_RELIABILITY_SEED` repeats a run.
    static var seed: UInt64 {
        ProcessInfo.processInfo.environment["APNS_FLEET_RELIABILITY_SEED"].flatMap { UInt64($0) } ?? 0xC0FF_EE00
    }
}

/// The machine-readable line each suite prints: what was done and what was measured.
struct ReliabilityFigures: Sendable {
    var suite: String
    var runs = 0
    var kills = 0
    /// Kinds of fault injected, and how many faults in all.
    var faults: [String] = []
    var faultsInjected = 0
    var jobs = 0
    var notifications = 0
    var lost = 0
    var duplicates = 0
    var wrongOutcomes = 0
    /// Jobs the test's producer was told were delivered (at an unknown offset) that apns.jobs
    /// never held: not the fleet's input, so not lost by it; see ``UnplacedJobs``.
    var deliveredButAbsent = 0
    var recoveryMs: [Int64] = []
    var peakWorkerRSSMB = 0.0
    var seconds = 0.0

    /// Adds one run's outcome.
    mutating func add(_ outcome: RunOutcome) {
        runs += 1
        jobs += outcome.jobs
        notifications += outcome.notifications
        lost += outcome.lost
        duplicates += outcome.duplicates
        wrongOutcomes += outcome.wrongOutcomes
        deliveredButAbsent += outcome.deliveredButAbsent
        peakWorkerRSSMB = max(peakWorkerRSSMB, outcome.peakWorkerRSSMB)
    }

    /// Adds one run of a fault suite: its outcome, the recovery after each fault, and the faults.
    mutating func add(_ outcome: RunOutcome, recoveries: [Int64], faults: [String]) {
        add(outcome)
        recoveryMs += recoveries
        faultsInjected += faults.count
        addFaults(faults)
    }

    var jsonLine: String {
        let sorted = recoveryMs.sorted()
        let median = sorted.isEmpty ? 0 : sorted[(sorted.count - 1) / 2]
        // Built up one key at a time: one big heterogeneous literal is slow to type-check.
        var recovery: [String: Int64] = [:]
        recovery["max"] = sorted.last ?? 0
        recovery["median"] = median
        recovery["count"] = Int64(sorted.count)
        var object: [String: Any] = [:]
        object["suite"] = suite
        object["runs"] = runs
        object["kills"] = kills
        object["faults"] = faults
        object["faults_injected"] = faultsInjected
        object["jobs"] = jobs
        object["notifications"] = notifications
        object["lost"] = lost
        object["duplicates"] = duplicates
        object["wrong_outcomes"] = wrongOutcomes
        object["acked_but_absent_from_jobs_topic"] = deliveredButAbsent
        object["recovery_ms"] = recovery
        object["peak_worker_rss_mb"] = Self.oneDecimal(peakWorkerRSSMB)
        object["seconds"] = Self.oneDecimal(seconds)
        object["soak"] = RunScale.isSoak
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    static func oneDecimal(_ value: Double) -> Double {
        let tenths: Double = (value * 10).rounded()
        return tenths / 10
    }

    /// Adds the kinds of fault in `names` not listed yet (in order; broker numbers folded).
    mutating func addFaults(_ names: [String]) {
        for name in names {
            let kind = name.replacingOccurrences(of: #"broker \d+"#, with: "broker N", options: .regularExpression)
            if !faults.contains(kind) { faults.append(kind) }
        }
    }

    /// Prints the line (and appends it to `APNS_FLEET_RELIABILITY_FIGURES`, when set, for the README).
    func report() {
        let line = jsonLine
        print(line)
        if let path = ProcessInfo.processInfo.environment["APNS_FLEET_RELIABILITY_FIGURES"], !path.isEmpty {
            if !FileManager.default.fileExists(atPath: path) { _ = FileManager.default.createFile(atPath: path, contents: nil) }
            if let handle = FileHandle(forWritingAtPath: path) {
                handle.seekToEndOfFile()
                handle.write(Data((line + "\n").utf8))
                try? handle.close()
            }
        }
    }
}

extension SplitMix64 {
    /// Uniform in `range` (milliseconds and the like).
    mutating func next(in range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.upperBound - range.lowerBound + 1))
    }
}
