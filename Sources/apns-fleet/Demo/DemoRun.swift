import APNsCore
import FleetLoad
import FleetWorker
import Foundation
import KafkaTransport
import Logging

/// One demo run: publish the jobs, follow results, DLQ and token events until every job is
/// accounted for, then judge and report.
struct DemoRun {
    struct Outcome {
        /// The summary, without its verdict.
        var summary: [String]
        var problems: [String]

        var passed: Bool { problems.isEmpty }

        /// The summary and its verdict: PASS, or FAIL with every problem.
        var report: String {
            var lines = summary
            if problems.isEmpty {
                lines.append("PASS: every job got all its results with the expected outcome; nothing lost; every process stopped cleanly.")
            } else {
                lines.append("FAIL:")
                lines += problems.map { "  - \($0)" }
            }
            return lines.joined(separator: "\n")
        }
    }

    let topics: TopicNames
    let runID: String
    private let producer: KafkaProducer
    private let reader: KafkaConsumer
    private let tally: RunTally
    /// Against kafka-dev, which keeps about 5 MiB per partition: a reader far behind loses results.
    private let embeddedKafka: Bool

    init(bootstrap: String, embeddedKafka: Bool, topics: TopicNames, runID: String, logger: Logger) throws {
        self.embeddedKafka = embeddedKafka
        self.topics = topics
        self.runID = runID
        var client = KafkaClientConfiguration(bootstrapServers: [bootstrap])
        client.clientID = "apns-fleet-demo"
        client.statisticsInterval = nil
        producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        var readerConfiguration = KafkaConsumerConfiguration(
            client: client, groupID: "apns-fleet-demo-reader-\(runID)",
            topics: [topics.results, topics.tokenEvents, topics.deadLetter]
        )
        readerConfiguration.sessionTimeout = .seconds(6)
        readerConfiguration.maxBatchSize = 5_000
        // See DemoSimulatorSetup: the mock cluster holds every Fetch for fetch.wait.max.ms.
        if embeddedKafka { readerConfiguration.client.properties["fetch.wait.max.ms"] = "10" }
        reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        tally = RunTally(idPrefix: "demo-\(runID)-")
    }

    func execute(jobs: Int, generator: JobGenerator, rate: Double?, timeout: Duration, processes: [SpawnedProcess]) async throws -> Outcome {
        var generator = generator
        let tally = self.tally
        let topics = self.topics
        let reader = self.reader
        let embeddedKafka = self.embeddedKafka
        let marker = Array("demo-\(runID)-".utf8)
        let derivedPrefix = "\(topics.jobs)-"
        let started = ContinuousClock.now
        let wallStart = Date()

        return try await withThrowingTaskGroup(of: Void.self, returning: Outcome.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    if embeddedKafka { tally.noteRead(batch, topic: topics.results) }
                    for record in batch {
                        if record.topic == topics.results {
                            if let result = try? NotificationResult(decoding: record.value) {
                                tally.record(result, derivedIDPrefix: derivedPrefix)
                            }
                        } else if record.topic == topics.tokenEvents {
                            if let event = try? TokenEvent(decoding: record.value), event.jobID?.hasPrefix("demo-\(runID)-") == true {
                                tally.record(tokenEvent: event)
                            }
                        } else if Self.contains(record.value, marker) {
                            tally.recordDeadLetter(source: (try? DeadLetterHeaders(headers: record.headers))?.source.derivedJobID)
                        }
                    }
                    reader.markFinished(batch)
                }
            }

            // Publish.
            let publisher = JobPublisher(producer: producer, topic: topics.jobs)
            var publishing = ProgressLine(label: "publishing", total: jobs)
            let published = try await publisher.publish(count: jobs, generator: &generator, rate: rate, tally: tally, clock: Self.nowMillis) {
                publishing.update($0)
            }
            publishing.finish()
            guard published.failed == 0 else {
                throw CommandFailure("\(published.failed) jobs were not accepted by Kafka; the first error: \(published.firstError ?? "unknown")")
            }
            let deadTokens = generator.usedDeadTokens
            let expectedEvents = deadTokens.count

            // Follow until everything is in, a process dies, or time is up.
            var following = ProgressLine(label: "results   ", total: max(tally.snapshot.notificationsExpected, 1))
            // From the end of publishing: a paced run (--rate) may publish for longer than that.
            let deadline = ContinuousClock.now + timeout
            var failure: String?
            var completedAt: ContinuousClock.Instant?
            while true {
                let snapshot = tally.snapshot
                following.update(snapshot.notificationsSeen, detail: "jobs \(ProgressLine.grouped(snapshot.jobsComplete))/\(ProgressLine.grouped(jobs))")
                let unusable = snapshot.jobsByKind.filter { $0.key.isUnusable }.reduce(0) { $0 + $1.value }
                if snapshot.jobsRegistered == jobs, snapshot.isComplete {
                    completedAt = completedAt ?? .now
                    // Token events and dead letters trail the results a little.
                    let trailing = snapshot.distinctTokenEvents >= expectedEvents && snapshot.deadLetters >= unusable
                    if trailing || ContinuousClock.now - (completedAt ?? .now) > .seconds(20) { break }
                }
                if let dead = processes.first(where: { !$0.isRunning }) {
                    failure = "\(dead.name) exited during the run; its log (\(dead.logPath)) ends:\n\(dead.logTail())"
                    break
                }
                if snapshot.recordsSkipped > 0, !(snapshot.jobsRegistered == jobs && snapshot.isComplete) {
                    failure = RunTally.skippedRecordsMessage(snapshot.recordsSkipped)
                    break
                }
                if ContinuousClock.now > deadline {
                    failure = "timed out after \(timeout) with \(snapshot.jobsRegistered - snapshot.jobsComplete) jobs still waiting for results"
                    break
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            following.finish()
            let elapsed = ((completedAt ?? .now) - started).seconds
            // Let stray duplicates arrive before judging.
            try await Task.sleep(for: .seconds(1))
            reader.close()
            await producer.shutdown(flushTimeout: .seconds(10))
            group.cancelAll()

            return Self.judge(
                tally.snapshot, jobs: jobs, deadTokens: deadTokens, published: published,
                elapsed: elapsed, startedAt: wallStart, failure: failure
            )
        }
    }

