import APNsCore
import ArgumentParser
import FleetLoad
import Foundation

/// Options shared by the suites that run a local fleet.
struct FleetBenchOptions: ParsableArguments {
    @Option(help: "Jobs per run (single-token jobs unless --mix says otherwise).")
    var jobs = 100_000

    @Option(help: "Notifications at the start of each run left out of the rate and latency figures (worker CPU counts every one).")
    var warmup = 10_000

    @Option(help: "Partitions of each topic.")
    var partitions = 8

    @Option(help: "Jobs per second to publish (default: as fast as Kafka takes them, so the workers run flat out).")
    var rate: Double?

    @Option(help: "Job mix, kind=weight,… Default: good=1.")
    var mix: String?

    @Option(name: .customLong("apns-latency-ms"), help: "The simulator answers after this long (fills the in-flight window).")
    var apnsLatencyMs: Int?

    @Option(name: .customLong("max-in-flight"), help: "worker.max-in-flight of each worker.")
    var maxInFlight: Int?

    @Option(
        name: .customLong("worker-set"),
        help: "A setting for every worker, as its --set takes it (repeatable). A list is comma-separated and replaces the configured one, so keep the benchmark's own properties, e.g. --worker-set 'kafka.properties=session.timeout.ms=6000,fetch.wait.max.ms=10,linger.ms=20'."
    )
    var workerSet: [String] = []

    @Option(help: "Runs per configuration; the median is printed last.")
    var runs = 3

    @Option(help: "Append a Markdown table of the runs to this file.")
    var markdown: String?

    @Option(help: "Give up on a run that has not got every result after this many seconds (a paced run needs more than --jobs / --rate).")
    var timeout = 900

    @Option(help: "Working directory for the fleet's credentials and logs.")
    var dir = ".bench"

    func validate() throws {
        guard jobs > 0, warmup >= 0, warmup < jobs - 1, partitions > 0, runs > 0, timeout > 0 else {
            throw ValidationError("--jobs, --partitions, --runs and --timeout must be positive, and --warmup must leave at least two results to measure (below --jobs - 1)")
        }
        try checkRate(rate)
        if let rate, Double(jobs) / rate >= Double(timeout) {
            throw ValidationError("--jobs \(jobs) at --rate \(rate) take \(Int((Double(jobs) / rate).rounded(.up))) s to publish, past --timeout \(timeout) s; raise --timeout")
        }
        if let mix { _ = try parseMix(mix) }
        // Checked here, before kafka-dev and the simulator start, not by the spawned processes.
        try checkSimulatedLatency("--apns-latency-ms", apnsLatencyMs)
        if let maxInFlight, !(0...1_000_000).contains(maxInFlight) {
            throw ValidationError("--max-in-flight must be 0 (sized from the streams) to 1000000, got \(maxInFlight)")
        }
        for setting in workerSet {
            guard let equals = setting.firstIndex(of: "="), equals != setting.startIndex else {
                throw ValidationError("--worker-set takes key=value, got \(JobRules.quoted(JobRules.clip(setting)))")
            }
        }
    }

    func settings(workers: Int) throws -> FleetBench.Settings {
        var settings = FleetBench.Settings()
        settings.jobs = jobs
        settings.warmup = warmup
        settings.workers = workers
        settings.timeout = .seconds(timeout)
        settings.partitions = partitions
        settings.rate = rate
        settings.mix = try mix.map { try parseMix($0) } ?? .allGood
        settings.apnsLatencyMs = apnsLatencyMs
        settings.maxInFlight = maxInFlight
        settings.workerSettings = workerSet
        settings.directory = dir
        return settings
    }

    static let columns: [(String, String)] = [
        ("run", "run"), ("workers", "workers"), ("notifications/s", "notifications_per_second"),
        ("per worker/s", "per_worker_notifications_per_second"), ("worker CPU µs/notification", "worker_cpu_us_per_notification"), ("after warm-up", "worker_cpu_us_per_notification_after_warmup"),
        ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("peak RSS MiB", "peak_rss_mb"), ("lost", "lost"), ("duplicates", "duplicates"), ("wrong outcomes", "wrong_outcomes"),
    ]
}

