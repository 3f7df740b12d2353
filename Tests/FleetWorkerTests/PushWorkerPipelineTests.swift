import APNsClient
import APNsCore
import APNsSimulator
import FleetWorker
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Synchronization
import Testing

/// The push worker's pipeline with every part real and in process: librdkafka's mock cluster,
/// the simulator over TLS with token auth, the HTTP/2 client pool, and the worker.
@Suite("Push worker pipeline", .timeLimit(.minutes(3)))
struct PushWorkerPipelineTests {
    static let good = (0..<6).map { String(repeating: "0", count: 62) + String(format: "%02x", $0 + 1) }
    static let dead = String(repeating: "de", count: 32)

    @Test("every token of every job gets exactly its result; unusable jobs go to the DLQ")
    func mixedJobs() async throws {
        var logger = Logger(label: "pipeline-test")
        logger.logLevel = .warning

        // APNs: the simulator over TLS, with one unregistered token; Kafka: the mock cluster.
        let backends = try await InProcessBackends.start(
            name: "worker", jobPartitions: 4, otherPartitions: 2,
            behaviour: { $0.unregisteredTokens = [Self.dead: 1_767_225_600_123] }, logger: logger
        )
        let (directory, simulator, topics, client, app) = (backends.directory, backends.simulator, backends.topics, backends.client, backends.app)
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            withExtendedLifetime(backends.cluster) {}  // Kafka stays up until the test ends
        }
        let fleet = FleetConfiguration(apps: [app])
        let clients = try APNsClients(apps: [app], logger: logger)
        var consumerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "push", topics: [topics.jobs, topics.retry])
        consumerConfiguration.sessionTimeout = .seconds(6)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        let worker = PushWorker(
            configuration: .init(fleet: fleet, workerID: "w-test", maxInFlight: 200),
            consumer: consumer, producer: producer,
            sender: APNsClientSender(clients: clients, requestTimeout: .seconds(10)), logger: logger
        )

        // The jobs, and the result each (job, token) must get.
        var jobs: [KafkaOutgoingMessage] = []
        var expected: [String: String] = [:]  // "job/token" → outcome[/status/reason]
        func envelope(_ id: String, _ body: String) {
            jobs.append(KafkaOutgoingMessage(topic: topics.jobs, key: Array(id.utf8), value: Array(body.utf8)))
        }
        for index in 0..<20 {
            let token = Self.good[index % Self.good.count]
            envelope("ok-\(index)", #"{"id":"ok-\#(index)","token":"\#(token)","payload":{"aps":{"alert":"hi"}},"meta":{"n":\#(index)}}"#)
            expected["ok-\(index)/\(token)"] = "delivered/200"
        }
        envelope("gone", #"{"id":"gone","token":"\#(Self.dead)","payload":{"aps":{}}}"#)
        expected["gone/\(Self.dead)"] = "rejected/410/Unregistered"
        envelope("fan", #"{"id":"fan","tokens":["\#(Self.good[0])","\#(Self.dead)","\#(Self.good[1])"],"payload":{"aps":{}}}"#)
        expected["fan/\(Self.good[0])"] = "delivered/200"
        expected["fan/\(Self.dead)"] = "rejected/410/Unregistered"
        expected["fan/\(Self.good[1])"] = "delivered/200"
        envelope("badjson", #"{"id":"badjson","token":"#)
        expected["apns.jobs-?/"] = "invalid"  // checked separately: its id is derived from its offset
        envelope("ghost", #"{"id":"ghost","tokens":["\#(Self.good[2])","\#(Self.good[3])"],"payload":{},"app":"ghost"}"#)
        expected["ghost/\(Self.good[2])"] = "invalid"
        expected["ghost/\(Self.good[3])"] = "invalid"
        let big = String(repeating: "x", count: 4200)
        envelope("big", #"{"id":"big","token":"\#(Self.good[4])","push_type":"alert","payload":{"b":"\#(big)"}}"#)
        expected["big/\(Self.good[4])"] = "invalid"
        jobs.append(KafkaOutgoingMessage(
            topic: topics.jobs, key: nil, value: Array(#"{"aps":{"alert":"raw"}}"#.utf8),
            headers: [RecordHeader("apns-token", Self.good[5]), RecordHeader("job-id", "hdr")]
        ))
        expected["hdr/\(Self.good[5])"] = "delivered/200"
        expected.removeValue(forKey: "apns.jobs-?/")
        let expectedResults = expected.count + 1  // plus the bad-JSON job's single result

        let collected = Collected<NotificationResult>()
        let deadLetters = Collected<KafkaRecord>()
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: [topics.results, topics.deadLetter])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await clients.run() }
            group.addTask { try await producer.run() }
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch {
                        if record.topic == topics.results {
                            let result = try NotificationResult(decoding: record.value)
                            collected.append(result)
                        } else {
                            deadLetters.append(record)
                        }
                    }
                    reader.markFinished(batch)
                }
            }
            for job in jobs { try await producer.send(job) }

            let deadline = ContinuousClock.now + .seconds(120)
            while collected.count < expectedResults || deadLetters.count < 3, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
            // Let any duplicate or stray result arrive before judging.
            try await Task.sleep(for: .milliseconds(500))
            consumer.close()
            reader.close()
            clients.shutdown()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop()

        let results = collected.items
        #expect(results.count == expectedResults, "one result per notification, no more")
        for result in results where result.jobID != "badjson" && !result.jobID.hasPrefix("apns.jobs-") {
            let key = "\(result.jobID)/\(result.token)"
            var actual = result.outcome.rawValue
            if let status = result.status { actual += "/\(status)" }
            if result.outcome == .rejected, let reason = result.reason { actual += "/\(reason)" }
            #expect(expected[key] == actual, "\(key)")
        }
        // Cut short after its id: the result keeps the producer's id, under an empty token.
        let broken = results.filter { $0.jobID == "badjson" }
        #expect(broken.count == 1)
        #expect(broken.first?.outcome == .invalid && broken.first?.token == "")
        #expect(!results.contains { $0.jobID.hasPrefix("apns.jobs-") }, "no result under a derived id: every job named its own")
        #expect(results.first { $0.jobID == "gone" }?.unregisteredAt == 1_767_225_600_123)
        #expect(results.first { $0.jobID == "ok-7" }?.meta?.description == #"{"n":7}"#)
        #expect(results.first { $0.jobID == "big" }?.reason == "payload: payload is 4208 bytes; at most 4096 are allowed for push type alert")

        let dlq = deadLetters.items
        #expect(dlq.count == 3, "bad JSON, unknown app, oversize payload")
        #expect(Set(dlq.compactMap { $0.headers.text("dlq-reason") }).count == 3)
        #expect(simulator.counters.snapshot().totals.answered == 20 + 1 + 3 + 1)
    }
}

/// What a reader task collected, shared with the test body.
final class Collected<Element: Sendable>: Sendable {
    private let storage = Mutex<[Element]>([])
    func append(_ element: Element) { storage.withLock { $0.append(element) } }
    var count: Int { storage.withLock { $0.count } }
    var items: [Element] { storage.withLock { $0 } }
}

extension PushWorkerPipelineTests {
    @Test("a one-token job's result that Kafka keeps refusing counts as a failing publish from its first send, not from the retry after librdkafka's report")
    func directPublishStallCountsFromFirstSend() async throws {
        var logger = Logger(label: "pipeline-test")
        logger.logLevel = .critical
        let backends = try await InProcessBackends.start(name: "stall", jobPartitions: 1, otherPartitions: 1, logger: logger)
        let (directory, simulator, topics, client, app) = (backends.directory, backends.simulator, backends.topics, backends.client, backends.app)
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            withExtendedLifetime(backends.cluster) {}
        }
        let clients = try APNsClients(apps: [app], logger: logger)
        var consumerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "push", topics: [topics.jobs, topics.retry])
        consumerConfiguration.sessionTimeout = .seconds(6)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        // librdkafka gives up on a message (and reports it failed) after 2 s.
        var producerConfiguration = KafkaProducerConfiguration(client: client)
        producerConfiguration.messageTimeout = .seconds(2)
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)
        let worker = PushWorker(
            configuration: .init(fleet: FleetConfiguration(apps: [app]), workerID: "w-test", maxInFlight: 10),
            consumer: consumer, producer: producer,
            sender: APNsClientSender(clients: clients, requestTimeout: .seconds(10)), logger: logger
        )
        let job = #"{"id":"one","token":"\#(Self.good[0])","payload":{"aps":{"alert":"hi"}}}"#
        try await producer.send(KafkaOutgoingMessage(topic: topics.jobs, value: Array(job.utf8)))
        // From now on Kafka refuses writes, retriably: librdkafka retries until its timeout.
        let refused = try #require(KafkaErrorCodes.code(named: "NOT_ENOUGH_REPLICAS"))
        backends.cluster.pushRequestErrors(api: .produce, errors: Array(repeating: refused, count: 100_000))

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await clients.run() }
            group.addTask { try await producer.run() }
            group.addTask { try await consumer.run() }
            group.addTask { try await worker.run() }
            // When APNs answered, seen from here (polled): the stall should count from about then.
            let answeredAt = Collected<ContinuousClock.Instant>()
            group.addTask {
                while simulator.counters.snapshot().totals.answered == 0 { try await Task.sleep(for: .milliseconds(10)) }
                answeredAt.append(.now)
            }
            try await waitUntil("the failing publish to be reported", timeout: 30) { worker.publishStalls.problem(longerThan: .zero) != nil }
            // Reported when the worker's own publish failed too, two timeouts after the first send.
            let problem = worker.publishStalls.problem(longerThan: .milliseconds(3800))
            #expect(problem != nil, "\(worker.publishStalls.problem(longerThan: .zero) ?? "")")
            // However long librdkafka took to report each failure: counted from the answer, the
            // stall is as old as the time since it (less the polling's lag); counted from the
            // retry, it would be younger by the whole first report's wait (2 s or more).
            let sinceAnswer = ContinuousClock.now - (try #require(answeredAt.items.first))
            #expect(worker.publishStalls.problem(longerThan: sinceAnswer - .milliseconds(700)) != nil, "stall younger than the \(sinceAnswer) since the answer")
            backends.cluster.clearRequestErrors(api: .produce)
            try await waitUntil("the result to be published", timeout: 30) { consumer.storedOffset(TopicPartition(topic: topics.jobs, partition: 0)) == 1 }
            #expect(worker.publishStalls.problem(longerThan: .zero) == nil)
            consumer.close()
            clients.shutdown()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop()
    }
}