    static func judge(
        _ snapshot: RunTally.Snapshot, jobs: Int, deadTokens: Set<String>, published: JobPublisher.Summary,
        elapsed: Double, startedAt: Date, failure: String?
    ) -> Outcome {
        let unusable = snapshot.jobsByKind.filter { $0.key.isUnusable }.reduce(0) { $0 + $1.value }
        var problems: [String] = failure.map { [$0] } ?? []
        if snapshot.jobsComplete != jobs { problems.append("\(jobs - snapshot.jobsComplete) jobs did not get all their results") }
        if snapshot.mismatches > 0 {
            problems.append("\(snapshot.mismatches) results had the wrong outcome:\n" + snapshot.mismatchExamples.map { "    \($0)" }.joined(separator: "\n"))
        }
        if snapshot.deadLetters != unusable { problems.append("the DLQ holds \(snapshot.deadLetters) of this run's jobs; \(unusable) were unusable") }
        let expectedEvents = deadTokens.count
        let missing = deadTokens.subtracting(snapshot.eventTokens)
        let unexpected = snapshot.eventTokens.subtracting(deadTokens)
        if !missing.isEmpty {
            problems.append("\(missing.count) of the \(expectedEvents) dead tokens used got no token event (one: \(missing.sorted()[0].prefix(12))…)")
        }
        if !unexpected.isEmpty {
            problems.append("\(unexpected.count) tokens that were not dead got a token event (one: \(unexpected.sorted()[0].prefix(12))…)")
        }

        let g = ProgressLine.grouped
        let latencies = snapshot.latenciesMs.sorted()
        func ms(_ fraction: Double) -> String {
            Percentiles.value(fraction, of: latencies).map { String(format: "%.0f ms", $0) } ?? "n/a"
        }
        var lines: [String] = []
        lines.append("")
        lines.append("apns-fleet demo — summary")
        lines.append("  jobs published          \(g(published.published)) in \(String(format: "%.1f", published.seconds)) s (\(g(Int(Double(published.published) / max(published.seconds, 0.001))))/s)")
        let kinds = snapshot.jobsByKind.sorted { $0.key < $1.key }.map { "\($0.key.rawValue) \(g($0.value))" }.joined(separator: ", ")
        lines.append("    by kind               \(kinds)")
        lines.append("  jobs with all results   \(g(snapshot.jobsComplete)) / \(g(jobs))")
        lines.append("  notifications           \(g(snapshot.notificationsSeen)) of \(g(snapshot.notificationsExpected)) expected; \(g(snapshot.duplicates)) duplicates, \(g(snapshot.mismatches)) wrong")
        lines.append("")
        lines.append("  outcome / status / reason                  count")
        for (key, count) in snapshot.outcomes.sorted(by: { $0.value > $1.value }) {
            lines.append("  " + key.replacingOccurrences(of: "/", with: " / ").padding(toLength: 40, withPad: " ", startingAt: 0) + g(count).leftPadded(9))
        }
        lines.append("")
        lines.append("  dead-letter records     \(g(snapshot.deadLetters)) jobs\(snapshot.deadLetterCopies > snapshot.deadLetters ? " (\(g(snapshot.deadLetterCopies)) copies)" : "") (unusable jobs: \(g(unusable)))")
        lines.append("  token events            \(g(snapshot.distinctTokenEvents)) dead tokens, \(g(snapshot.tokenEvents)) events (tokens used: \(g(expectedEvents)))")
        lines.append("  throughput              \(g(Int(Double(snapshot.notificationsSeen) / max(elapsed, 0.001)))) notifications/s (publish start → last result, \(String(format: "%.1f", elapsed)) s)")
        lines.append("  latency job → result    p50 \(ms(0.5)), p99 \(ms(0.99)) (meta.published_at → result sent_at)")
        lines.append("")
        return Outcome(summary: lines, problems: problems)
    }

    static func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    static func contains(_ bytes: [UInt8], _ marker: [UInt8]) -> Bool {
        guard let first = marker.first, bytes.count >= marker.count else { return false }
        for index in 0...(bytes.count - marker.count) where bytes[index] == first {
            if bytes[index..<(index + marker.count)].elementsEqual(marker) { return true }
        }
        return false
    }
}

extension String {
    fileprivate func leftPadded(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
