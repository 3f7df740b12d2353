import APNsClient
import APNsCore
import APNsLegacyClient
import APNsSimulator
import FleetTestSupport
@testable import FleetWorker
import Foundation
import KafkaTransport
import Logging
import Testing

/// The feedback worker with real parts in process: the mock Kafka cluster, the simulator's
/// legacy feedback service over TLS with a client certificate, and the worker itself.
@Suite("Feedback worker", .timeLimit(.minutes(2)))
struct FeedbackWorkerTests {
    static func token(_ byte: UInt8) -> String { String(repeating: String(format: "%02x", byte), count: 32) }

    static func result(_ job: String, _ token: String, _ outcome: Outcome, status: Int?, reason: String?, unregisteredAt: Int64? = nil) -> KafkaOutgoingMessage {
        let result = NotificationResult(
            jobID: job, token: token, topic: "com.example.app", app: "example", outcome: outcome, status: status, reason: reason,
            unregisteredAt: unregisteredAt, attempts: 1, latencyMs: 3, sentAt: UnixMillis(1_767_225_600_000), worker: "w",
            source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 1)
        )
        return KafkaOutgoingMessage(topic: TopicNames().results, key: Array(token.utf8), value: result.encoded())
    }

    @Test("dead tokens from results and from the feedback service become one event per invalidation")
    func tokenEvents() async throws {
        var logger = Logger(label: "feedback-test")
        logger.logLevel = .warning

        // The legacy feedback service over TLS; it reports two tokens the app no longer serves.
        let directory = temporaryTestPath("apns-fleet-feedback")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try DevCredentials.generate(topic: "com.example.legacy")
        let summary = try credentials.write(to: directory)
        func path(_ file: String) -> String { (directory as NSString).appendingPathComponent(file) }
        var legacyConfiguration = LegacyServicesConfiguration()
        legacyConfiguration.feedbackTLSPort = 0
        legacyConfiguration.tls = try credentials.simulatorConfiguration().tls
        legacyConfiguration.unregisteredTokens = [Self.token(0xF1): 1_767_000_000_000, Self.token(0xF2): 1_767_000_100_000]
        let legacy = try await LegacyServices.start(legacyConfiguration, logger: logger, output: { _ in })
        let feedbackPort = try #require(legacy.port(.feedbackTLS))

        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        let topics = TopicNames()
        try cluster.createTopic(topics.results, partitions: 3)
        try cluster.createTopic(topics.tokenEvents, partitions: 2)
        var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
        client.statisticsInterval = nil

        var consumerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "feedback", topics: [topics.results])
        consumerConfiguration.sessionTimeout = .seconds(6)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        let feedbackClient = LegacyFeedbackClient(
            endpoint: LegacyEndpoint(host: "127.0.0.1", port: feedbackPort, tls: true, caFile: path(summary.caFile)),
            certificate: .pem(certificateFile: path(summary.clientCertificateFile), privateKeyFile: path(summary.clientKeyFile), password: nil),
            logger: logger
        )
        let worker = FeedbackWorker(
            configuration: .init(topics: topics, pollInterval: .seconds(3600), ledgerCapacity: 10_000),
            consumer: consumer, producer: producer,
            feedbackServices: [.init(app: "legacy", topic: "com.example.legacy") { try await feedbackClient.fetch(timeout: $0, deliver: $1) }],
            logger: logger
        )

        let gone = Self.token(0xA1), bad = Self.token(0xB2), fine = Self.token(0xC3), wrongTopic = Self.token(0xD4)
        let results = [
            Self.result("j1", gone, .rejected, status: 410, reason: "Unregistered", unregisteredAt: 1_767_225_000_000),
            Self.result("j1", gone, .rejected, status: 410, reason: "Unregistered", unregisteredAt: 1_767_225_000_000),  // at-least-once duplicate
            Self.result("j2", bad, .rejected, status: 400, reason: "BadDeviceToken"),
            Self.result("j3", fine, .delivered, status: 200, reason: nil),
            Self.result("j4", wrongTopic, .rejected, status: 400, reason: "DeviceTokenNotForTopic"),
            Self.result("j5", bad, .invalid, status: nil, reason: "BadDeviceToken"),  // never reached APNs: says nothing
            Self.result("j6", fine, .rejected, status: 400, reason: "BadCollapseId"),  // rejected, but the token is fine
            KafkaOutgoingMessage(topic: topics.results, key: nil, value: Array(#"{"outcome":"rejected" not json"#.utf8)),
            Self.result("j7", gone, .rejected, status: 410, reason: "Unregistered", unregisteredAt: 1_767_225_900_000),  // died again later
        ]

        let events = Collected<TokenEvent>()
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: [topics.tokenEvents])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch {
                        let event = try TokenEvent(decoding: record.value)
                        #expect(record.key == Array(event.key.utf8), "keyed <topic>/<token>")
                        events.append(event)
                    }
                    reader.markFinished(batch)
                }
            }
            for message in results { try await producer.send(message) }
            let deadline = ContinuousClock.now + .seconds(60)
            while events.count < 6, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(100)) }
            // A repeat would arrive soon after; give it the chance before judging.
            try await Task.sleep(for: .milliseconds(800))
            let storedBy = ContinuousClock.now + .seconds(20)
            while consumer.inFlight > 0, ContinuousClock.now < storedBy { try await Task.sleep(for: .milliseconds(50)) }
            #expect(consumer.inFlight == 0, "every result record was finished")
            consumer.close()
            reader.close()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await legacy.stop()

        let got = events.items.map { "\($0.source.rawValue) \($0.reason) \($0.topic)/\($0.token.prefix(4)) \($0.invalidatedAt)" }.sorted()
        #expect(got == [
            "feedback-service Unregistered com.example.legacy/f1f1 1767000000000",
            "feedback-service Unregistered com.example.legacy/f2f2 1767000100000",
            "http2 BadDeviceToken com.example.app/b2b2 1767225600000",
            "http2 DeviceTokenNotForTopic com.example.app/d4d4 1767225600000",
            "http2 Unregistered com.example.app/a1a1 1767225000000",
            "http2 Unregistered com.example.app/a1a1 1767225900000",
        ].sorted())
        #expect(events.items.first { $0.jobID == "j2" }?.app == "example")
        #expect(worker.feedbackServiceHealth == ["legacy": true])
    }

    @Test("two events of one token in one turn are published one after the other, each after the previous is acknowledged")
    func eventsOfOneKeyGoOutInRounds() {
        func event(_ byte: UInt8, at time: Int64) -> TokenEvent {
            TokenEvent(token: Self.token(byte), topic: "com.example.app", app: nil, reason: "Unregistered", invalidatedAt: time, source: .http2)
        }
        let events = [event(0xA1, at: 1), event(0xB2, at: 2), event(0xA1, at: 3), event(0xC3, at: 4), event(0xA1, at: 5)]
        let rounds = FeedbackWorker.rounds(events).map { $0.map { "\($0.token.prefix(2))@\($0.invalidatedAt)" } }
        #expect(rounds == [["a1@1", "b2@2", "c3@4"], ["a1@3"], ["a1@5"]])
        #expect(FeedbackWorker.rounds(Array(events.prefix(2))).count == 1, "no key repeats: one round")
    }

    /// A mock cluster with the results and token-event topics, and a feedback worker's consumer
    /// and producer on it.
    static func kafka(logLevel: Logger.Level) throws -> (MockKafkaCluster, KafkaConsumer, KafkaProducer, Logger) {
        var logger = Logger(label: "feedback-test")
        logger.logLevel = logLevel
        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        let topics = TopicNames()
        try cluster.createTopic(topics.results, partitions: 1)
        try cluster.createTopic(topics.tokenEvents, partitions: 1)
        var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
        client.statisticsInterval = nil
        let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(client: client, groupID: "feedback", topics: [topics.results]), logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        return (cluster, consumer, producer, logger)
    }

    @Test("/readyz fails, naming the app, while every poll of its feedback service has failed; once it answered, a failure is no reason")
    func readinessFollowsFeedbackPolls() async throws {
        let (cluster, consumer, producer, logger) = try Self.kafka(logLevel: .critical)
        defer { withExtendedLifetime(cluster) {} }
        let refusing = Shared(true)
        let service = FeedbackWorker.FeedbackService(app: "legacy", topic: "com.example.legacy") { _, _ in
            // As a service that refuses the client certificate does.
            if refusing.value { throw LegacyClientError(.connect, "the feedback service closed the connection during the TLS handshake") }
        }
        let worker = FeedbackWorker(
            configuration: .init(topics: TopicNames(), pollInterval: .seconds(3600), pollTimeout: .seconds(5), ledgerCapacity: 100),
            consumer: consumer, producer: producer, feedbackServices: [service], logger: logger
        )
        #expect(worker.readiness(assignedPartitions: 2).ready, "no poll yet: nothing known against it")
        #expect(!worker.readiness(assignedPartitions: 0).ready)
        _ = await worker.poll(service)
        let failed = worker.readiness(assignedPartitions: 2)
        #expect(!failed.ready)
        #expect(failed.detail.contains("legacy"), "\(failed.detail)")
        refusing.update { $0 = false }
        _ = await worker.poll(service)
        #expect(worker.readiness(assignedPartitions: 2).ready)
        // A blip an hour later: counted and logged, and the replicas stay ready.
        refusing.update { $0 = true }
        _ = await worker.poll(service)
        #expect(worker.readiness(assignedPartitions: 2).ready)
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("a failed poll is tried again soon, backing off, not a whole interval later; once the service answers, the interval applies")
    func failedPollsAreRetriedSoon() async throws {
        let (cluster, consumer, producer, logger) = try Self.kafka(logLevel: .critical)
        defer { withExtendedLifetime(cluster) {} }
        let attempts = Shared<[ContinuousClock.Instant]>([])
        let service = FeedbackWorker.FeedbackService(app: "legacy", topic: "com.example.legacy") { _, _ in
            attempts.update { $0.append(.now) }
            let attempt = attempts.value.count
            // A network blip at start: the first three polls fail.
            if attempt <= 3 { throw LegacyClientError(.connect, "cannot connect to the feedback service: connection refused") }
        }
        let worker = FeedbackWorker(
            configuration: .init(topics: TopicNames(), pollInterval: .seconds(3600), pollTimeout: .seconds(5), ledgerCapacity: 100, pollRetryDelay: .milliseconds(300)),
            consumer: consumer, producer: producer, feedbackServices: [service], logger: logger
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            try await waitUntil("the fourth poll", timeout: 30) { attempts.value.count == 4 }
            // The poll notes the answer just after the service's fetch returns.
            try await waitUntil("ready once the service answered") { worker.readiness(assignedPartitions: 1).ready }
            // Answered: the next poll is an interval (an hour) away.
            try await Task.sleep(for: .seconds(2))
            #expect(attempts.value.count == 4)
            group.cancelAll()
            try? await group.waitForAll()
        }
        let times = attempts.value
        let gaps = zip(times, times.dropFirst()).map { $0.duration(to: $1) }
        // 0.3 s, then 0.6 s, then 1.2 s (each plus up to the loop's 250 ms step).
        for (gap, delay) in zip(gaps, [300, 600, 1200]) {
            #expect(gap >= .milliseconds(delay) && gap < .milliseconds(delay + 1500), "\(gaps)")
        }
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("cancellation reaches a poll in progress: the worker stops instead of waiting out the poll")
    func cancellationReachesAPoll() async throws {
        let (cluster, consumer, producer, logger) = try Self.kafka(logLevel: .error)
        defer { withExtendedLifetime(cluster) {} }
        let topics = TopicNames()
        let polling = Shared(false)
        // A feedback service that keeps the connection open for a minute (as a stuck one would).
        let stuck = FeedbackWorker.FeedbackService(app: "legacy", topic: "com.example.legacy") { _, _ in
            polling.update { $0 = true }
            try await Task.sleep(for: .seconds(60))
        }
        let worker = FeedbackWorker(
            configuration: .init(topics: topics, pollInterval: .seconds(3600), pollTimeout: .seconds(60), ledgerCapacity: 100),
            consumer: consumer, producer: producer, feedbackServices: [stuck], logger: logger
        )
        let stopped = try await withThrowingTaskGroup(of: Void.self, returning: Duration.self) { group in
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            try await waitUntil("the poll to start", timeout: 30) { polling.value }
            let cancelledAt = ContinuousClock.now
            group.cancelAll()
            try? await group.waitForAll()
            return cancelledAt.duration(to: .now)
        }
        // Before, the poll ran in a task of its own that cancellation never reached: the stop
        // waited out the whole minute, past the process's stop budget.
        #expect(stopped < .seconds(20), "stopping took \(stopped)")
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("a result repeating a feedback event that Kafka has not yet acknowledged: its batch is finished only after that acknowledgement")
    func repeatWaitsForTheEventItRepeats() async throws {
        let (cluster, consumer, producer, logger) = try Self.kafka(logLevel: .error)
        defer { withExtendedLifetime(cluster) {} }
        let topics = TopicNames()
        let delivering = Shared(false)
        let acknowledgedAt = Shared<ContinuousClock.Instant?>(nil)
        let service = FeedbackWorker.FeedbackService(app: "example", topic: "com.example.app") { _, deliver in
            delivering.update { $0 = true }
            await deliver([FeedbackTuple(timestamp: 1_767_225_600, token: Array(repeating: 0xD1, count: 32))])
            acknowledgedAt.update { $0 = .now }
        }
        let worker = FeedbackWorker(
            configuration: .init(topics: topics, pollInterval: .seconds(3600), pollTimeout: .seconds(60), ledgerCapacity: 100),
            consumer: consumer, producer: producer, feedbackServices: [service], logger: logger
        )
        // Every answer from the broker takes 3 s, so the poll's event is unacknowledged that long.
        try cluster.setRoundTripTime(broker: 1, milliseconds: 3000)
        let polling = Task { await worker.poll(service) }
        try await waitUntil("the poll to hand over its tuple", timeout: 30) { delivering.value }
        try await Task.sleep(for: .milliseconds(300))
        // What an exit now (overdue, or a second signal) would lose: the service forgot it.
        #expect(worker.eventsAtRisk == 1)
        // The same invalidation reported by a 410 result: a repeat of the event in flight.
        let repeated = Self.result("j1", Self.token(0xD1), .rejected, status: 410, reason: "Unregistered", unregisteredAt: 1_767_225_600_000)
        let record = KafkaRecord(topic: topics.results, partition: 0, offset: 0, key: nil, value: repeated.value, headers: [], timestamp: nil, assignmentEpoch: 1)
        let started = ContinuousClock.now
        await worker.handle([record])
        let finished = ContinuousClock.now
        #expect(await polling.value == 1)
        #expect(worker.eventsAtRisk == 0, "acknowledged: nothing at risk any more")
        let acknowledged = try #require(acknowledgedAt.value)
        // Meaningful only if the event was still unacknowledged when its repeat came.
        #expect(acknowledged > started, "the poll's event was acknowledged before the repeat came; the test proves nothing")
        // Finished at once, its offset could be committed before the event it was taken for a
        // repeat of reached Kafka; a crash then would lose the invalidation for good (the
        // feedback service forgets what it has sent). The poll notes the acknowledgement just
        // after it hands the turn on, hence the margin.
        #expect(finished > acknowledged - .milliseconds(500), "the repeat's batch was finished \(acknowledged - finished) before the event it repeats was acknowledged")
        try cluster.setRoundTripTime(broker: 1, milliseconds: 0)
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("once a stop is asked for, no new poll starts, though the consumer (stopped first) still runs")
    func noPollAfterAStopIsRequested() async throws {
        let (cluster, consumer, producer, logger) = try Self.kafka(logLevel: .error)
        defer { withExtendedLifetime(cluster) {} }
        let polls = Shared(0)
        let service = FeedbackWorker.FeedbackService(app: "legacy", topic: "com.example.legacy") { _, _ in polls.update { $0 += 1 } }
        let stop = Shared(false)
        let worker = FeedbackWorker(
            configuration: .init(topics: TopicNames(), pollInterval: .seconds(1), pollTimeout: .seconds(5), ledgerCapacity: 1000),
            consumer: consumer, producer: producer, feedbackServices: [service], logger: logger,
            stopRequested: { stop.value }
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            try await waitUntil("the first poll", timeout: 30) { polls.value == 1 }
            stop.update { $0 = true }
            // Two more intervals: a poll due meanwhile would read tuples the service then forgets,
            // while this worker may be stuck publishing (the case that matters) and never send them.
            try await Task.sleep(for: .milliseconds(2500))
            #expect(polls.value == 1, "\(polls.value) polls")
            group.cancelAll()
            try? await group.waitForAll()
        }
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("a forced stop while Kafka refuses the events: the lost count is logged as an error, with no promise of a next poll")
    func forcedStopReportsLostEvents() async throws {
        let (cluster, consumer, producer, _) = try Self.kafka(logLevel: .critical)
        let topics = TopicNames()
        // Every event is refused (an ACL, say), so the poll's events wait in the publisher.
        let denied = try #require(KafkaErrorCodes.code(named: "TOPIC_AUTHORIZATION_FAILED"))
        cluster.pushRequestErrors(api: .produce, errors: Array(repeating: denied, count: 1000))
        let delivering = Shared(false)
        // As the legacy client does: tuples handed over, then the cancelled read throws.
        let service = FeedbackWorker.FeedbackService(app: "legacy", topic: "com.example.legacy") { _, deliver in
            delivering.update { $0 = true }
            await deliver([FeedbackTuple(timestamp: 1_767_000_000, token: Array(repeating: 0xF1, count: 32))])
            throw CancellationError()
        }
        let logs = Collected<CapturedLog>()
        let worker = FeedbackWorker(
            configuration: .init(topics: topics, pollInterval: .seconds(3600), pollTimeout: .seconds(60), ledgerCapacity: 100),
            consumer: consumer, producer: producer, feedbackServices: [service],
            logger: Logger(label: "feedback-worker") { _ in CapturingLogHandler(sink: logs) }
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            try await waitUntil("the poll's events to be published", timeout: 30) { delivering.value }
            try await Task.sleep(for: .milliseconds(300))
            group.cancelAll()
            try? await group.waitForAll()
        }
        let lines = logs.items
        #expect(lines.contains { $0.level == .error && $0.message == "stopped before the feedback service's events were published" && $0.metadata["events"] == "1" }, "\(lines.map(\.text))")
        #expect(!lines.contains { $0.message.contains("will try again") }, "\(lines.map(\.text))")
        // The process's last line reports them, with exit status 1.
        #expect(worker.eventsLost == 1)
        cluster.clearRequestErrors(api: .produce)
        await producer.shutdown(flushTimeout: .seconds(1))
    }

    @Test("end to end: jobs to unregistered tokens → 410 results → one token event per dead token")
    func jobsToTokenEvents() async throws {
        var logger = Logger(label: "feedback-e2e-test")
        logger.logLevel = .warning
        let dead = [Self.token(0xD1), Self.token(0xD2), Self.token(0xD3)]
        let alive = (0..<4).map { Self.token(UInt8(0x10 + $0)) }
        let backends = try await InProcessBackends.start(
            name: "feedback-e2e", jobPartitions: 3, otherPartitions: 3,
            behaviour: { $0.unregisteredTokens = Dictionary(uniqueKeysWithValues: dead.enumerated().map { ($1, 1_767_000_000_000 + Int64($0)) }) },
            logger: logger
        )
        let (simulator, topics, client, app) = (backends.simulator, backends.topics, backends.client, backends.app)
        defer {
            try? FileManager.default.removeItem(atPath: backends.directory)
            withExtendedLifetime(backends.cluster) {}  // Kafka stays up until the test ends
        }
        func consumer(_ group: String, _ topics: [String]) throws -> KafkaConsumer {
            var configuration = KafkaConsumerConfiguration(client: client, groupID: group, topics: topics)
            configuration.sessionTimeout = .seconds(6)
            return try KafkaConsumer(configuration: configuration, logger: logger)
        }
        let clients = try APNsClients(apps: [app], logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        let jobsConsumer = try consumer("push", [topics.jobs, topics.retry])
        let pushWorker = PushWorker(
            configuration: .init(fleet: FleetConfiguration(apps: [app]), workerID: "w", maxInFlight: 100),
            consumer: jobsConsumer, producer: producer,
            sender: APNsClientSender(clients: clients, requestTimeout: .seconds(10)), logger: logger
        )
        let resultsConsumer = try consumer("feedback", [topics.results])
        let feedbackWorker = FeedbackWorker(
            configuration: .init(topics: topics, pollInterval: .seconds(3600), ledgerCapacity: 1000),
            consumer: resultsConsumer, producer: producer, feedbackServices: [], logger: logger
        )
        let reader = try consumer("reader", [topics.tokenEvents])
        let events = Collected<TokenEvent>()

        // Every dead token is sent to three times (a fan-out job and two single jobs), as
        // producers do when they do not yet know a token is dead.
        var jobs: [KafkaOutgoingMessage] = []
        func job(_ id: String, _ tokens: [String]) {
            let list = tokens.map { "\"\($0)\"" }.joined(separator: ",")
            jobs.append(KafkaOutgoingMessage(topic: topics.jobs, key: Array(id.utf8), value: Array(#"{"id":"\#(id)","tokens":[\#(list)],"payload":{"aps":{}}}"#.utf8)))
        }
        job("fan", alive + dead)
        for (index, token) in dead.enumerated() {
            job("again-\(index)-a", [token])
            job("again-\(index)-b", [token, alive[index]])
        }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await clients.run() }
            group.addTask { try await producer.run() }
            for service in [jobsConsumer, resultsConsumer, reader] as [KafkaConsumer] {
                group.addTask { try await service.run() }
            }
            group.addTask { try await pushWorker.run() }
            group.addTask { try await feedbackWorker.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch { events.append(try TokenEvent(decoding: record.value)) }
                    reader.markFinished(batch)
                }
            }
            for message in jobs { try await producer.send(message) }
            let deadline = ContinuousClock.now + .seconds(90)
            while events.count < dead.count || simulator.counters.snapshot().totals.answered < 16, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
            // Give a repeated event every chance to show up before judging.
            try await Task.sleep(for: .seconds(1))
            for service in [jobsConsumer, resultsConsumer, reader] { service.close() }
            clients.shutdown()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop()

        #expect(simulator.counters.snapshot().totals.answered == 16, "7 + 3 × 3 notifications sent")
        let got = events.items.map { "\($0.token.prefix(4)) \($0.reason) \($0.invalidatedAt)" }.sorted()
        #expect(got == ["d1d1 Unregistered 1767000000000", "d2d2 Unregistered 1767000000001", "d3d3 Unregistered 1767000000002"],
                "one event per dead token, with APNs's 410 timestamp")
        #expect(events.items.allSatisfy { $0.source == .http2 && $0.topic == "com.example.app" && $0.app == "example" })
    }
}
