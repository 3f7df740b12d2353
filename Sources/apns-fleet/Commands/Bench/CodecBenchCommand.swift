import APNsCore
import ArgumentParser
import FleetLoad
import Foundation

/// `apns-fleet bench codec`: the worker's per-notification contract work alone, on one thread.
///
/// The end-to-end figure mixes Kafka, TLS, HTTP/2 and thread hand-overs, and this two-core host's
/// noise hides a 5% change there. Job intake and result encoding are about a fifth of the
/// worker's CPU; measured here alone, in the thread's own CPU time, a change to them shows.
struct CodecBenchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "codec",
        abstract: "Benchmark the contract codecs alone: job intake (decode and resolve) and result encoding.",
        discussion: """
            Generates --jobs distinct single-token jobs (JSON envelopes and header-encoded), then \
            times, on one thread and in that thread's CPU time: the worker's intake of each \
            record (decode, validate, resolve the app's defaults) and the encoding of a \
            `delivered` result for it. Prints one JSON line per run with nanoseconds per job \
            and per result, and the median.

            Example:
              .build/release/apns-fleet bench codec --jobs 20000 --passes 20 --runs 5
            """
    )

    @Option(help: "Distinct jobs generated (each pass takes every one).")
    var jobs = 20_000

    @Option(help: "Passes over the jobs per run.")
    var passes = 20

    @Option(help: "Runs; the median is printed last.")
    var runs = 5

    @Option(help: "Append a Markdown table of the runs to this file.")
    var markdown: String?

    func validate() throws {
        guard jobs > 0, passes > 0, runs > 0 else {
            throw ValidationError("--jobs, --passes and --runs must be positive")
        }
    }

    func run() throws {
        let topic = "com.example.app"
        let app = AppConfiguration(
            name: "example",
            authentication: .token(keyFile: "/unused.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ"),
            defaults: JobDefaults(topic: topic)
        )
        let intake = JobIntake(configuration: FleetConfiguration(apps: [app]), workerID: "bench-worker-1")
        var envelopes = JobGenerator(mix: .allGood, topic: topic, idPrefix: "codec")
        var headerJobs = try JobGenerator(mix: JobMix(parsing: "headers=1"), topic: topic, idPrefix: "codec")
        let now = UnixMillis(Int64(Date().timeIntervalSince1970 * 1000))
        let envelopeRecords = (0..<jobs).map { _ in envelopes.next(now: now.value) }.map { (value: $0.value, headers: $0.headers) }
        let headerRecords = (0..<jobs).map { _ in headerJobs.next(now: now.value) }.map { (value: $0.value, headers: $0.headers) }
        let source = SourcePosition(topic: "apns.jobs", partition: 3, offset: 1_000_000)

        // The results a worker would publish for these jobs, made once: only the encoding is timed.
        let results = try envelopeRecords.map { record -> NotificationResult in
            guard case .accepted(let job) = intake.accept(value: record.value, headers: record.headers, source: source, now: now) else {
                throw UsageError("a generated job was not accepted: \(String(decoding: record.value, as: UTF8.self))")
            }
            return NotificationResult(
                jobID: job.jobID, token: job.tokens.first?.hex ?? "", topic: job.job.topic, app: job.appName,
                outcome: .delivered, status: 200, apnsID: "6F1C8B0A-3D2E-4F5A-9B7C-1D2E3F4A5B6C",
                attempts: 1, latencyMs: 7.25, sentAt: now, worker: intake.workerID, meta: job.job.job.meta, source: source
            )
        }

        /// How many of `records` the intake accepts. The records' fields are read in place, as
        /// the worker reads a consumed record's, rather than copied out of the array per job.
        func accepted(_ records: [(value: [UInt8], headers: [RecordHeader])]) -> Int {
            var accepted = 0
            for index in records.indices {
                if case .accepted = intake.accept(value: records[index].value, headers: records[index].headers, source: source, now: now) { accepted += 1 }
            }
            return accepted
        }

        /// Nanoseconds of this thread's CPU per item over `passes` passes of `count` items; the
        /// body returns how many items it handled as expected, which must be all of them.
        func measure(_ name: String, count: Int, _ pass: () -> Int) throws -> Double {
            let start = ThreadCPUTime.nanoseconds()
            var handled = 0
            for _ in 0..<passes { handled += pass() }
            let elapsed = ThreadCPUTime.nanoseconds() - start
            guard handled == passes * count else {
                throw UsageError("\(name): \(passes * count - handled) of \(passes * count) items were not handled as expected")
            }
            return Double(elapsed) / Double(handled)
        }

        let output = BenchOutput(
            markdownPath: markdown, title: "codec: \(jobs) jobs × \(passes) passes",
            columns: [("run", "run"), ("intake ns/job (JSON)", "intake_json_ns_per_job"), ("intake ns/job (headers)", "intake_headers_ns_per_job"),
                      ("encode ns/result", "result_encode_ns_per_result")]
        )
        var records: [BenchRecord] = []
        for index in 1...runs {
            let json = try measure("JSON intake", count: jobs) { accepted(envelopeRecords) }
            let headers = try measure("header intake", count: jobs) { accepted(headerRecords) }
            let encode = try measure("result encoding", count: jobs) {
                var encoded = 0
                for index in results.indices where results[index].encoded().last == UInt8(ascii: "}") { encoded += 1 }
                return encoded
            }
            var record = BenchRecord()
            record.set("suite", "codec")
            record.set("run", "\(index)")
            record.set("jobs", jobs)
            record.set("passes", passes)
            record.set("intake_json_ns_per_job", json, decimals: 0)
            record.set("intake_headers_ns_per_job", headers, decimals: 0)
            record.set("result_encode_ns_per_result", encode, decimals: 0)
            output.emit(record)
            records.append(record)
        }
        try output.finish(records, machine: BenchOutput.machine)
    }
}
