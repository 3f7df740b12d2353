import APNsCore
import FleetLoad
import Foundation
import KafkaTransport
import Logging
import Synchronization

/// One end-to-end measurement: a fresh local fleet (kafka-dev, simulator, N push workers, each
/// its own process), jobs published while the workers run, results followed until every job
/// is answered. Warm-up (the first results) is excluded; CPU comes from each worker process's
/// own accounting, over the whole run and after warm-up; latency from `meta.published_at` to
/// the result's `sent_at`.
struct FleetBench {
    struct Settings {
        var jobs = 100_000
        var warmup = 10_000
        var workers = 1
        var partitions = 8
        var rate: Double?
        var mix: JobMix = .allGood
        var apnsLatencyMs: Int?
        var maxInFlight: Int?
        /// Extra `--set` settings for every worker.
        var workerSettings: [String] = []
        var directory = ".bench"
        var timeout: Duration = .seconds(900)
    }

    let settings: Settings

    func run(index: Int, say: (String) -> Void) async throws -> BenchRecord {
        let runID = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        var options = LocalFleet.Options(directory: settings.directory, runID: runID)
        options.partitions = settings.partitions
        options.workers = settings.workers
        options.metricsPort = 19464
        options.mix = settings.mix
        options.feedbackWorker = false
        if let maxInFlight = settings.maxInFlight { options.workerSettings.append("worker.max-in-flight=\(maxInFlight)") }
        options.workerSettings += settings.workerSettings
        if let latency = settings.apnsLatencyMs { options.simulatorArguments += ["--latency-ms=\(latency)"] }
        let fleet = try await LocalFleet.start(options, say: say)
        do {
            let record = try await measure(fleet: fleet, runID: runID, index: index)
            await fleet.stop()
            return record
        } catch {
            await SpawnedProcess.holdIfInterrupted()
            fleet.kill()
            throw error
        }
    }

    private func measure(fleet: LocalFleet, runID: String, index: Int) async throws -> BenchRecord {
        var logger = Logger(label: "apns-fleet.bench") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = .error
        var client = KafkaClientConfiguration(bootstrapServers: [fleet.bootstrap])
        client.clientID = "apns-fleet-bench"
        client.statisticsInterval = nil
        var producerConfiguration = KafkaProducerConfiguration(client: client)
        // Latencies start at `published_at`, taken when a job is handed to the producer: at a set
        // rate, do not let it wait for a batch first.
        if settings.rate != nil { producerConfiguration.linger = .milliseconds(1) }
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "bench-reader-\(runID)", topics: [fleet.topics.results])
        // See DemoSimulatorSetup: the mock cluster holds every Fetch for fetch.wait.max.ms.
        if fleet.embeddedKafka { readerConfiguration.client.properties["fetch.wait.max.ms"] = "10" }
        readerConfiguration.sessionTimeout = .seconds(6)
        readerConfiguration.maxBatchSize = 5_000
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        let tally = RunTally(idPrefix: "demo-\(runID)-")
        let derivedPrefix = "\(fleet.topics.jobs)-"
        let settings = self.settings
        let initialGenerator = fleet.generator
        // kafka-dev drops the oldest records past about 5 MiB per partition: a reader that falls
        // that far behind loses results, which is checked for (a real broker's are kept).
        let followedTopic: String? = fleet.embeddedKafka ? fleet.topics.results : nil

