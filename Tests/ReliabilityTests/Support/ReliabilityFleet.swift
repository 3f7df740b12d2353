import APNsCore
import APNsSimulator
import FleetLoad
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import ProcessLaunch
import Testing

/// A whole fleet on 127.0.0.1, every part a real process as in production: `apns-fleet kafka-dev`
/// (fault commands on its stdin), `apns-fleet simulator` (faults through its admin port) and two
/// or more `apns-fleet worker`s in one group. The test process publishes generated jobs at a
/// steady rate and reads every result back into a ``RunTally`` that knows what each job must get.
///
/// Every child is killed on the way out, whether the test passed, failed or threw.
final class ReliabilityFleet: Sendable {
    struct Options: Sendable {
        var name: String
        var brokers = 1
        var partitions = 8
        var replicationFactor = 1
        var workers = 2
        /// `worker.max-in-flight` of each worker: the duplicates bound is this per kill.
        var maxInFlight = 64
        var requestTimeoutSeconds = 10.0
        /// Extra simulator flags.
        var simulatorArguments: [String] = []
        /// Extra lines under `worker:` in the fleet file.
        var workerSettings: [String] = []
        /// The job generator's seed (the job mix is JobMix.realistic).
        var seed: UInt64 = 0x5EED_0001
    }

    let options: Options
    let directory: String
    let binary: String
    let kafka: ChildProcess
    let bootstrap: String
    let simulator: ChildProcess
    let simulatorAdminPort: Int
    let configPath: String
    let topics = (jobs: "apns.jobs", results: "apns.results", dlq: "apns.jobs.dlq")
    let tally: RunTally
    let idPrefix: String
    let generatorMarker: [UInt8]
    let producer: KafkaProducer
    let reader: KafkaConsumer
    let started = ContinuousClock.now

    /// Worker processes by slot ("w1", "w2", …); a killed worker is replaced in its slot.
    let workers = Shared<[String: ChildProcess]>([:])
    /// Every worker process ever started, for cleanup.
    private let everyWorker = Shared<[ChildProcess]>([])
    /// Highest VmHWM (kB) seen of any worker process.
    let peakWorkerRSSKilobytes = Shared<Int>(0)
    /// Jobs accepted by Kafka, and jobs whose publishing failed (never expected).
    let published = Shared<Int>(0)
    let publishFailures = Shared<[String]>([])
    /// Per `apns.jobs` partition: the latest `sent_at` of a result of a job from it.
    let latestResultByPartition = Shared<[Int32: Int64]>([:])
    /// Every expected "job/token" with where the job was written, and the ones answered: names
    /// what is missing when a run does not complete (RunTally only counts).
    let expectedKeys = Shared<[String: String]>([:])
    let answeredKeys = Shared<Set<String>>([])
    /// Non-JSON jobs whose delivery report carried no offset; see ``UnplacedJobs``.
    let unplaced = UnplacedJobs()
    /// Readable log of what the test did to the fleet, printed when a test fails.
    let events = Shared<[String]>([])

    private init(
        options: Options, directory: String, binary: String, kafka: ChildProcess, bootstrap: String, simulator: ChildProcess,
        simulatorAdminPort: Int, configPath: String, idPrefix: String, producer: KafkaProducer, reader: KafkaConsumer
    ) {
        self.options = options
        self.directory = directory
        self.binary = binary
        self.kafka = kafka
        self.bootstrap = bootstrap
        self.simulator = simulator
        self.simulatorAdminPort = simulatorAdminPort
        self.configPath = configPath
        self.idPrefix = idPrefix
        self.generatorMarker = Array(idPrefix.utf8)
        self.tally = RunTally(idPrefix: idPrefix)
        self.producer = producer
        self.reader = reader
    }

