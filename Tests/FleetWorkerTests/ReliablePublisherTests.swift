import APNsCore
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

@testable import FleetWorker

@Suite("Reliable publisher")
struct ReliablePublisherTests {
    /// A publisher on a fresh mock cluster holding `topic`.
    static func publisher(
        topic: String, logLevel: Logger.Level, properties: [String: String] = [:]
    ) throws -> (MockKafkaCluster, KafkaClientConfiguration, KafkaProducer, ReliablePublisher) {
        var logger = Logger(label: "publisher-test")
        logger.logLevel = logLevel
        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        try cluster.createTopic(topic, partitions: 1)
        var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
        client.statisticsInterval = nil
        var producerClient = client
        producerClient.properties = properties
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: producerClient), logger: logger)
        return (cluster, client, producer, ReliablePublisher(producer: producer, logger: logger))
    }

    /// Reads `count` records of `topic` from the start.
    static func read(_ count: Int, from topic: String, client: KafkaClientConfiguration, logger: Logger) async throws -> [KafkaRecord] {
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: [topic])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        return try await withThrowingTaskGroup(of: [KafkaRecord].self) { group in
            group.addTask { try await reader.run(); return [] }
            group.addTask {
                var records: [KafkaRecord] = []
                for await batch in reader.batches {
                    records += batch
                    if records.count >= count { break }
                }
                return records
            }
            let first = try await group.next() ?? []
            reader.close()
            group.cancelAll()
            return first
        }
    }

    @Test("a message Kafka refuses as too large goes out cut short, with its size in a header, instead of being retried forever")
    func tooLargeIsCutShort() async throws {
        let (cluster, client, producer, publisher) = try Self.publisher(topic: "dlq", logLevel: .error)
        defer { withExtendedLifetime(cluster) {} }
        let logger = publisher.logger
        // A job of 1.2 MB (say, an image pasted into the payload): invalid, and its DLQ copy
        // is over librdkafka's message.max.bytes.
        let huge = KafkaOutgoingMessage(topic: "dlq", value: [UInt8](repeating: 0x61, count: 1_200_000), headers: [RecordHeader("dlq-reason", "payload too large")])
        // A small job whose bulk is in its headers: the job's own go first, the worker's stay.
        let padding = String(repeating: "h", count: 600_000)
        let heavyHeaders = KafkaOutgoingMessage(
            topic: "dlq", value: Array("{}".utf8), headers: [RecordHeader("x-1", padding), RecordHeader("x-2", padding), RecordHeader("dlq-reason", "heavy headers")]
        )
        let published = try await withTimeout(30, "the publish to finish") { await publisher.publish([huge, heavyHeaders]) }
        #expect(published)

        let records = try await Self.read(2, from: "dlq", client: client, logger: logger)
        let record = try #require(records.first)
        #expect(record.value.count == ReliablePublisher.shrunkValueBytes)
        #expect(record.headers.text(ReliablePublisher.truncatedHeader) == "1200000")
        #expect(record.headers.text("dlq-reason") == "payload too large")
        let second = try #require(records.dropFirst().first)
        #expect(second.value == Array("{}".utf8))
        #expect(second.headers.text("dlq-reason") == "heavy headers")
        #expect(second.headers.text(ReliablePublisher.headersDroppedHeader) == "2")
        await producer.shutdown(flushTimeout: .seconds(2))
    }

    @Test("a DLQ copy its topic refuses below 64 KiB loses half of what is left each round until it fits")
    func smallDeadLetterIsHalvedUntilItFits() async throws {
        // The producer's limit stands in for a DLQ topic whose max.message.bytes is 20,000.
        let (cluster, client, producer, publisher) = try Self.publisher(topic: "dlq", logLevel: .critical, properties: ["message.max.bytes": "20000"])
        defer { withExtendedLifetime(cluster) {} }
        let copy = KafkaOutgoingMessage(topic: "dlq", value: [UInt8](repeating: 0x61, count: 50_000), headers: [RecordHeader("dlq-reason", "unknown app")])
        let published = try await withTimeout(30, "the publish to finish") { await publisher.publish([copy]) }
        #expect(published)

        let record = try #require(try await Self.read(1, from: "dlq", client: client, logger: publisher.logger).first)
        #expect(record.value.count == 12_500, "50,000 → 25,000 → 12,500 bytes")
        #expect(record.headers.text(ReliablePublisher.truncatedHeader) == "50000", "the original size, not an intermediate one")
        #expect(record.headers.text("dlq-reason") == "unknown app")
        await producer.shutdown(flushTimeout: .seconds(2))
    }

    @Test("a DLQ copy refused with many small headers loses them, then its value, then the rest of its own headers, keeping the worker's")
    func deadLetterHeadersAreCutInSteps() async throws {
        let (cluster, client, producer, publisher) = try Self.publisher(topic: "dlq", logLevel: .critical, properties: ["message.max.bytes": "10000"])
        defer { withExtendedLifetime(cluster) {} }
        let own = (0..<1500).map { RecordHeader("h", "value-\($0)") }
        let worker = [RecordHeader("dlq-reason", "malformed JSON"), RecordHeader("source-topic", "apns.jobs")]
        let copy = KafkaOutgoingMessage(topic: "dlq", value: [UInt8](repeating: 0x61, count: 3000), headers: own + worker)
        let published = try await withTimeout(30, "the publish to finish") { await publisher.publish([copy]) }
        #expect(published)

        let record = try #require(try await Self.read(1, from: "dlq", client: client, logger: publisher.logger).first)
        #expect(record.headers.text("dlq-reason") == "malformed JSON" && record.headers.text("source-topic") == "apns.jobs")
        #expect(record.headers.filter { $0.key == ReliablePublisher.headersDroppedHeader }.count == 1, "one count, added up over the rounds")
        #expect(record.headers.text(ReliablePublisher.headersDroppedHeader) == "1500")
        #expect(record.value.isEmpty && record.headers.text(ReliablePublisher.truncatedHeader) == "3000")
        await producer.shutdown(flushTimeout: .seconds(2))
    }

    @Test("a retry record refused as too large (its topic's limit below the producer's) goes out as records for half its tokens each")
    func tooLargeRetryRecordIsSplit() async throws {
        let retryTopic = TopicNames().retry
        // The producer's own limit stands in for a topic whose max.message.bytes is lower than
        // what the worker sized the record by: both refuse with MSG_SIZE_TOO_LARGE.
        let (cluster, client, producer, publisher) = try Self.publisher(
            topic: retryTopic, logLevel: .error, properties: ["message.max.bytes": "20000"]
        )
        defer { withExtendedLifetime(cluster) {} }
        let tokens = (0..<500).map { String(format: "%064x", $0) }
        let job = Array(#"{"id":"fan","tokens":[],"payload":{}}"#.utf8)
        let headers = [
            RecordHeader("attempt", "2"), RecordHeader(JobIntake.retryTokensKey, tokens.joined(separator: ",")), RecordHeader("job-id", "fan"),
        ]
        let published = try await withTimeout(30, "the publish to finish") {
            await publisher.publish([KafkaOutgoingMessage(topic: retryTopic, key: Array("fan".utf8), value: job, headers: headers)]) {
                PushWorker.halves(of: $0, retryTopic: retryTopic)
            }
        }
        #expect(published)

        let records = try await Self.read(2, from: retryTopic, client: client, logger: publisher.logger)
        #expect(records.count == 2)
        let lists = records.map { ($0.headers.text(JobIntake.retryTokensKey) ?? "").split(separator: ",").map(String.init) }
        #expect(lists.map(\.count) == [250, 250])
        #expect(lists.flatMap { $0 } == tokens, "every token once, in order")
        for record in records {
            #expect(record.value == job)
            #expect(record.headers.text("attempt") == "2" && record.headers.text("job-id") == "fan")
        }
        await producer.shutdown(flushTimeout: .seconds(2))
    }

    @Test(
        "retry records refused as too large in a batch over the topic's limit are each sent again alone, and go out whole",
        // One: librdkafka batches one publish's message with other publishes' messages too.
        arguments: [1, 2]
    )
    func batchRefusedTooLargeIsSentAgainAlone(count: Int) async throws {
        let retryTopic = TopicNames().retry
        let (cluster, client, producer, publisher) = try Self.publisher(topic: retryTopic, logLevel: .error)
        defer { withExtendedLifetime(cluster) {} }
        // The broker refuses the next Produce request, the records' batch, as too large; each
        // record alone is within the limit.
        let tooLarge = try #require(KafkaErrorCodes.code(named: "MSG_SIZE_TOO_LARGE"))
        cluster.pushRequestErrors(api: .produce, errors: [tooLarge])
        let records = (0..<count).map { index in
            let tokens = (0..<4).map { String(format: "%064x", index * 4 + $0) }
            return KafkaOutgoingMessage(
                topic: retryTopic, key: Array("job-\(index)".utf8), value: Array(#"{"id":"job-\#(index)","tokens":[],"payload":{}}"#.utf8),
                headers: [RecordHeader("attempt", "1"), RecordHeader(JobIntake.retryTokensKey, tokens.joined(separator: ","))]
            )
        }
        let standIns = Shared(0)
        let published = try await withTimeout(30, "the publish to finish") {
            await publisher.publish(records) { message in
                standIns.update { $0 += 1 }
                return PushWorker.halves(of: message, retryTopic: retryTopic)
            }
        }
        #expect(published)
        #expect(standIns.value == 0, "nothing stood in for a record that fits by itself")
        let read = try await Self.read(count, from: retryTopic, client: client, logger: publisher.logger)
        #expect(Set(read.map(\.value)) == Set(records.map(\.value)))
        #expect(Set(read.compactMap { $0.headers.text(JobIntake.retryTokensKey) }) == Set(records.compactMap { $0.headers.text(JobIntake.retryTokensKey) }))
        await producer.shutdown(flushTimeout: .seconds(2))
    }

    @Test("a retry record is split only when its token list makes up a good part of it")
    func splitOnlyWhereItHelps() {
        let retryTopic = TopicNames().retry
        func record(tokens: Int, valueBytes: Int, topic: String? = nil) -> KafkaOutgoingMessage {
            let list = (0..<tokens).map { String(format: "%064x", $0) }.joined(separator: ",")
            return KafkaOutgoingMessage(
                topic: topic ?? retryTopic, value: [UInt8](repeating: 0x20, count: valueBytes),
                headers: [RecordHeader("attempt", "1"), RecordHeader(JobIntake.retryTokensKey, list)]
            )
        }
        #expect(PushWorker.halves(of: record(tokens: 400, valueBytes: 2_000), retryTopic: retryTopic)?.count == 2)
        // A JSON fan-out job names its tokens in the value too: a list a little smaller than
        // the rest, whose halving is what brings the record under the limit.
        #expect(PushWorker.halves(of: record(tokens: 100, valueBytes: 6_800), retryTopic: retryTopic)?.count == 2)
        // A large job with few tokens: every half would carry the whole job again.
        #expect(PushWorker.halves(of: record(tokens: 10, valueBytes: 30_000), retryTopic: retryTopic) == nil)
        #expect(PushWorker.halves(of: record(tokens: 1, valueBytes: 10), retryTopic: retryTopic) == nil)
        #expect(PushWorker.halves(of: record(tokens: 400, valueBytes: 2_000, topic: "apns.dlq"), retryTopic: retryTopic) == nil)
    }

    @Test("a publish that keeps failing (a topic denied by an ACL) is reported, naming the topic and error, until it ends")
    func keptFailingIsReported() async throws {
        let (cluster, _, producer, publisher) = try Self.publisher(topic: "results", logLevel: .critical)
        #expect(publisher.stalls.problem(longerThan: .zero) == nil)

        let denied = try #require(KafkaErrorCodes.code(named: "TOPIC_AUTHORIZATION_FAILED"))
        cluster.pushRequestErrors(api: .produce, errors: Array(repeating: denied, count: 50))
        let publishing = Task { await publisher.publish([KafkaOutgoingMessage(topic: "results", value: Array("{}".utf8))]) }
        try await waitUntil("the failing publish to be reported", timeout: 20) {
            publisher.stalls.problem(longerThan: .milliseconds(300)) != nil
        }
        let problem = try #require(publisher.stalls.problem(longerThan: .milliseconds(300)))
        #expect(problem.hasPrefix("publishing to results has failed for "), "\(problem)")
        #expect(problem.contains("TOPIC_AUTHORIZATION_FAILED"), "\(problem)")
        // Not yet a problem at the readiness limit.
        #expect(publisher.stalls.problem(longerThan: PublishStalls.readinessLimit) == nil)

        // Given up (the worker stopping): no longer reported.
        publishing.cancel()
        #expect(await publishing.value == false)
        #expect(publisher.stalls.problem(longerThan: .zero) == nil)
        cluster.clearRequestErrors(api: .produce)
        await producer.shutdown(flushTimeout: .seconds(2))
    }
}
