import APNsCore
import APNsFleetConfig
import FleetLoad
import Foundation

/// A fleet on this machine, every part its own process as in production: `kafka-dev` (unless a
/// real Kafka is given), the simulator (unless real apps are configured), push workers and the
/// feedback worker. The demo and the end-to-end benchmarks run on it.
struct LocalFleet {
    struct Options {
        var directory: String
        var runID: String
        var partitions = 8
        var workers = 1
        var metricsPort = 9464
        var brokers: String?
        var config: String?
        var tokens: [String] = []
        var mix: JobMix = .realistic
        var feedbackWorker = true
        /// Extra `--set` overrides for every worker.
        var workerSettings: [String] = []
        /// Extra simulator flags (latency, error rates).
        var simulatorArguments: [String] = []
    }

    let topics: TopicNames
    let bootstrap: String
    /// Whether Kafka is kafka-dev (librdkafka's mock cluster) rather than the user's brokers.
    let embeddedKafka: Bool
    let generator: JobGenerator
    let logDirectory: String
    let metricsURLs: [String]
    /// Admin (metrics) port of each push worker, in `pushWorkers` order.
    let pushWorkerAdminPorts: [Int]
    /// Every process, in start order.
    let processes: [SpawnedProcess]
    let pushWorkers: [SpawnedProcess]