    /// Starts the fleet, runs `body`, and always tears everything down.
    static func run<T: Sendable>(_ options: Options, _ body: @Sendable (ReliabilityFleet) async throws -> T) async throws -> T {
        let binary = try apnsFleetBinary()
        let directory = NSTemporaryDirectory() + "apns-fleet-reliability-\(options.name)-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var children: [ChildProcess] = []
        defer {
            for child in children { child.kill() }
        }
        func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

        // Kafka: logs to a file, so that stdout carries only the bootstrap line and command answers.
        let kafka = ChildProcess("/bin/sh", [
            "-c", #"exec "$0" kafka-dev --brokers "$1" --partitions "$2" --replication-factor "$3" --log-level warning 2>>"$4""#,
            binary, String(options.brokers), String(options.partitions), String(options.replicationFactor), path("kafka-dev.log"),
        ])
        try kafka.start()
        children.append(kafka)
        let bootstrap = try await kafka.line(1, timeout: 60)

        // APNs: the simulator with dev credentials, told which generated tokens are dead.
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: path("credentials"))
        let idPrefix = "rel-\(options.name)-\(UUID().uuidString.prefix(6).lowercased())"
        let generator = Self.generator(options: options, idPrefix: idPrefix)
        let simulatorConfig = try Self.writeSimulatorConfig(directory: path("credentials"), summary: summary, deadTokens: generator.deadTokens)
        let simulator = ChildProcess("/bin/sh", [
            "-c", #"binary="$0"; config="$1"; shift; exec "$binary" simulator --config "$config" --h2-port 0 --h2c-port=-1 --admin-port 0 --gateway-port=-1 --gateway-plain-port=-1 --feedback-port=-1 --feedback-plain-port=-1 "$@" 2>&1"#,
            binary, simulatorConfig,
        ] + options.simulatorArguments)
        try simulator.start()
        children.append(simulator)
        try await waitUntil("the simulator to listen", timeout: 60) {
            simulator.lines.value.contains { $0.contains("apns-fleet simulator listening:") }
        }
        let listening = simulator.lines.value.first { $0.contains("apns-fleet simulator listening:") } ?? ""
        guard let h2Port = port(after: "h2 (TLS) 127.0.0.1:", in: listening), let adminPort = port(after: "admin http://127.0.0.1:", in: listening) else {
            throw TestSetupError("cannot read the simulator's ports from: \(listening)")
        }

        let configPath = path("fleet.yaml")
        try fleetFile(options: options, bootstrap: bootstrap, credentials: path("credentials"), summary: summary, simulatorPort: h2Port)
            .write(toFile: configPath, atomically: true, encoding: .utf8)