/// `apns-fleet bench e2e`: the worker as its own process, end to end.
struct E2EBenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "e2e",
        abstract: "Benchmark the push worker end to end: Kafka job → APNs (simulator) → result → offset.",
        discussion: """
            Starts kafka-dev, the simulator and one push worker as separate processes, publishes \
            --jobs while the worker runs, and follows the results. Prints one JSON line per run \
            and the median: notifications and jobs per second, worker CPU µs per notification (the \
            worker process's own CPU time over the whole run, divided by every notification; and \
            after warm-up, between two readings of the worker's CPU time and its own count of \
            notifications), p50/p99 latency from the job's meta.published_at to the result's \
            sent_at, the worker's peak RSS and its peak in flight (sampled). Build in release mode.

            Examples:
              .build/release/apns-fleet bench e2e --jobs 200000 --runs 3 --markdown bench.md
              .build/release/apns-fleet bench e2e --apns-latency-ms 500 --max-in-flight 10000 --jobs 60000
              .build/release/apns-fleet bench e2e --rate 5000 --jobs 50000   # latency at a set load
            """
    )

    @OptionGroup var options: FleetBenchOptions

    @Option(help: "Push workers, from 1 to the partition count.")
    var workers = 1

    func validate() throws {
        // Checked before anything starts: kafka-dev and the simulator would otherwise be left
        // running by a count that cannot be started, or a run wait out its timeout with no worker.
        guard (1...max(1, options.partitions)).contains(workers) else {
            throw ValidationError("--workers must be from 1 to the partition count (\(options.partitions)); got \(workers)")
        }
    }

    func run() async throws {
        await SpawnedProcess.stopChildrenOnSignal()
        let bench = FleetBench(settings: try options.settings(workers: workers))
        let output = BenchOutput(markdownPath: options.markdown, title: "e2e: \(workers) worker(s), \(options.jobs) jobs", columns: FleetBenchOptions.columns)
        var records: [BenchRecord] = []
        for index in 1...options.runs {
            let record = try await bench.run(index: index) { FileHandle.standardError.write(Data(("  " + $0 + "\n").utf8)) }
            output.emit(record)
            records.append(record)
        }
        try output.finish(records, machine: BenchOutput.machine)
    }
}

/// `apns-fleet bench scaling`: throughput against the number of workers in one group.
struct ScalingBenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "scaling",
        abstract: "Benchmark throughput with 1, 2, 3… push workers sharing one consumer group.",
        discussion: """
            Runs the e2e benchmark once per worker count in --workers (each --runs times, each on \
            a fresh fleet) and prints the JSON lines, with throughput per worker. Note that every \
            process shares this machine's cores: on a small machine the workers compete with \
            Kafka and the simulator, so the curve shows the machine as much as the fleet.

            Example:
              .build/release/apns-fleet bench scaling --workers 1,2,3 --jobs 100000 --markdown bench.md
            """
    )

    @OptionGroup var options: FleetBenchOptions

    @Option(help: "Worker counts, comma-separated.")
    var workers = "1,2,3"

    /// The counts in `--workers`; nil if one is not a number from 1 to the partition count.
    private var counts: [Int]? {
        let counts = workers.split(separator: ",", omittingEmptySubsequences: false).map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard counts.allSatisfy({ $0.map { $0 > 0 && $0 <= options.partitions } ?? false }) else { return nil }
        return counts.compactMap { $0 }
    }

    func validate() throws {
        guard counts != nil else {
            throw ValidationError("--workers must list counts from 1 to the partition count (\(options.partitions)), comma-separated; got '\(workers)'")
        }
    }

    func run() async throws {
        await SpawnedProcess.stopChildrenOnSignal()
        let counts = self.counts ?? []
        var medians: [BenchRecord] = []
        for count in counts {
            let bench = FleetBench(settings: try options.settings(workers: count))
            var records: [BenchRecord] = []
            for index in 1...options.runs {
                var record = try await bench.run(index: index) { FileHandle.standardError.write(Data(("  " + $0 + "\n").utf8)) }
                record.set("suite", "scaling")
                BenchOutput.write(record)
                records.append(record)
            }
            if let median = BenchRecord.median(of: records) {
                if records.count > 1 { BenchOutput.write(median) }
                medians.append(median)
            }
        }
        let output = BenchOutput(markdownPath: options.markdown, title: "scaling: \(counts.map(String.init).joined(separator: ", ")) workers, \(options.jobs) jobs, medians of \(options.runs) runs", columns: FleetBenchOptions.columns)
        if options.markdown != nil { try output.finishTable(medians, machine: BenchOutput.machine) }
    }
}