    static func start(_ options: Options, say: (String) -> Void) async throws -> LocalFleet {
        let directory = URL(fileURLWithPath: options.directory).standardizedFileURL.path
        let logs = (directory as NSString).appendingPathComponent("logs")
        try FileManager.default.createDirectory(atPath: logs, withIntermediateDirectories: true)
        func logPath(_ name: String) -> String { (logs as NSString).appendingPathComponent("\(name).log") }
        // The user's configuration is read first: a broken one must not leave kafka-dev started.
        var userApps: (fleet: FleetConfiguration, app: String, topic: String)?
        if let config = options.config {
            let fleet = try await ConfigurationLoader(filePath: config, environment: ProcessInfo.processInfo.environment, overrides: []).load()
            guard let app = fleet.apps.first, let topic = app.defaults.topic ?? app.topics.first else {
                throw UsageError("\(config) configures no app with a topic")
            }
            userApps = (fleet, app.name, topic)
        }
        // The topics: the configuration's; on the user's brokers without one, the demo's own, so
        // that its made-up jobs never land in a fleet's real apns.jobs; kafka-dev's defaults
        // otherwise. The consumer groups are the run's own in every case: a demo pointed at
        // brokers a fleet uses must not join that fleet's groups and take its partitions.
        let topics = userApps?.fleet.topics ?? (options.brokers != nil ? Self.demoTopics : TopicNames())
        let groupSettings = [
            "--set", "kafka.group-id=apns-fleet-demo-\(options.runID)", "--set", "kafka.feedback-group-id=apns-fleet-demo-\(options.runID)-feedback",
        ] + (userApps == nil && options.brokers != nil ? zip(["jobs", "retry", "dlq", "results", "token-events"], topics.all).flatMap { ["--set", "topics.\($0)=\($1)"] } : [])
        var processes: [SpawnedProcess] = []
        do {
            // Kafka.
            let bootstrap: String
            if let brokers = options.brokers {
                bootstrap = brokers
                say("Kafka: \(brokers) (yours; the topics \(topics.all.joined(separator: ", ")) must exist)")
            } else {
                let file = (directory as NSString).appendingPathComponent("kafka.bootstrap")
                try? FileManager.default.removeItem(atPath: file)
                let kafka = try SpawnedProcess(
                    name: "kafka-dev",
                    arguments: ["kafka-dev", "--brokers", "1", "--partitions", "\(options.partitions)", "--bootstrap-file", file, "--no-stdin"]
                        + topics.all.reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }.flatMap { ["--topic", $0] },
                    logPath: logPath("kafka-dev")
                )
                processes.append(kafka)
                _ = try await kafka.waitForLine(containing: "127.0.0.1:", timeout: .seconds(60))
                bootstrap = try String(contentsOfFile: file, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
                say("Kafka: embedded (kafka-dev), \(bootstrap), \(options.partitions) partitions per topic")
            }

            // APNs: the simulator with TLS and development credentials, or the user's apps.
            let generator: JobGenerator
            let fleetArguments: [String]
            if let config = options.config, let userApps {
                fleetArguments = ["--config", config, "--set", "kafka.bootstrap-servers=\(bootstrap)"]
                generator = JobGenerator(mix: options.mix, topic: userApps.topic, app: userApps.app, fixedTokens: options.tokens, idPrefix: "demo-\(options.runID)")
                say("APNs: the apps of \(config) (\(userApps.fleet.apps.map(\.name).joined(separator: ", "))); good jobs go to \(options.tokens.count) device token(s)")
            } else {
                let setup = try DemoSimulatorSetup(directory: directory, runID: options.runID, mix: options.mix)
                let simulator = try SpawnedProcess(
                    name: "simulator",
                    arguments: ["simulator", "--config", setup.simulatorConfigPath, "--h2-port", "0", "--h2c-port=-1", "--admin-port", "0",
                                "--gateway-port=-1", "--gateway-plain-port=-1", "--feedback-port=-1", "--feedback-plain-port=-1"]
                        + options.simulatorArguments,
                    logPath: logPath("simulator")
                )
                processes.append(simulator)
                let listening = try await simulator.waitForLine(containing: "apns-fleet simulator listening:", timeout: .seconds(60))
                guard let port = Self.port(after: "h2 (TLS) 127.0.0.1:", in: listening) else {
                    throw CommandFailure("cannot read the simulator's port from: \(listening)")
                }
                fleetArguments = try setup.writeFleetConfiguration(bootstrap: bootstrap, simulatorPort: port, embeddedKafka: options.brokers == nil)
                generator = setup.generator
                say("APNs: the simulator on 127.0.0.1:\(port) (TLS, token auth; credentials in \(setup.credentialsDirectory))")
            }

            // Push workers in one consumer group, and the feedback worker.
            var pushWorkers: [SpawnedProcess] = []
            var metricsURLs: [String] = []
            var adminPorts: [Int] = []
            let extra = options.workerSettings.flatMap { ["--set", $0] }
            for index in 0..<options.workers {
                let port = options.metricsPort + index
                let worker = try SpawnedProcess(
                    name: "worker-\(index + 1)",
                    arguments: ["worker"] + fleetArguments + groupSettings + ["--set", "admin.port=\(port)", "--set", "worker.id=local-worker-\(index + 1)"] + extra,
                    logPath: logPath("worker-\(index + 1)")
                )
                processes.append(worker)
                pushWorkers.append(worker)
                adminPorts.append(port)
                metricsURLs.append("http://127.0.0.1:\(port)/metrics")
            }
            if options.feedbackWorker {
                let port = options.metricsPort + options.workers
                let feedback = try SpawnedProcess(
                    name: "feedback",
                    arguments: ["feedback"] + fleetArguments + groupSettings + ["--set", "admin.port=\(port)", "--set", "worker.id=local-feedback"],
                    logPath: logPath("feedback")
                )
                processes.append(feedback)
                metricsURLs.append("http://127.0.0.1:\(port)/metrics")
            }
            // Publishing before the groups have formed would only measure how long joining takes.
            for process in processes where process.name.hasPrefix("worker") || process.name == "feedback" {
                _ = try await process.waitForLine(containing: "partitions assigned", timeout: .seconds(90))
            }
            say("Workers: \(options.workers) push worker(s)\(options.feedbackWorker ? " and the feedback worker" : ""), partitions assigned")
            return LocalFleet(
                topics: topics, bootstrap: bootstrap, embeddedKafka: options.brokers == nil, generator: generator, logDirectory: logs, metricsURLs: metricsURLs,
                pushWorkerAdminPorts: adminPorts, processes: processes, pushWorkers: pushWorkers
            )
        } catch {
            await SpawnedProcess.holdIfInterrupted()
            for process in processes { process.kill() }
            throw error
        }
    }

    /// SIGTERM to every process, last started first, each given time to drain.
    /// Stops every process, newest first (workers drain into a Kafka still there); returns
    /// each one's exit status (SIGKILL after 30 s: -9).
    @discardableResult
    func stop() async -> [(process: SpawnedProcess, status: Int32)] {
        var statuses: [(process: SpawnedProcess, status: Int32)] = []
        for process in processes.reversed() { statuses.append((process, await process.stop(timeout: .seconds(30)))) }
        return statuses
    }

    /// For error paths.
    func kill() {
        for process in processes { process.kill() }
    }

    /// The topics of a demo on the user's brokers (without `--config`): they must exist there.
    static let demoTopics = TopicNames(
        jobs: "apns-demo.jobs", retry: "apns-demo.jobs.retry", deadLetter: "apns-demo.jobs.dlq",
        results: "apns-demo.results", tokenEvents: "apns-demo.token-events"
    )

    static func port(after marker: String, in line: String) -> Int? {
        guard let range = line.range(of: marker) else { return nil }
        return Int(line[range.upperBound...].prefix { $0.isNumber })
    }
}
