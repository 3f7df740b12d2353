import APNsCore
import APNsFleetConfig
import APNsSimulator
import ArgumentParser
import FleetLoad
import FleetWorker
import Foundation
import KafkaTransport
import Logging

/// `apns-fleet demo`: the whole pipeline on one machine, with a live progress bar and a summary.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run the whole fleet locally: embedded Kafka, APNs simulator, push and feedback workers.",
        discussion: """
            Starts `kafka-dev`, the simulator (TLS, with development credentials made on first run \
            in --dir), push workers and the feedback worker as their own processes, publishes a \
            realistic mix of jobs (good, header-encoded, fan-out, unregistered tokens, bad tokens, \
            malformed JSON, unknown apps, oversize payloads), follows the results with a progress \
            bar, and prints a summary. Exits 0 only if every job got every one of its results with \
            the expected outcome, the DLQ holds as many of the run's jobs as were unusable, and every dead token, and \
            no other, got a token event (repeats, which at-least-once allows, are counted). Logs of each process are in --dir/logs.

            --brokers uses a real Kafka instead, with the topics apns-demo.jobs, apns-demo.jobs.retry, \
            apns-demo.jobs.dlq, apns-demo.results and apns-demo.token-events (they must exist), or \
            those of --config. --config uses your own apps (real APNs) instead of the simulator; \
            then give real device tokens with --token, keep --jobs small, and the mix defaults to \
            good jobs only. The workers always join consumer groups of the run's own, never a \
            fleet's.

            Examples:
              apns-fleet demo
              apns-fleet demo --jobs 20000 --workers 2
              apns-fleet demo --brokers kafka:9092 --config fleet.yaml --token <device token> --jobs 3
            """
    )

    @Option(help: "Jobs to publish.")
    var jobs = 100_000

    @Option(help: "Push workers to start (one consumer group).")
    var workers = 1

    @Option(help: "Partitions of each topic in the embedded Kafka.")
    var partitions = 8

    @Option(help: "Job mix, kind=weight,… (kinds: \(JobMix.Kind.allCases.map(\.rawValue).joined(separator: ", "))).")
    var mix: String?

    @Option(help: "Jobs per second (default: as fast as Kafka takes them).")
    var rate: Double?

    @Option(help: "Working directory: credentials, configuration and logs.")
    var dir = ".demo"

    @Option(help: "Use this Kafka instead of the embedded one (its topics must exist).")
    var brokers: String?

    @Option(help: "Use the apps of this configuration file (real APNs) instead of the simulator.")
    var config: String?

    @Option(help: "A real device token for good jobs (with --config). Repeatable.")
    var token: [String] = []

    @Option(name: .customLong("metrics-port"), help: "Admin port of the first push worker; the others and the feedback worker take the next ones.")
    var metricsPort = 9464

    @Option(help: "Give up when the results are not all in this many seconds after the last job was published.")
    var timeout = 900

    func validate() throws {
        guard jobs > 0, workers > 0, workers <= 16, partitions > 0, timeout > 0 else {
            throw ValidationError("--jobs, --partitions and --timeout must be positive; --workers 1 to 16")
        }
        if let mix { _ = try parseMix(mix) }
        try checkRate(rate)
        if config != nil, token.isEmpty {
            throw ValidationError("with --config (real APNs) give real device tokens with --token; generated tokens would only be refused")
        }
        if let brokers {
            // Handed to the workers as kafka.bootstrap-servers, which takes no spaces.
            if let problem = KafkaSettings.bootstrapServersProblem(brokers, securityProtocol: .plaintext) ?? (brokers.contains(" ") ? "must not contain spaces" : nil) {
                throw ValidationError("--brokers \(problem)")
            }
        }
        if config != nil, let mix, let kind = try parseMix(mix).weights.first(where: { $0.weight > 0 && ($0.kind == .unregistered || $0.kind == .fanout) })?.kind {
            // Their dead tokens are the simulator's: real APNs answers BadDeviceToken, not the 410 the run expects.
            throw ValidationError("--mix \(kind.rawValue) needs the simulator's dead tokens; with --config use good, headers and the unusable kinds")
        }
        if config == nil, !token.isEmpty {
            throw ValidationError("--token needs --config: the simulator's demo checks generated tokens, whose answers it knows")
        }
        for value in token {
            try check("--token") { () throws(JobRejection) in _ = try DeviceToken(hex: value) }
        }
        // The push workers take metrics-port, metrics-port + 1, …, and the feedback worker the next.
        guard (1...(65_535 - workers)).contains(metricsPort) else {
            throw ValidationError("--metrics-port must be 1 to \(65_535 - workers) (with \(workers) push worker(s), the feedback worker takes port \(metricsPort) + \(workers)), got \(metricsPort)")
        }
    }

    func run() async throws {
        await SpawnedProcess.stopChildrenOnSignal()
        let runID = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        var logger = Logger(label: "apns-fleet.demo") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = .error
        let mix = try self.mix.map { try parseMix($0) } ?? (config == nil ? .realistic : .allGood)
        let options = LocalFleet.Options(
            directory: dir, runID: runID, partitions: partitions, workers: workers, metricsPort: metricsPort,
            brokers: brokers, config: config, tokens: token, mix: mix
        )
        let fleet = try await LocalFleet.start(options) { say($0) }
        do {
            say("""
                While it runs, look at:
                  metrics    \(fleet.metricsURLs.joined(separator: " "))
                  readiness  http://127.0.0.1:\(metricsPort)/readyz
                  topics     kcat -b \(fleet.bootstrap) -C -t \(fleet.topics.results) -o end   (also \(fleet.topics.tokenEvents), \(fleet.topics.deadLetter))
                  logs       \(fleet.logDirectory)/
                """)
            let run = try DemoRun(bootstrap: fleet.bootstrap, embeddedKafka: fleet.embeddedKafka, topics: fleet.topics, runID: runID, logger: logger)
            var outcome = try await run.execute(jobs: jobs, generator: fleet.generator, rate: rate, timeout: .seconds(timeout), processes: fleet.processes)
            // Interrupted, the processes it found gone were stopped on purpose: no report.
            await SpawnedProcess.holdIfInterrupted()
            // A worker that cannot drain, flush and commit on SIGTERM would lose work in a
            // rolling restart: the run judges its stop too.
            for (process, status) in await fleet.stop() where status != 0 {
                outcome.problems.append("\(process.name) exited with status \(status) when asked to stop; its log (\(process.logPath)) ends:\n\(process.logTail(5))")
            }
            print(outcome.report)
            if !outcome.passed { throw ExitCode(1) }
        } catch {
            await SpawnedProcess.holdIfInterrupted()
            fleet.kill()
            throw error
        }
    }

    private func say(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}
