import APNsCore
import APNsSimulator
import FleetLoad
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

/// `apns-fleet worker` as a process: what its admin endpoint says, and how it reacts to signals.
@Suite("Worker lifecycle", .timeLimit(.minutes(2)))
struct WorkerLifecycleTests {
    /// Waits until the worker has notifications in flight at APNs.
    static func waitForInFlight(port: Int) async throws {
        try await waitUntil("notifications in flight", timeout: 45) {
            let metrics = (try? httpGet(port: port, path: "/metrics").body) ?? ""
            return prometheusSamples(metrics).contains { $0.name == "apns_worker_in_flight" && $0.value > 0 }
        }
    }

    @Test("a second SIGTERM while draining exits at once, non-zero, with one log line")
    func secondSignalExitsAtOnce() async throws {
        // APNs answers after 30 s: a drain would take that long.
        let backends = try await ProcessFleetBackends.start(name: "lifecycle", partitions: 4) { $0.behaviour.latency = .seconds(30) }
        defer { backends.kill() }
        let config = try backends.fleetFile(extra: "worker:\n  request-timeout-seconds: 60\n  drain-timeout-seconds: 60")
        let worker = try startWorker(binary: backends.binary, config: config, id: "w-impatient")
        defer { worker.kill() }
        try await backends.publishJobs(10, prefix: "slow")

        // Wait for notifications in flight at APNs, then ask for a drain: it cannot finish soon.
        try await Self.waitForInFlight(port: try await worker.adminPort())
        worker.signal(SIGTERM)
        try await waitUntil("the worker to start draining", timeout: 10) { !worker.output(containing: "draining").isEmpty }
        try await Task.sleep(for: .milliseconds(500))
        #expect(worker.isRunning, "still draining: the answers are 30 s away")

        let clock = ContinuousClock()
        let secondSignal = clock.now
        worker.signal(SIGTERM)
        let status = try await worker.waitForExit(timeout: 10)
        let took = clock.now - secondSignal
        #expect(status == 143, "128 + SIGTERM")
        #expect(took < .seconds(10), "exited \(took) after the second signal, not after the 30 s answers")
        #expect(worker.output(containing: "exiting now").count == 1, "\(worker.lines.value.suffix(5))")
        await backends.stop()
    }

    @Test("a stop that cannot flush (Kafka gone) ends with status 1 and a line saying so, not a crash")
    func overdueStopExitsCleanly() async throws {
        let backends = try await ProcessFleetBackends.start(name: "overdue", partitions: 2) { $0.behaviour.latency = .seconds(2) }
        defer { backends.kill() }
        let config = try backends.fleetFile(extra: "worker:\n  drain-timeout-seconds: 1")
        let worker = try startWorker(binary: backends.binary, config: config, id: "w-overdue")
        defer { worker.kill() }
        try await backends.publishJobs(5, prefix: "o")
        try await Self.waitForInFlight(port: try await worker.adminPort())
        // Kafka goes away with the answers still to come: their results can never be flushed.
        backends.kafka.process.kill()
        worker.signal(SIGTERM)
        // The budget is the drain timeout (1 s) + 15 s, then the exit comes 3 s later.
        let status = try await worker.waitForExit(timeout: 40)
        #expect(status == 1, "\(worker.lines.value.suffix(5))")
        #expect(worker.output(containing: "did not finish within").count == 1, "\(worker.lines.value.suffix(5))")
        await backends.stop()
    }

    @Test("/readyz turns 503, naming the app, once APNs keeps rejecting its provider tokens, though it is connected")
    func readinessFollowsTokenRejections() async throws {
        // A simulator that knows no signing key: the worker's tokens are rejected (a wrong key id
        // or team id in a rollout looks the same), though TLS and HTTP/2 are fine.
        let backends = try await ProcessFleetBackends.start(name: "rejected", partitions: 2) { $0.authentication.tokenKeys = [] }
        defer { backends.kill() }
        let worker = try startWorker(binary: backends.binary, config: try backends.fleetFile(), id: "w-rejected")
        defer { worker.kill() }
        let port = try await worker.adminPort()
        try await waitUntil("the worker to be ready (connected, no request yet)", timeout: 30) { (try? httpGet(port: port, path: "/readyz").status) == 200 }
        try await backends.publishJobs(5, prefix: "r")
        try await waitUntil("/readyz to report the rejected tokens", timeout: 30) {
            guard let response = try? httpGet(port: port, path: "/readyz") else { return false }
            return response.status == 503 && response.body.contains("rejected") && response.body.contains("example")
        }
        #expect(try httpGet(port: port, path: "/healthz").status == 200)
        worker.signal(SIGTERM)
        #expect(try await worker.waitForExit(timeout: 30) == 0)
        await backends.stop()
    }

