import APNsSimulator
import FleetLoad
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging

// Helpers for the suites that run `apns-fleet worker` as a real process beside `kafka-dev`:
// the fleet file, workers whose log lines can be read, and plain HTTP against the admin endpoint.

/// `apns-fleet kafka-dev` with the project's topics, and its bootstrap servers.
struct KafkaDevProcess {
    let process: ChildProcess
    let bootstrap: String

    /// With `console`, kafka-dev takes fault commands on its stdin (``command(_:)``).
    static func start(binary: String, partitions: Int, console: Bool = false) async throws -> KafkaDevProcess {
        let process = ChildProcess(binary, ["kafka-dev", "--brokers", "1", "--partitions", String(partitions)] + (console ? [] : ["--no-stdin"]))
        try process.start()
        do {
            return KafkaDevProcess(process: process, bootstrap: try await process.line(1))
        } catch {
            process.kill()
            throw error
        }
    }

    /// One fault command on kafka-dev's console; throws unless it answers `ok …`.
    func command(_ text: String) async throws {
        let before = process.lines.value.count
        process.write(text + "\n")
        try await waitUntil("kafka-dev to answer '\(text)'", timeout: 10) {
            process.lines.value.dropFirst(before).contains { $0.hasPrefix("ok") || $0.hasPrefix("error") }
        }
        let answer = process.lines.value.dropFirst(before).first { $0.hasPrefix("ok") || $0.hasPrefix("error") } ?? ""
        guard answer.hasPrefix("ok") else { throw TestSetupError("kafka-dev refused '\(text)': \(answer)") }
    }
}

/// A fleet file for one app on the simulator (dev credentials written to `directory`).
func writeFleetFile(
    directory: String, summary: DevCredentials.Summary, simulatorPort: Int, bootstrap: String,
    extra: String = ""
) throws -> String {
    let path = (directory as NSString).appendingPathComponent("fleet-\(UUID().uuidString.prefix(8)).yaml")
    try """
        kafka:
          bootstrap-servers: \(bootstrap)
          # The mock cluster rebalances after about session.timeout.ms (PITFALLS.md): keep it short.
          properties: [session.timeout.ms=6000]
        apps: [example]
        app:
          example:
            key-file: \((directory as NSString).appendingPathComponent(summary.signingKeyFile))
            key-id: \(summary.keyID)
            team-id: \(summary.teamID)
            topic: com.example.app
            environment: custom
            host: 127.0.0.1
            port: \(simulatorPort)
            ca-file: \((directory as NSString).appendingPathComponent(summary.caFile))
            connections: 1
        admin:
          port: 0
        \(extra)
        """.write(toFile: path, atomically: true, encoding: .utf8)
    return path
}

/// What a worker process test starts from: kafka-dev, the simulator in process with dev
/// credentials written to a fresh directory, and a fleet file for one app on them.
struct ProcessFleetBackends {
    let binary: String
    let directory: String
    let kafka: KafkaDevProcess
    let simulator: APNsSimulator
    let summary: DevCredentials.Summary
    let logger: Logger

    static func start(
        name: String, partitions: Int, simulator configure: (inout APNsSimulatorConfiguration) -> Void = { _ in }
    ) async throws -> ProcessFleetBackends {
        var logger = Logger(label: "\(name)-test")
        logger.logLevel = .warning
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-\(name)")
        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: partitions)
        do {
            let credentials = try DevCredentials.generate(topic: "com.example.app")
            let summary = try credentials.write(to: directory)
            var configuration = try credentials.simulatorConfiguration()
            configuration.listeners.http2TLSPort = 0
            configure(&configuration)
            let simulator = try await APNsSimulator.start(configuration, logger: logger)
            return ProcessFleetBackends(binary: binary, directory: directory, kafka: kafka, simulator: simulator, summary: summary, logger: logger)
        } catch {
            kafka.process.kill()
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// A fleet file for the app on the simulator; `extra` is appended YAML.
    func fleetFile(extra: String = "") throws -> String {
        try writeFleetFile(directory: directory, summary: summary, simulatorPort: simulator.port(.http2TLS) ?? 0, bootstrap: kafka.bootstrap, extra: extra)
    }

    /// Publishes one-token JSON jobs `prefix-0`… for `token` to apns.jobs, each acknowledged.
    func publishJobs(_ count: Int, prefix: String, token: String = String(repeating: "ab", count: 32)) async throws {
        var client = KafkaClientConfiguration(bootstrapServers: [kafka.bootstrap])
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            for index in 0..<count {
                try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", key: nil, value: Array(#"{"id":"\#(prefix)-\#(index)","token":"\#(token)","payload":{}}"#.utf8)))
            }
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
    }

    /// Stops kafka-dev and removes the directory (for `defer`); the simulator stops in `stop()`.
    func kill() {
        kafka.process.kill()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func stop() async {
        await simulator.stop(gracePeriod: .zero)
        kill()
    }
}

/// `apns-fleet worker` with its log (standard error) merged into the lines the test reads. The
/// shell `exec`s the worker, so the child's pid is the worker's and signals reach it directly.
func startWorker(binary: String, config: String, id: String, logLevel: String = "info") throws -> ChildProcess {
    let worker = ChildProcess("/bin/sh", ["-c", #"exec "$0" worker --config "$1" --set "worker.id=$2" --log-level "$3" 2>&1"#, binary, config, id, logLevel])
    try worker.start()
    return worker
}

extension ChildProcess {
    /// The admin port the worker logged ("admin endpoint listening … http://127.0.0.1:PORT").
    func adminPort(timeout: Double = 30) async throws -> Int {
        var port: Int?
        try await waitUntil("the worker's admin endpoint", timeout: timeout) {
            lines.value.contains { $0.contains("admin endpoint listening") }
        }
        for line in lines.value where line.contains("admin endpoint listening") {
            if let range = line.range(of: "http://127.0.0.1:") {
                port = Int(line[range.upperBound...].prefix { $0.isNumber })
            }
        }
        guard let port else { throw TestSetupError("no admin port in: \(lines.value.suffix(5))") }
        return port
    }

    func output(containing text: String) -> [String] { lines.value.filter { $0.contains(text) } }
}
