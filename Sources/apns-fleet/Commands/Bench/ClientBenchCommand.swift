import APNsSimulator
import ArgumentParser
import Foundation

/// `apns-fleet bench client`: the APNs HTTP/2 client alone, against the simulator.
struct ClientBenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "client",
        abstract: "Benchmark the APNs client alone against the simulator (each in its own process).",
        discussion: """
            Starts the simulator over TLS with development credentials, then runs `apns-fleet \
            send --count … --json` as a separate process per run, so the CPU figure is the \
            client process's own (getrusage), warm-up excluded. With --rtt-ms the simulator \
            answers after that long, and the line also gives the efficiency against the ideal \
            streams/RTT (the target: one connection, 1000 streams, 30 ms → at least 90%).

            Examples:
              .build/release/apns-fleet bench client --count 200000 --concurrency 1000
              .build/release/apns-fleet bench client --rtt-ms 30 --connections 1 --concurrency 1000 --count 100000
            """
    )

    @Option(help: "Notifications measured per run.")
    var count = 200_000

    @Option(help: "Notifications sent first in each run, not measured.")
    var warmup = 20_000

    @Option(help: "Connections.")
    var connections = 1

    @Option(help: "Requests in flight.")
    var concurrency = 1000

    @Option(name: .customLong("rtt-ms"), help: "Simulated round trip: the simulator answers after this many milliseconds.")
    var rttMs: Int?

    @Option(help: "Runs; the median is printed last.")
    var runs = 3

    @Option(help: "Append a Markdown table of the runs to this file.")
    var markdown: String?

    @Option(help: "Working directory for credentials and logs.")
    var dir = ".bench"

    func validate() throws {
        guard count > 0, warmup >= 0, connections > 0, concurrency > 0, runs > 0 else {
            throw ValidationError("--count, --connections, --concurrency and --runs must be positive")
        }
        try checkSimulatedLatency("--rtt-ms", rttMs)
    }

    func run() async throws {
        await SpawnedProcess.stopChildrenOnSignal()
        let directory = URL(fileURLWithPath: dir).standardizedFileURL.path
        let logs = (directory as NSString).appendingPathComponent("logs")
        try FileManager.default.createDirectory(atPath: logs, withIntermediateDirectories: true)
        let (credentials, summary) = try DemoSimulatorSetup.credentials(in: directory)
        func path(_ file: String) -> String { (credentials as NSString).appendingPathComponent(file) }

        var simulatorArguments = ["simulator", "--config", path(summary.simulatorConfigFile), "--h2-port", "0", "--h2c-port=-1",
                                  "--admin-port=-1", "--gateway-port=-1", "--gateway-plain-port=-1", "--feedback-port=-1", "--feedback-plain-port=-1"]
        if let rttMs { simulatorArguments += ["--latency-ms=\(rttMs)"] }
        let simulator = try SpawnedProcess(name: "simulator", arguments: simulatorArguments, logPath: (logs as NSString).appendingPathComponent("simulator.log"))
        defer { simulator.kill() }
        let listening = try await simulator.waitForLine(containing: "apns-fleet simulator listening:", timeout: .seconds(60))
        guard let port = LocalFleet.port(after: "h2 (TLS) 127.0.0.1:", in: listening) else {
            throw CommandFailure("cannot read the simulator's port from: \(listening)")
        }

        let output = BenchOutput(
            markdownPath: markdown,
            title: "client: \(connections) connection(s), \(concurrency) in flight\(rttMs.map { ", \($0) ms RTT" } ?? "")",
            columns: [("run", "run"), ("notifications/s", "notifications_per_second"), ("client CPU µs/notification", "cpu_us_per_notification"),
                      ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("peak RSS MiB", "peak_rss_mb"), ("efficiency %", "efficiency_percent")]
        )
        var records: [BenchRecord] = []
        for index in 1...runs {
            let logPath = (logs as NSString).appendingPathComponent("send-\(index).log")
            let hostAtStart = HostCPUTimes.now()
            let send = try SpawnedProcess(
                name: "send",
                arguments: ["send", "--host", "127.0.0.1", "--port", "\(port)", "--ca-file", path(summary.caFile),
                            "--key-file", path(summary.signingKeyFile), "--key-id", summary.keyID, "--team-id", summary.teamID,
                            "--topic", summary.topic, "--token", String(repeating: "ab", count: 32),
                            "--count", "\(count)", "--warmup", "\(warmup)", "--concurrency", "\(concurrency)",
                            "--connections", "\(connections)", "--json"],
                logPath: logPath
            )
            let status = await send.wait(timeout: .seconds(1800))
            if status != 0 { await SpawnedProcess.holdIfInterrupted() }
            guard status == 0, let line = send.log.split(separator: "\n").first(where: { $0.hasPrefix("{") }),
                let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            else {
                throw CommandFailure("the client run failed (status \(status)); its log (\(logPath)) ends:\n\(send.logTail())")
            }
            var record = BenchRecord()
            record.set("suite", "client")
            record.set("run", "\(index)")
            record.set("connections", connections)
            record.set("concurrency", concurrency)
            if let rttMs { record.set("rtt_ms", rttMs) }
            for key in ["notifications", "seconds", "notifications_per_second", "cpu_us_per_notification", "p50_ms", "p99_ms", "peak_rss_mb"] {
                if let number = object[key] as? NSNumber { record.set(key, number.doubleValue, decimals: key.hasSuffix("second") ? 0 : 2) }
            }
            // Every request is for the same valid token: an answer other than 200 means the run
            // measured something other than deliveries (a refused token, the simulator's limits).
            let statuses = object["statuses"] as? [String: Any] ?? [:]
            let failed = statuses.reduce(0) { $0 + ($1.key == "200" ? 0 : (($1.value as? NSNumber)?.intValue ?? 0)) }
            record.set("not_delivered", failed)
            if failed > 0 {
                let counts = statuses.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }.joined(separator: " ")
                FileHandle.standardError.write(Data("bench: \(failed) notifications were not answered 200 (statuses: \(counts)); the figures do not measure deliveries alone\n".utf8))
            }
            if let rttMs, rttMs > 0, let rate = record["notifications_per_second"]?.double {
                let ideal = Double(min(concurrency, connections * 1000)) / (Double(rttMs) / 1000)
                record.set("efficiency_percent", rate / ideal * 100, decimals: 1)
            }
            if let steal = HostCPUTimes.stealPercent(since: hostAtStart) {
                record.set("host_steal_percent", steal, decimals: 1)
            }
            output.emit(record)
            records.append(record)
        }
        try output.finish(records, machine: BenchOutput.machine)
        await simulator.stop(timeout: .seconds(10))
    }
}