        return try await withThrowingTaskGroup(of: Void.self, returning: BenchRecord.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    if let followedTopic { tally.noteRead(batch, topic: followedTopic) }
                    for record in batch {
                        if let result = try? NotificationResult(decoding: record.value) { tally.record(result, derivedIDPrefix: derivedPrefix) }
                    }
                    reader.markFinished(batch)
                }
            }
            let publisher = JobPublisher(producer: producer, topic: fleet.topics.jobs)
            // Worker CPU is measured twice: over the whole run (warm-up included, divided by every
            // notification) and after warm-up. The second window starts and ends at readings of
            // the workers themselves, their CPU time and their own count of notifications taken
            // together, not at what the result reader saw: the reader lags the workers by up to
            // seconds, and a window counted by what it read was measured far too low.
            let cpuAtStart = try Self.cpuSeconds(of: fleet.pushWorkers)
            // Jobs count as expected before Kafka takes them, so a publishing failure would show
            // only as a stall; the wait below reports it instead.
            let publishFailure = Mutex<String?>(nil)
            group.addTask {
                var generator = initialGenerator
                do {
                    let summary = try await publisher.publish(count: settings.jobs, generator: &generator, rate: settings.rate, tally: tally, clock: Self.nowMillis)
                    if summary.failed > 0 { throw CommandFailure("\(summary.failed) jobs were not accepted by Kafka: \(summary.firstError ?? "")") }
                } catch is CancellationError {
                } catch {
                    publishFailure.withLock { $0 = "publishing the jobs failed: \(error)" }
                }
            }

            // Wait for the end of the run.
            let started = ContinuousClock.now
            let hostAtStart = HostCPUTimes.now()
            var expected = 0
            var progress = (seen: -1, at: ContinuousClock.now)
            // The workers' own figures once they have finished the warm-up's worth of
            // notifications: the end of the run subtracts them, so that connecting and the first
            // batches stay out. Read every 250 ms until then, every second after (for the peak in
            // flight): rendering /metrics costs the workers CPU, which the run measures.
            var afterWarmup: WorkerReading?
            var peakInFlight = 0.0
            var nextReading = ContinuousClock.now
            while true {
                let snapshot = tally.snapshot
                expected = snapshot.notificationsExpected
                if ContinuousClock.now >= nextReading, let reading = try? Self.read(fleet.pushWorkers, ports: fleet.pushWorkerAdminPorts) {
                    nextReading = .now + (afterWarmup == nil ? .milliseconds(250) : .seconds(1))
                    peakInFlight = max(peakInFlight, reading.inFlight)
                    if afterWarmup == nil, reading.notifications >= Double(settings.warmup) { afterWarmup = reading }
                }
                if snapshot.jobsRegistered == settings.jobs, snapshot.isComplete { break }
                if snapshot.notificationsSeen != progress.seen { progress = (snapshot.notificationsSeen, .now) }
                // A stall, such as jobs kafka-dev dropped (it keeps about 5 MiB per partition)
                // before a worker read them, ends the run with the workers' logs instead of at --timeout.
                if ContinuousClock.now - progress.at > Self.stallLimit, let worker = fleet.pushWorkers.first {
                    throw CommandFailure("no new result for \(Self.stallLimit) with \(snapshot.notificationsExpected - snapshot.notificationsSeen) notifications unanswered (with kafka-dev, fewer --jobs may fit its 5 MiB per partition); the worker's log (\(worker.logPath)) ends:\n\(worker.logTail())")
                }
                if snapshot.recordsSkipped > 0 { throw CommandFailure(RunTally.skippedRecordsMessage(snapshot.recordsSkipped)) }
                if let failure = publishFailure.withLock({ $0 }) { throw CommandFailure(failure) }
                if let dead = fleet.processes.first(where: { !$0.isRunning }) {
                    throw CommandFailure("\(dead.name) exited during the run; its log (\(dead.logPath)) ends:\n\(dead.logTail())")
                }
                if ContinuousClock.now - started > settings.timeout {
                    throw CommandFailure("timed out with \(snapshot.notificationsExpected - snapshot.notificationsSeen) notifications unanswered")
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            let usages = try Self.usages(of: fleet.pushWorkers)
            let atEnd = try Self.read(fleet.pushWorkers, ports: fleet.pushWorkerAdminPorts)
            let added = atEnd?.added.map { total in afterWarmup?.added.map { total.subtracting($0) } ?? total }
            // Duplicates trail the last first result (a redelivered partition read later): give
            // them a moment before counting, as the demo does.
            try await Task.sleep(for: .seconds(1))
            let snapshot = tally.snapshot
            reader.close()
            await producer.shutdown(flushTimeout: .seconds(10))
            group.cancelAll()

            // Warm-up, rates and latencies go by the results' own `sent_at`, not by when the
            // benchmark read them: the reader lags the workers by up to seconds (more when it
            // shares a core with them) and catches up in bursts, so its timing overstated rates.
            let timings = snapshot.timings.sorted { $0.sentAtMs < $1.sentAtMs }
            guard timings.count > settings.warmup + 1 else {
                throw UsageError("the run ended before warm-up did (\(timings.count) results for a warm-up of \(settings.warmup)); raise --jobs or lower --warmup")
            }
            let measuredTimings = timings.dropFirst(settings.warmup)
            let first = measuredTimings.first?.sentAtMs ?? 0
            let seconds = Double((timings.last?.sentAtMs ?? first) - first) / 1000
            let measured = measuredTimings.count - 1
            let cpu = zip(usages, cpuAtStart).reduce(0.0) { $0 + ($1.0.cpuSeconds - $1.1) }
            let latencies = measuredTimings.compactMap(\.latencyMs).sorted()
            var record = BenchRecord()
            // `bench scaling` labels its own runs; `bench e2e --workers 2` stays e2e.
            record.set("suite", "e2e")
            record.set("run", "\(index)")
            record.set("workers", settings.workers)
            record.set("partitions", settings.partitions)
            record.set("jobs", settings.jobs)
            record.set("warmup_notifications", settings.warmup)
            record.set("notifications", measured)
            record.set("seconds", seconds, decimals: 2)
            record.set("notifications_per_second", Double(measured) / max(seconds, 1e-9), decimals: 0)
            // Jobs in proportion to their notifications (the same for one-token jobs).
            record.set("jobs_per_second", Double(measured) * Double(snapshot.jobsComplete) / Double(max(1, snapshot.notificationsSeen)) / max(seconds, 1e-9), decimals: 0)
            record.set("per_worker_notifications_per_second", Double(measured) / max(seconds, 1e-9) / Double(settings.workers), decimals: 0)
            record.set("worker_cpu_us_per_notification", cpu * 1e6 / Double(max(snapshot.notificationsSeen, 1)), decimals: 2)
            if let start = afterWarmup, let end = atEnd, end.notifications > start.notifications {
                record.set("worker_cpu_us_per_notification_after_warmup", (end.cpuSeconds - start.cpuSeconds) * 1e6 / (end.notifications - start.notifications), decimals: 2)
            }
            record.set("p50_ms", Percentiles.value(0.5, of: latencies) ?? 0, decimals: 1)
            record.set("p99_ms", Percentiles.value(0.99, of: latencies) ?? 0, decimals: 1)
            let toAPNs = measuredTimings.compactMap(\.toAPNsMs).sorted()
            record.set("to_apns_p50_ms", Percentiles.value(0.5, of: toAPNs) ?? 0, decimals: 1)
            record.set("to_apns_p99_ms", Percentiles.value(0.99, of: toAPNs) ?? 0, decimals: 1)
            // Bucket bounds of the workers' own histogram, from when it held the warm-up's worth
            // (over the whole run if it never did: fan-out jobs and retries are not in it).
            if let added, let p50 = added.quantileUpperBound(0.5), let p99 = added.quantileUpperBound(0.99) {
                record.set("worker_added_p50_le_ms", p50 * 1000, decimals: 2)
                record.set("worker_added_p99_le_ms", p99 * 1000, decimals: 2)
            }
            record.set("peak_rss_mb", Double(usages.map(\.peakResidentKilobytes).max() ?? 0) / 1024, decimals: 1)
            // Sampled (once a second after warm-up), so a lower bound of the true peak.
            record.set("peak_in_flight_sampled", Int(peakInFlight))
            if let maxInFlight = settings.maxInFlight { record.set("max_in_flight", maxInFlight) }
            record.set("lost", expected - snapshot.notificationsSeen)
            record.set("duplicates", snapshot.duplicates)
            // A result other than the one expected (a timeout under overload, say) still counts in
            // the rates and CPU above: the run says how many there were, and which.
            record.set("wrong_outcomes", snapshot.mismatches)
            if snapshot.mismatches > 0 {
                FileHandle.standardError.write(Data(("bench: \(snapshot.mismatches) results had an outcome other than expected, e.g.\n"
                    + snapshot.mismatchExamples.prefix(3).map { "  \($0)\n" }.joined()).utf8))
            }
            if let rate = settings.rate { record.set("publish_rate", rate, decimals: 0) }
            if let latency = settings.apnsLatencyMs { record.set("apns_latency_ms", latency) }
            if let steal = HostCPUTimes.stealPercent(since: hostAtStart) {
                record.set("host_steal_percent", steal, decimals: 1)
            }
            return record
        }
    }

    /// How long a run may go without a new result before it is called stalled.
    static let stallLimit: Duration = .seconds(60)

    static func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    /// The push workers' own figures at one moment, added together.
    struct WorkerReading {
        /// Notifications finished (`apns.worker.notifications`, every outcome).
        var notifications: Double
        var cpuSeconds: Double
        var inFlight: Double
        /// `apns.worker.added_latency`.
        var added: PrometheusHistogram?
    }

    /// Nil unless every worker answered on /metrics (a reading of some would not subtract from
    /// one of all); the CPU times are read right after, within a millisecond or so.
    static func read(_ workers: [SpawnedProcess], ports: [Int]) throws -> WorkerReading? {
        let texts = ports.compactMap { try? localHTTPRequest(method: "GET", port: $0, path: "/metrics").body }
        guard texts.count == ports.count else { return nil }
        let cpu = try cpuSeconds(of: workers).reduce(0, +)
        let text = texts.joined(separator: "\n")
        let samples = prometheusSamples(text)
        return WorkerReading(
            notifications: samples.filter { $0.name == "apns_worker_notifications" }.reduce(0) { $0 + $1.value },
            cpuSeconds: cpu,
            inFlight: samples.filter { $0.name == "apns_worker_in_flight" }.reduce(0) { $0 + $1.value },
            added: PrometheusHistogram(text, name: "apns_worker_added_latency")
        )
    }

    /// Each worker's CPU time (user and system, every thread) so far.
    static func cpuSeconds(of workers: [SpawnedProcess]) throws -> [Double] {
        try usages(of: workers).map(\.cpuSeconds)
    }

    /// Each worker's CPU time and memory; an error, not a silent 0, when one cannot be read.
    static func usages(of workers: [SpawnedProcess]) throws -> [ChildUsage] {
        try workers.map { worker in
            guard let usage = ChildUsage.of(pid: worker.pid) else {
                throw CommandFailure("cannot read the CPU time and memory of \(worker.name) (pid \(worker.pid)) from /proc")
            }
            return usage
        }
    }
}