        var logger = Logger(label: "reliability-\(options.name)")
        logger.logLevel = .critical
        var client = KafkaClientConfiguration(bootstrapServers: [bootstrap])
        client.statisticsInterval = nil
        client.clientID = "reliability-test"
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reliability-reader-\(UUID().uuidString.prefix(8))", topics: ["apns.results", "apns.jobs.dlq", "apns.jobs"])
        readerConfiguration.sessionTimeout = .seconds(6)
        readerConfiguration.maxBatchSize = 5_000
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)

        let fleet = ReliabilityFleet(
            options: options, directory: directory, binary: binary, kafka: kafka, bootstrap: bootstrap, simulator: simulator,
            simulatorAdminPort: adminPort, configPath: configPath, idPrefix: idPrefix, producer: producer, reader: reader
        )
        defer {
            for worker in fleet.everyWorker.value { worker.kill() }
        }
        do {
            let value = try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask {
                    try await producer.run()
                    return nil
                }
                group.addTask {
                    try await reader.run()
                    return nil
                }
                group.addTask {
                    try await fleet.readResults()
                    return nil
                }
                group.addTask {
                    try await fleet.sampleMemory()
                    return nil
                }
                do {
                    for index in 1...options.workers { try fleet.startWorker("w\(index)") }
                    try await fleet.waitForAssignments(timeout: 60)
                    let value = try await body(fleet)
                    reader.close()
                    await producer.shutdown(flushTimeout: .seconds(5))
                    group.cancelAll()
                    return value
                } catch {
                    for worker in fleet.everyWorker.value { worker.kill() }
                    reader.close()
                    await producer.shutdown(flushTimeout: .seconds(1))
                    group.cancelAll()
                    throw error
                }
            }
            try? FileManager.default.removeItem(atPath: directory)
            return value
        } catch {
            // Everything needed to understand a failure: what was done, and how each process ended.
            print("reliability[\(options.name)] failed: \(error)")
            print(fleet.events.value.map { "  event: \($0)" }.joined(separator: "\n"))
            for (slot, worker) in fleet.workers.value.sorted(by: { $0.key < $1.key }) {
                // Invalid jobs are logged by design; the rest is what explains a failure.
                let interesting = worker.lines.value.filter { !$0.contains("job is invalid") }
                print("  \(slot) log tail:\n" + interesting.suffix(30).map { "    \($0)" }.joined(separator: "\n"))
            }
            for (index, worker) in fleet.everyWorker.value.enumerated() {
                try? worker.lines.value.joined(separator: "\n").write(toFile: path("worker-\(index + 1)-pid\(worker.pid).log"), atomically: true, encoding: .utf8)
            }
            print("  simulator tail:\n" + simulator.lines.value.suffix(10).map { "    \($0)" }.joined(separator: "\n"))
            print("  logs kept in \(directory)")
            throw error
        }
    }

    // MARK: - Setup

    static func generator(options: Options, idPrefix: String) -> JobGenerator {
        JobGenerator(mix: .realistic, topic: "com.example.app", fanoutSize: 4, deadTokenCount: 50, idPrefix: idPrefix, seed: options.seed)
    }

    private static func writeSimulatorConfig(directory: String, summary: DevCredentials.Summary, deadTokens: [String]) throws -> String {
        let base = (directory as NSString).appendingPathComponent(summary.simulatorConfigFile)
        guard let data = FileManager.default.contents(atPath: base), var config = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw TestSetupError("cannot read \(base)")
        }
        config["unregistered_tokens"] = Dictionary(uniqueKeysWithValues: deadTokens.map { ($0, Int64(1_767_225_600_000)) })
        let path = (directory as NSString).appendingPathComponent("reliability-simulator.json")
        guard FileManager.default.createFile(atPath: path, contents: try JSONSerialization.data(withJSONObject: config, options: [.sortedKeys])) else {
            throw TestSetupError("cannot write \(path)")
        }
        return path
    }

    /// The workers' `session.timeout.ms`: a killed worker stays in the group this long.
    static let workerSessionTimeoutMs: Int64 = 6_000

    private static func fleetFile(options: Options, bootstrap: String, credentials: String, summary: DevCredentials.Summary, simulatorPort: Int) -> String {
        func path(_ name: String) -> String { (credentials as NSString).appendingPathComponent(name) }
        return """
            kafka:
              bootstrap-servers: \(bootstrap)
              # The mock cluster rebalances after about session.timeout.ms (PITFALLS.md): keep it short.
              # Offsets are committed often, so that a killed worker leaves little to redo.
              properties: [session.timeout.ms=\(workerSessionTimeoutMs), heartbeat.interval.ms=500, auto.commit.interval.ms=100]
            apps: [example]
            app:
              example:
                key-file: \(path(summary.signingKeyFile))
                key-id: \(summary.keyID)
                team-id: \(summary.teamID)
                topic: com.example.app
                environment: custom
                host: 127.0.0.1
                port: \(simulatorPort)
                ca-file: \(path(summary.caFile))
                connections: 2
            worker:
              max-in-flight: \(options.maxInFlight)
              drain-timeout-seconds: 10
              request-timeout-seconds: \(options.requestTimeoutSeconds)
            \(options.workerSettings.map { "  \($0)" }.joined(separator: "\n"))
            retry:
              base-delay-ms: 100
            admin:
              port: 0

            """
    }

    static func port(after marker: String, in line: String) -> Int? {
        guard let range = line.range(of: marker) else { return nil }
        return Int(line[range.upperBound...].prefix { $0.isNumber })
    }

    // MARK: - Workers

    /// Starts `apns-fleet worker` in a slot; its log (stderr) is merged into the lines read.
    /// The shell `exec`s the worker, so the pid is the worker's and SIGKILL reaches it.
    @discardableResult
    func startWorker(_ slot: String) throws -> ChildProcess {
        let worker = ChildProcess("/bin/sh", [
            "-c", #"exec "$0" worker --config "$1" --set "worker.id=$2" --log-level info 2>&1"#, binary, configPath, slot,
        ])
        try worker.start()
        everyWorker.update { $0.append(worker) }
        workers.update { $0[slot] = worker }
        note("started \(slot) (pid \(worker.pid))")
        return worker
    }

    /// Every worker has been assigned some of the jobs partitions (each took part in a rebalance).
    func waitForAssignments(timeout: Double) async throws {
        let workers = self.workers
        try await waitUntil("every worker to be assigned partitions of apns.jobs", timeout: timeout) {
            workers.value.values.allSatisfy { worker in
                worker.lines.value.contains { $0.contains("partitions assigned") && $0.contains("apns.jobs[") }
            }
        }
    }

    /// SIGKILL: no drain, no commit, no goodbye to the group.
    func kill(_ slot: String) async throws -> Int64 {
        guard let worker = workers.value[slot] else { throw TestSetupError("no worker in slot \(slot)") }
        sampleMemoryNow()
        let at = Self.nowMillis()
        worker.signal(SIGKILL)
        let status = try await worker.waitForExit(timeout: 10)
        note("SIGKILL \(slot) (pid \(worker.pid)) at +\(elapsedMs()) ms, exit status \(status)")
        return at
    }

    /// SIGTERM to every worker at once; each drains, commits and exits 0.
    func stopWorkers() async throws -> [String: Int32] {
        sampleMemoryNow()
        let current = workers.value
        for worker in current.values { worker.signal(SIGTERM) }
        var statuses: [String: Int32] = [:]
        for (slot, worker) in current { statuses[slot] = try await worker.waitForExit(timeout: 40) }
        note("SIGTERM to every worker: exit statuses \(statuses.sorted { $0.key < $1.key })")
        return statuses
    }

    // MARK: - Memory

    /// VmHWM (peak resident set) of a process in kB, from /proc.
    static func peakRSSKilobytes(pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }) else { return nil }
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }

    func sampleMemoryNow() {
        for worker in workers.value.values where worker.isRunning {
            if let kilobytes = Self.peakRSSKilobytes(pid: worker.pid) {
                peakWorkerRSSKilobytes.update { $0 = max($0, kilobytes) }
            }
        }
    }

    private func sampleMemory() async throws {
        while !Task.isCancelled {
            sampleMemoryNow()
            try await Task.sleep(for: .milliseconds(250))
        }
    }

    var peakWorkerRSSMegabytes: Double { Double(peakWorkerRSSKilobytes.value) / 1024 }

    // MARK: - Jobs and results

    /// Publishes generated jobs at `rate` per second until `stop` is set or `limit` are sent, and
    /// returns how many were handed to the producer. A job is expected only once Kafka has
    /// acknowledged it (a job Kafka refused was never published, so it cannot be lost).
    func publish(rate: Double, limit: Int, stop: Shared<Bool>) async throws -> Int {
        var generator = Self.generator(options: options, idPrefix: idPrefix)
        let tally = self.tally
        let published = self.published
        let failures = self.publishFailures
        let expected = self.expectedKeys
        let unplaced = self.unplaced
        let begin = ContinuousClock.now
        var sent = 0
        while sent < limit, !stop.value {
            let due = begin + .nanoseconds(Int64(Double(sent) / rate * 1e9))
            if due > .now { try await Task.sleep(until: due) }
            let job = generator.next(now: Self.nowMillis())
            let message = KafkaOutgoingMessage(topic: topics.jobs, key: job.key, value: job.value, headers: job.headers)
            let onDelivery: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void = { result in
                switch result {
                case .success(let report):
                    published.update { $0 += 1 }
                    let position = SourcePosition(topic: report.topic, partition: report.partition, offset: report.offset)
                    // librdkafka reports a retried batch that the broker says it already has
                    // (DUPLICATE_SEQUENCE_NUMBER) as delivered at an unknown offset: the reader
                    // places such a job once it sees it in apns.jobs.
                    guard report.offset >= 0 else {
                        if let found = unplaced.acknowledged(id: job.id, kind: job.kind, expecting: job.expected) {
                            Self.expect(job.id, kind: job.kind, at: found, tokens: job.expected, tally: tally, keys: expected)
                        }
                        return
                    }
                    Self.expect(job.id, kind: job.kind, at: position, tokens: job.expected, tally: tally, keys: expected)
                case .failure(let error):
                    failures.update { $0.append("\(job.id): \(error)") }
                }
            }
            try await producer.sendWaitingForSpace(message, retryInterval: .milliseconds(5), onDelivery: onDelivery)
            sent += 1
        }
        return sent
    }

    /// Registers what a job must get, and where it was written (for naming what is missing). A
    /// job that is not JSON has no id of its own: the worker derives one from its offset.
    static func expect(
        _ generatedID: String, kind: JobMix.Kind, at position: SourcePosition, tokens: [(token: String, outcome: String)],
        tally: RunTally, keys: Shared<[String: String]>
    ) {
        let id = kind == .malformed ? position.derivedJobID : generatedID
        tally.expect(jobID: id, tokens: tokens, kind: kind)
        keys.update { keys in
            for (token, _) in tokens { keys["\(id)/\(token)"] = "\(position.topic)[\(position.partition)]@\(position.offset)" }
        }
    }

    private func readResults() async throws {
        let derivedPrefix = "\(topics.jobs)-"
        for try await batch in reader.batches {
            var latest: [Int32: Int64] = [:]
            var answered: [String] = []
            for record in batch {
                if record.topic == topics.results {
                    guard let result = try? NotificationResult(decoding: record.value) else {
                        if let watch = markerWatch.value, record.value == watch.0 { watch.1.update { _ = $0.insert(record.partition) } }
                        continue
                    }
                    tally.record(result, derivedIDPrefix: derivedPrefix)
                    answered.append("\(result.jobID)/\(result.token)")
                    if result.source.topic == topics.jobs, result.jobID.hasPrefix(idPrefix) || result.jobID.hasPrefix(derivedPrefix) {
                        latest[result.source.partition] = max(latest[result.source.partition] ?? 0, result.sentAt.value)
                    }
                } else if record.topic == topics.jobs {
                    guard let id = Self.generatedJobID(record.value) else { continue }
                    let position = SourcePosition(topic: record.topic, partition: record.partition, offset: record.offset)
                    if let waiting = unplaced.seen(id: id, at: position) {
                        Self.expect(id, kind: waiting.kind, at: position, tokens: waiting.tokens, tally: tally, keys: expectedKeys)
                    }
                } else if Self.contains(record.value, generatorMarker) {
                    tally.recordDeadLetter()
                }
            }
            if !answered.isEmpty { answeredKeys.update { $0.formUnion(answered) } }
            if !latest.isEmpty {
                latestResultByPartition.update { current in
                    for (partition, sentAt) in latest { current[partition] = max(current[partition] ?? 0, sentAt) }
                }
            }
            reader.markFinished(batch)
        }
    }

    /// Waits until every partition of apns.jobs has a result made after `since` (ms since the
    /// epoch): every partition is being served again. Returns the milliseconds from `since`.
    func waitForEveryPartitionServed(after since: Int64, timeout: Double, what: String) async throws -> Int64 {
        let partitions = Int32(options.partitions)
        let latest = latestResultByPartition
        do {
            try await waitUntil("results from every partition after \(what)", timeout: timeout) {
                let current = latest.value
                return (0..<partitions).allSatisfy { (current[$0] ?? 0) > since }
            }
        } catch {
            let current = latest.value
            let stalled = (0..<partitions).filter { (current[$0] ?? 0) <= since }
            note("partitions of apns.jobs without results since \(what): \(stalled)")
            noteWorkerMetrics()
            throw error
        }
        // The first result after `since` of the slowest partition is what marks recovery; the
        // latest one is at most one poll later, close enough at this resolution.
        let recovered = Self.nowMillis() - since
        note("every partition served again \(recovered) ms after \(what)")
        return recovered
    }

    /// Waits until every published job has all its results (or throws, naming what is missing).
    func waitForAllResults(published count: Int, timeout: Double) async throws {
        let tally = self.tally
        let published = self.published
        let failures = self.publishFailures
        try await waitUntil("every published job to be acknowledged by Kafka", timeout: 60) {
            published.value + failures.value.count >= count
        }
        do {
            try await waitUntil("a result for every token of every job", timeout: timeout) {
                let snapshot = tally.snapshot
                return snapshot.jobsRegistered == published.value - unplaced.neverSeen.count && snapshot.isComplete
            }
        } catch {
            let snapshot = tally.snapshot
            note("incomplete: \(snapshot.jobsRegistered - snapshot.jobsComplete) jobs, \(snapshot.notificationsExpected - snapshot.notificationsSeen) notifications without results")
            let answered = answeredKeys.value
            let missing = expectedKeys.value.filter { !answered.contains($0.key) }.sorted { $0.key < $1.key }
            for (key, position) in missing.prefix(10) {
                let jobID = String(key.prefix { $0 != "/" })
                // Whether a result was written at all (then the reader missed it) or not (the fleet did).
                let inKafka = await Self.grepTopic(bootstrap: bootstrap, topic: topics.results, for: jobID)
                let inRetry = await Self.grepTopic(bootstrap: bootstrap, topic: "apns.jobs.retry", for: jobID)
                let inJobs = await Self.grepTopic(bootstrap: bootstrap, topic: topics.jobs, for: jobID)
                note("missing \(key.prefix(40))… job at \(position); in apns.jobs: \(inJobs); results in apns.results: \(inKafka), copies in apns.jobs.retry: \(inRetry)")
            }
            throw error
        }
    }

    /// After the workers have stopped: one marker record on every results partition; once the
    /// reader has seen them all, it has read every result the workers ever wrote, so the
    /// duplicate count is final.
    func readEverything(timeout: Double) async throws {
        let seen = Shared<Set<Int32>>([])
        let marker = "reliability-marker-\(UUID().uuidString)"
        let partitions = Int32(options.partitions)
        markerWatch.update { $0 = (Array(marker.utf8), seen) }
        for partition in 0..<partitions {
            try await producer.send(KafkaOutgoingMessage(topic: topics.results, partition: partition, key: Array(marker.utf8), value: Array(marker.utf8)))
        }
        try await waitUntil("the reader to reach the end of apns.results", timeout: timeout) { seen.value.count == Int(partitions) }
    }

    /// The marker `readEverything` waits for, and where the reader notes which partitions had it.
    let markerWatch = Shared<([UInt8], Shared<Set<Int32>>)?>(nil)

    // MARK: - Fault injection

    /// One command on kafka-dev's stdin; returns its `ok …` answer, throws on `error: …`.
    @discardableResult
    func kafkaCommand(_ command: String) async throws -> String {
        let console = self.kafka
        let before = console.lines.value.count
        console.write(command + "\n")
        try await waitUntil("kafka-dev to answer '\(command)'", timeout: 10) {
            console.lines.value.dropFirst(before).contains { $0.hasPrefix("ok") || $0.hasPrefix("error") }
        }
        let answer = console.lines.value.dropFirst(before).first { $0.hasPrefix("ok") || $0.hasPrefix("error") } ?? ""
        note("kafka-dev \(command) → \(answer)")
        guard answer.hasPrefix("ok") else { throw TestSetupError("kafka-dev refused '\(command)': \(answer)") }
        return answer
    }

    /// One request to the simulator's admin endpoint; throws unless it answers 200.
    @discardableResult
    func simulatorAdmin(_ method: String, _ path: String) throws -> String {
        let response = try httpRequest(method: method, port: simulatorAdminPort, path: path)
        note("simulator \(method) \(path) → \(response.status) \(response.body.trimmingCharacters(in: .whitespacesAndNewlines).prefix(80))")
        guard response.status == 200 else { throw TestSetupError("simulator \(method) \(path): \(response.status) \(response.body)") }
        return response.body
    }

    func simulatorCounters() throws -> SimulatorCountersSnapshot {
        let response = try httpRequest(method: "GET", port: simulatorAdminPort, path: "/counters")
        return try JSONDecoder().decode(SimulatorCountersSnapshot.self, from: Data(response.body.utf8))
    }

    // MARK: - Helpers

    /// The gauges and counters that tell a stuck worker from an idle one, from each worker's /metrics.
    func noteWorkerMetrics() {
        for (slot, worker) in workers.value.sorted(by: { $0.key < $1.key }) {
            guard let line = worker.lines.value.first(where: { $0.contains("admin endpoint listening") }),
                let port = Self.port(after: "http://127.0.0.1:", in: line),
                let metrics = try? httpRequest(method: "GET", port: port, path: "/metrics")
            else { continue }
            let wanted = ["in_flight", "partitions_paused", "consumer_lag", "consumer_records", "producer_messages", "stalls", "msg_cnt", "notifications_total"]
            let lines = metrics.body.split(separator: "\n").filter { line in !line.hasPrefix("#") && wanted.contains { line.contains($0) } }
            note("\(slot) metrics: " + lines.prefix(40).joined(separator: "; "))
        }
    }

    /// How many records of `topic` contain `text`, read from the start with kcat (diagnostics only).
    static func grepTopic(bootstrap: String, topic: String, for text: String) async -> String {
        let script = #"timeout 20 kcat -b "$0" -C -t "$1" -e -q -f '%p@%o %s\n' 2>/dev/null | grep -F -- "$2" | head -5"#
        guard let process = try? LaunchedProcess(executable: "/bin/sh", arguments: ["-c", script, bootstrap, topic, text], standardOutput: .pipe) else {
            return "kcat unavailable"
        }
        let lines = String(decoding: await process.standardOutput?.collect() ?? [], as: UTF8.self).split(separator: "\n")
        return lines.isEmpty ? "none" : "\(lines.count): " + lines.map { String($0.prefix(60)) }.joined(separator: " | ")
    }

    func note(_ text: String) {
        events.update { $0.append("+\(elapsedMs()) ms \(text)") }
    }

    func elapsedMs() -> Int64 {
        let elapsed = ContinuousClock.now - started
        return elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000
    }

    static func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, haystack.count >= needle.count else { return false }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
            if haystack[start..<(start + needle.count)].elementsEqual(needle) { return true }
        }
        return false
    }
}

