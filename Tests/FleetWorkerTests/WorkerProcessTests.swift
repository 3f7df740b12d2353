import APNsCore
import APNsSimulator
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

/// `apns-fleet worker` as its own process, beside `apns-fleet kafka-dev` (also a process) and the
/// simulator: SIGTERM in the middle of a run drains, exits 0, and loses nothing.
@Suite("Worker process", .timeLimit(.minutes(4)))
struct WorkerProcessTests {
    @Test("SIGTERM mid-run drains and exits 0; a second worker finishes the rest with no loss")
    func sigtermDrainsWithoutLoss() async throws {
        var logger = Logger(label: "worker-process-test")
        logger.logLevel = .warning
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-worker-process")
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: 4)
        defer { kafka.process.kill() }
        let bootstrap = kafka.bootstrap

        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        let dead = String(repeating: "de", count: 32)
        var simulatorConfiguration = try credentials.simulatorConfiguration()
        simulatorConfiguration.listeners.http2TLSPort = 0
        simulatorConfiguration.behaviour.unregisteredTokens = [dead: 1_767_225_600_000]
        // Answers take a while and few are in flight (about 100 a second), so SIGTERM finds
        // work in flight and work still queued in Kafka however fast the machine is.
        simulatorConfiguration.behaviour.latency = .milliseconds(200)
        let simulator = try await APNsSimulator.start(simulatorConfiguration, logger: logger)
        let port = try #require(simulator.port(.http2TLS))

        let config = try writeFleetFile(
            directory: directory, summary: summary, simulatorPort: port, bootstrap: bootstrap,
            extra: "worker:\n  max-in-flight: 20\n  drain-timeout-seconds: 20"
        )

        // 200 jobs; every tenth is a fan-out to three tokens, one of them unregistered.
        var client = KafkaClientConfiguration(bootstrapServers: [bootstrap])
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        var expected: [String: String] = [:]
        for index in 0..<200 {
            let token = String(repeating: "0", count: 56) + String(repeating: "0", count: 8 - String(index).count) + String(index)
            if index % 10 == 0 {
                try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", key: nil, value: Array(#"{"id":"j\#(index)","tokens":["\#(token)","\#(dead)","\#(token.replacingOccurrences(of: "00000000", with: "11111111"))"],"payload":{}}"#.utf8)))
                expected["j\(index)/\(token)"] = "delivered"
                expected["j\(index)/\(dead)"] = "rejected"
                expected["j\(index)/\(token.replacingOccurrences(of: "00000000", with: "11111111"))"] = "delivered"
            } else {
                try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", key: nil, value: Array(#"{"id":"j\#(index)","token":"\#(token)","payload":{"aps":{"alert":"\#(index)"}}}"#.utf8)))
                expected["j\(index)/\(token)"] = "delivered"
            }
        }

        let expectedCount = expected.count
        let results = Shared<[String: [String]]>([:])
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: ["apns.results"])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch {
                        let result = try NotificationResult(decoding: record.value)
                        results.update { $0["\(result.jobID)/\(result.token)", default: []].append(result.outcome.rawValue) }
                    }
                    reader.markFinished(batch)
                }
            }

            // Results are watched as they come, so the reader must be in its group before any.
            try await waitUntil("the results reader to be assigned its partitions", timeout: 60) { !reader.assignment.isEmpty }
            let first = ChildProcess(binary, ["worker", "--config", config, "--log-level", "warning"])
            try first.start()
            defer { first.kill() }
            try await waitUntil("the first worker to publish some results", timeout: 90) { results.value.count >= 40 }
            first.signal(SIGTERM)
            let status = try await first.waitForExit(timeout: 60)
            #expect(status == 0, "a drained worker exits 0")
            let afterFirst = results.value.count
            #expect(afterFirst < expectedCount, "SIGTERM came mid-run")

            let second = ChildProcess(binary, ["worker", "--config", config, "--log-level", "warning"])
            try second.start()
            defer { second.kill() }
            try await waitUntil("every notification to have a result", timeout: 120) { results.value.count >= expectedCount }
            // The second worker did part of the work, so its signal handlers are installed.
            second.signal(SIGTERM)
            #expect(try await second.waitForExit(timeout: 60) == 0)

            reader.close()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop()

        let seen = results.value
        let missing = expected.keys.filter { seen[$0] == nil }
        #expect(missing.isEmpty, "lost: \(missing.sorted().prefix(5))")
        for (key, outcome) in expected {
            #expect(seen[key]?.allSatisfy { $0 == outcome } == true, "\(key): \(seen[key] ?? [])")
        }
        let duplicates = seen.values.reduce(0) { $0 + $1.count - 1 }
        // At-least-once: work in flight at SIGTERM may be redone, never more than the in-flight bound.
        #expect(duplicates <= 20, "duplicates: \(duplicates)")
        #expect(seen.keys.count == expected.count, "no result for a notification that was never asked for")
    }
}

extension WorkerProcessTests {
    @Test("a worker whose every app uses the binary interface stays up, delivers, and drains on SIGTERM")
    func binaryOnlyWorker() async throws {
        let backends = try await ProcessFleetBackends.start(name: "binary-only", partitions: 2) { configuration in
            configuration.listeners.legacyGatewayTLSPort = 0
        }
        defer { backends.kill() }
        let gateway = try #require(backends.simulator.port(.legacyGatewayTLS))
        func path(_ file: String) -> String { (backends.directory as NSString).appendingPathComponent(file) }
        let config = path("fleet-binary.yaml")
        try """
            kafka:
              bootstrap-servers: \(backends.kafka.bootstrap)
              properties: [session.timeout.ms=6000]
            apps: [legacy]
            app:
              legacy:
                auth: certificate
                certificate-file: \(path(backends.summary.clientCertificateFile))
                private-key-file: \(path(backends.summary.clientKeyFile))
                protocol: binary
                legacy-gateway: 127.0.0.1:\(gateway)
                ca-file: \(path(backends.summary.caFile))
                topic: com.example.app
                legacy-quiet-period-ms: 200
            admin:
              port: 0
            """.write(toFile: config, atomically: true, encoding: .utf8)

        let worker = try startWorker(binary: backends.binary, config: config, id: "w-binary")
        defer { worker.kill() }
        let port = try await worker.adminPort()
        do {
            try await waitUntil("the worker to be ready", timeout: 30) { (try? httpGet(port: port, path: "/readyz").status) == 200 }
        } catch {
            Issue.record("not ready (running: \(worker.isRunning)): \(worker.lines.value.suffix(12).joined(separator: "\n"))")
            throw error
        }
        try await backends.publishJobs(3, prefix: "binary")
        try await waitUntil("the three notifications to reach the gateway", timeout: 30) {
            (backends.simulator.legacy?.counts.accepted ?? 0) >= 3
        }
        // A service that returned early (the HTTP/2 pools, with no app of theirs) would have
        // stopped the whole process by now.
        try await Task.sleep(for: .seconds(2))
        #expect(worker.isRunning, "\(worker.lines.value.suffix(8))")
        worker.signal(SIGTERM)
        #expect(try await worker.waitForExit(timeout: 60) == 0, "\(worker.lines.value.suffix(8))")
        await backends.simulator.stop(gracePeriod: .zero)
    }
}