@Suite("Send results")
struct SendResultTests {
    @Test("an unanswered attempt's result carries the apns-id its request was sent with (APNs may have taken it), not one never written; an answer's own id wins")
    func apnsIDOfUnansweredAttempts() {
        let timedOut = SendResult(.notAnswered(APNsNotAnswered(.timeout, "no answer within 10 s", certainlyNotProcessed: false)), sentID: "9f1c0000-0000-4000-8000-000000000001", latencyMs: 10_000)
        #expect(timedOut.apnsID == "9f1c0000-0000-4000-8000-000000000001")
        let answered = SendResult(.answered(APNsResponse(status: 200, apnsID: "9f1c0000-0000-4000-8000-000000000002")), sentID: "9f1c0000-0000-4000-8000-000000000001", latencyMs: 3)
        #expect(answered.apnsID == "9f1c0000-0000-4000-8000-000000000002")
        // Never written (too late, the connection going away): it reached nobody, so no id.
        let unsent = SendResult(.notAnswered(APNsNotAnswered(.tooLate, "past its send-by time before it was written", certainlyNotProcessed: true)), sentID: "9f1c0000-0000-4000-8000-000000000001", latencyMs: 0)
        #expect(unsent.apnsID == nil)
        // Answered, then cut short: not delivered, but it did reach APNs under its id.
        let cut = SendResult(.notAnswered(APNsNotAnswered(.cutShort, "APNs answered 503, then the connection closed", certainlyNotProcessed: true)), sentID: "9f1c0000-0000-4000-8000-000000000001", latencyMs: 4)
        #expect(cut.apnsID == "9f1c0000-0000-4000-8000-000000000001")
    }
}