/// Jobs acknowledged at an unknown offset. librdkafka reports a retried batch that the broker
/// says it already has (DUPLICATE_SEQUENCE_NUMBER) as delivered without an offset; the mock
/// cluster also answers so for a sequence number merely older than the last five batches it
/// remembers, whether or not it ever wrote it. Such a job is expected only once the reader (which
/// also reads apns.jobs) has seen it there; either side may come first. One that never shows up
/// was never in the fleet's input, and is reported as such, not as lost.
final class UnplacedJobs: Sendable {
    struct Waiting: Sendable {
        var kind: JobMix.Kind
        var tokens: [(token: String, outcome: String)]
    }

    private struct State {
        var waiting: [String: Waiting] = [:]
        var seen: [String: SourcePosition] = [:]
    }

    private let state = Shared(State())

    /// A job acknowledged without an offset: its position if the reader already saw it; else it
    /// waits for ``seen(id:at:)``.
    func acknowledged(id: String, kind: JobMix.Kind, expecting tokens: [(token: String, outcome: String)]) -> SourcePosition? {
        var found: SourcePosition?
        state.update { state in
            if let position = state.seen.removeValue(forKey: id) {
                found = position
            } else {
                state.waiting[id] = Waiting(kind: kind, tokens: tokens)
            }
        }
        return found
    }

    /// A job read from apns.jobs: what it expects if it was waiting for its position; else the
    /// position is kept for a later ``acknowledged(id:kind:expecting:)``.
    func seen(id: String, at position: SourcePosition) -> Waiting? {
        var found: Waiting?
        state.update { state in
            if let waiting = state.waiting.removeValue(forKey: id) {
                found = waiting
            } else {
                state.seen[id] = position
            }
        }
        return found
    }

    /// Jobs acknowledged without an offset that apns.jobs does not hold (so far).
    var neverSeen: [String] { state.value.waiting.keys.sorted() }
}

extension ReliabilityFleet {
    /// The id a generated job carries: every one of them, even the truncated ones, starts with
    /// `{"id":"<id>"`.
    static func generatedJobID(_ value: [UInt8]) -> String? {
        let prefix = Array(#"{"id":""#.utf8)
        guard value.count > prefix.count, value.starts(with: prefix) else { return nil }
        let rest = value[prefix.count...]
        guard let end = rest.firstIndex(of: UInt8(ascii: "\"")) else { return nil }
        return String(decoding: rest[..<end], as: UTF8.self)
    }
}