    @Test("/metrics counts what happened; /readyz follows partitions and APNs; /healthz is 200")
    func metricsAndReadiness() async throws {
        var logger = Logger(label: "worker-lifecycle-test")
        logger.logLevel = .warning
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-metrics")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: 4, console: true)
        defer { kafka.process.kill() }
        // Its one broker down until the worker has answered /readyz: the worker cannot join the
        // group before, so that answer does not depend on how fast the join would have been.
        try await kafka.command("broker-down 1")

        let dead = String(repeating: "de", count: 32)
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        var simulatorConfiguration = try credentials.simulatorConfiguration()
        simulatorConfiguration.listeners.http2TLSPort = 0
        simulatorConfiguration.behaviour.unregisteredTokens = [dead: 1_767_225_600_000]
        let simulator = try await APNsSimulator.start(simulatorConfiguration, logger: logger)
        let config = try writeFleetFile(
            directory: directory, summary: summary, simulatorPort: try #require(simulator.port(.http2TLS)), bootstrap: kafka.bootstrap
        )

        let worker = try startWorker(binary: binary, config: config, id: "w-metrics")
        defer { worker.kill() }
        let port = try await worker.adminPort()
        #expect(try httpGet(port: port, path: "/healthz").status == 200)
        let early = try httpGet(port: port, path: "/readyz")
        #expect(early.status == 503 && early.body.contains("no partitions assigned"), "\(early)")
        try await kafka.command("broker-up 1")
        try await waitUntil("the worker to be ready", timeout: 30) { (try? httpGet(port: port, path: "/readyz").status) == 200 }

        // Jobs of every kind; each result will be matched against the counters.
        let good = (0..<30).map { String(repeating: "0", count: 62) + String(format: "%02x", $0) }
        var jobs: [String] = []
        for (index, token) in good.enumerated() { jobs.append(#"{"id":"g\#(index)","token":"\#(token)","payload":{"aps":{}}}"#) }
        for index in 0..<5 { jobs.append(#"{"id":"d\#(index)","token":"\#(dead)","payload":{}}"#) }
        jobs.append(#"{"id":"fan","tokens":["\#(good[0])","\#(dead)","\#(good[1])"],"payload":{}}"#)
        for index in 0..<3 { jobs.append(#"{"id":"broken-\#(index)","token":"#) }
        for index in 0..<2 { jobs.append(#"{"id":"ghost-\#(index)","token":"\#(good[2])","payload":{},"app":"ghost"}"#) }
        for index in 0..<2 { jobs.append(#"{"id":"big-\#(index)","token":"\#(good[3])","push_type":"alert","payload":{"b":"\#(String(repeating: "x", count: 4200))"}}"#) }
        let notifications = 30 + 5 + 3 + 3 + 2 + 2

        var client = KafkaClientConfiguration(bootstrapServers: [kafka.bootstrap])
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: ["apns.results"])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        let results = Collected<NotificationResult>()
        let ends = Shared<[Int32: Int64]>([:])
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch { results.append(try NotificationResult(decoding: record.value)) }
                    reader.markFinished(batch)
                }
            }
            for job in jobs {
                let report = try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", key: nil, value: Array(job.utf8)))
                ends.update { $0[report.partition] = max($0[report.partition] ?? 0, report.offset + 1) }
            }
            try await waitUntil("a result per notification", timeout: 60) { results.count >= notifications }
            try await Task.sleep(for: .milliseconds(300))
            reader.close()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        #expect(results.count == notifications)

        // What the results say, in the counters' labels.
        var expected: [String: Double] = [:]
        for result in results.items {
            var reason = "none"
            if result.status != nil, let text = result.reason { reason = String(text.prefix { $0.isLetter }) }
            // An app the worker does not serve is counted as "unknown": a label per made-up
            // name would grow /metrics without end.
            let app = result.app.map { $0 == "example" ? $0 : "unknown" } ?? "none"
            let key = "\(result.outcome.rawValue)/\(result.status.map(String.init) ?? "none")/\(reason)/\(app)"
            expected[key, default: 0] += 1
        }
        #expect(expected["delivered/200/none/example"] == 32)
        #expect(expected["rejected/410/Unregistered/example"] == 6)
        #expect(expected["invalid/none/none/unknown"] == 2, "the jobs for app ghost")

        // Offsets are stored a moment after the last result: wait for the gauge to reach the end.
        let endOffsets = ends.value
        var samples: [PrometheusSample] = []
        try await waitUntil("stored offsets to reach the end of apns.jobs", timeout: 15) {
            guard let text = try? httpGet(port: port, path: "/metrics").body else { return false }
            let stored = prometheusSamples(text).filter { $0.name == "kafka_consumer_offset_stored" && $0.labels["topic"] == "apns.jobs" }
            return endOffsets.allSatisfy { partition, end in stored.contains { $0.labels["partition"] == "\(partition)" && $0.value == Double(end) } }
        }
        samples = prometheusSamples(try httpGet(port: port, path: "/metrics").body)

        var counted: [String: Double] = [:]
        for sample in samples where sample.name == "apns_worker_notifications" && sample.value > 0 {
            let key = ["outcome", "status", "reason", "app"].map { sample.labels[$0] ?? "?" }.joined(separator: "/")
            counted[key, default: 0] += sample.value
        }
        #expect(counted == expected)
        func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
            samples.first { sample in sample.name == name && labels.allSatisfy { sample.labels[$0.key] == $0.value } }?.value
        }
        #expect(value("kafka_consumer_records", ["client": "w-metrics"]) == Double(jobs.count), "jobs consumed")
        #expect(value("apns_worker_dlq", ["topic": "apns.jobs"]) == 7, "bad JSON, unknown app, oversize")
        // At 0 from the start, not absent: alerts on `increase()` see the first one.
        #expect(value("apns_worker_dlq", ["topic": "apns.jobs.retry"]) == 0)
        #expect((value("kafka_consumer_stalls", ["client": "w-metrics"]) ?? value("kafka_consumer_stalls_total", ["client": "w-metrics"])) == 0)
        #expect(value("apns_worker_in_flight") == 0)
        #expect(value("apns_worker_added_latency_count") == 35, "one-token jobs APNs answered (the fan-out job's three are not timed)")
        #expect(value("apns_worker_added_latency_bucket", ["le": "0.002"]) != nil, "millisecond buckets, to judge the 2 ms target")
        #expect(value("apns_worker_partitions_paused", ["reason": "back_pressure"]) == 0)
        #expect(value("apns_worker_partitions_paused", ["reason": "retry_wait"]) == 0)
        // The client's own figures carry the pool's environment too (custom: the simulator).
        #expect(value("apns_client_requests", ["app": "example", "environment": "custom", "status": "200"]) == 32)
        #expect((value("apns_client_connections_usable", ["app": "example", "environment": "custom"]) ?? 0) >= 1)
        // By state, and the smallest stream limit: the simulator's 1000 once a token was accepted.
        #expect((value("apns_client_connections_open", ["app": "example", "state": "ready"]) ?? 0) >= 1)
        #expect(value("apns_client_connections_open", ["app": "example", "state": "going_away"]) == 0)
        #expect(value("apns_client_stream_limit_min", ["app": "example"]) == 1000)

        // APNs goes away: not ready any more, though still alive.
        await simulator.stop(gracePeriod: .zero)
        try await waitUntil("/readyz to report no usable APNs connection", timeout: 20) {
            guard let response = try? httpGet(port: port, path: "/readyz") else { return false }
            return response.status == 503 && response.body.contains("no usable APNs connection")
        }
        #expect(try httpGet(port: port, path: "/healthz").status == 200)

        worker.signal(SIGTERM)
        #expect(try await worker.waitForExit(timeout: 30) == 0)
    }
}
