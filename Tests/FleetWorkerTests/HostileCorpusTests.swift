import APNsClient
import APNsCore
import APNsSimulator
import FleetTestSupport
import FleetWorker
import Foundation
import KafkaTransport
import Logging
import Synchronization
import Testing

/// One malformed record and what the worker must make of it.
struct HostileRecord: Sendable, CustomStringConvertible {
    var name: String
    var value: [UInt8]
    var headers: [RecordHeader]
    /// What the `dlq-reason` header and every result's reason must contain.
    var reason: String
    /// Results expected: one per token the record seems to address, or one with an empty token.
    var results: Int

    var description: String { name }
}

/// The committed corpus (Tests/Corpus/hostile-jobs, described in its expected.tsv) plus the
/// records too big to commit as files, built here.
enum HostileCorpus {
    static let directory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Corpus/hostile-jobs")

    static func load() throws -> [HostileRecord] {
        let manifest = try String(contentsOf: directory.appendingPathComponent("expected.tsv"), encoding: .utf8)
        var records: [HostileRecord] = []
        for line in manifest.split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 3, let results = Int(fields[2]) else { throw TestSetupError("bad line in expected.tsv: \(line)") }
            let file = directory.appendingPathComponent(fields[0])
            let value = try [UInt8](Data(contentsOf: file))
            let headersFile = file.deletingPathExtension().appendingPathExtension("headers")
            var headers: [RecordHeader] = []
            if let text = try? String(contentsOf: headersFile, encoding: .utf8) {
                headers = try text.split(separator: "\n").map { try header(String($0)) }
            }
            records.append(HostileRecord(name: fields[0], value: value, headers: headers, reason: fields[1], results: results))
        }
        return records + generated()
    }

    /// `key: value`, the value with %XX escapes for bytes a text file cannot hold.
    static func header(_ line: String) throws -> RecordHeader {
        guard let separator = line.range(of: ": ") else { throw TestSetupError("bad header line: \(line)") }
        var bytes: [UInt8] = []
        var rest = Substring(line[separator.upperBound...]).utf8[...]
        while let byte = rest.popFirst() {
            if byte == UInt8(ascii: "%"), rest.count >= 2, let escaped = UInt8(String(decoding: rest.prefix(2), as: UTF8.self), radix: 16) {
                bytes.append(escaped)
                rest = rest.dropFirst(2)
            } else {
                bytes.append(byte)
            }
        }
        return RecordHeader(key: String(line[..<separator.lowerBound]), value: bytes)
    }

    static let token = String(repeating: "ab", count: 32)

    /// Records of a size that files in the repository should not have.
    static func generated() -> [HostileRecord] {
        func record(_ name: String, _ text: String, _ reason: String, results: Int = 1) -> HostileRecord {
            HostileRecord(name: name, value: Array(text.utf8), headers: [], reason: reason, results: results)
        }
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        let hugeString = String(repeating: "x", count: 400_000)
        // The largest record Kafka takes by default is about 1 MB; this one is just under it.
        let megabyte = #"{"token":"\#(token)","payload":{"b":""# + String(repeating: "m", count: 999_000 - 100) + #""}}"#
        let padded = megabyte.utf8.count < 999_000 ? megabyte + String(repeating: " ", count: 999_000 - megabyte.utf8.count) : megabyte
        let overLimit = (0..<1001).map { "\"" + String(format: "%064x", $0 + 1) + "\"" }.joined(separator: ",")
        let manyKeys = (0..<20_000).map { #""k\#($0)":\#($0)"# }.joined(separator: ",")
        let longNumber = String(repeating: "7", count: 100_000)
        return [
            record("generated: 100,000 levels of nesting", #"{"token":"\#(token)","payload":{"x":\#(deep)}}"#, "nested deeper than 64 levels"),
            record("generated: 400 KB string", #"{"token":"\#(token)","push_type":"alert","payload":{"s":"\#(hugeString)"}}"#, "payload: payload is 400008 bytes; at most 4096 are allowed"),
            record("generated: 999,000-byte value", padded, "record is 999000 bytes; at most 524288 are accepted"),
            record("generated: 1001 tokens", #"{"tokens":[\#(overLimit)],"payload":{}}"#, "tokens: 1001 tokens in one job; at most 1000 are allowed", results: 1001),
            record("generated: 20,000 unknown keys and no token", #"{\#(manyKeys),"payload":{}}"#, "tokens: no device token"),
            record("generated: 100,000-digit priority", #"{"token":"\#(token)","payload":{},"priority":\#(longNumber)}"#, "priority: priority is 7777"),
        ]
    }
}

/// Every hostile record through the real pipeline: librdkafka's mock cluster, the simulator
/// over TLS, the HTTP/2 client pool and the push worker, as in PushWorkerPipelineTests.
@Suite("Hostile corpus through the push worker", .timeLimit(.minutes(2)))
struct HostileCorpusTests {
    static let good = String(repeating: "0", count: 62) + "2a"

    @Test("each malformed record gets invalid results and a DLQ copy; the worker stays up and delivers the next job")
    func corpus() async throws {
        let corpus = try HostileCorpus.load()
        #expect(corpus.count >= 50)
        var logger = Logger(label: "hostile-corpus-test")
        logger.logLevel = .critical  // each record is logged as rejected; that is not news here

        let backends = try await InProcessBackends.start(name: "hostile", jobPartitions: 2, otherPartitions: 1, logger: logger)
        let (directory, simulator, topics, client, app) = (backends.directory, backends.simulator, backends.topics, backends.client, backends.app)
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            withExtendedLifetime(backends.cluster) {}  // Kafka stays up until the test ends
        }
        let clients = try APNsClients(apps: [app], logger: logger)
        var consumerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "push", topics: [topics.jobs, topics.retry])
        consumerConfiguration.sessionTimeout = .seconds(6)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        let worker = PushWorker(
            configuration: .init(fleet: FleetConfiguration(apps: [app]), workerID: "w-hostile", maxInFlight: 200),
            consumer: consumer, producer: producer,
            sender: APNsClientSender(clients: clients, requestTimeout: .seconds(10)), logger: logger
        )
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: [topics.results, topics.deadLetter])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)

        let results = Collected<NotificationResult>()
        let deadLetters = Collected<KafkaRecord>()
        let workerExited = Collected<String>()
        var sources: [SourcePosition: HostileRecord] = [:]
        var goodSource: SourcePosition?
        let expectedResults = corpus.map(\.results).reduce(0, +) + 1
        let started = ContinuousClock.now

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await clients.run() }
            group.addTask { try await producer.run() }
            group.addTask { try await consumer.run() }
            group.addTask {
                do {
                    try await worker.run()
                    workerExited.append("returned")
                } catch {
                    workerExited.append("threw \(error)")
                }
            }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    for record in batch {
                        if record.topic == topics.results {
                            results.append(try NotificationResult(decoding: record.value))
                        } else {
                            deadLetters.append(record)
                        }
                    }
                    reader.markFinished(batch)
                }
            }
            for record in corpus {
                // Records with retry headers are hostile retry records: only the retry topic's
                // retry headers are read (on a job topic they are the producer's own).
                let isRetry = record.headers.contains { $0.key == RetryHeaders.attemptKey }
                let report = try await producer.send(KafkaOutgoingMessage(topic: isRetry ? topics.retry : topics.jobs, value: record.value, headers: record.headers))
                sources[SourcePosition(topic: report.topic, partition: report.partition, offset: report.offset)] = record
            }
            // Published after every hostile record: it must still be delivered.
            let report = try await producer.send(KafkaOutgoingMessage(
                topic: topics.jobs, value: Array(#"{"id":"after-the-corpus","token":"\#(Self.good)","payload":{"aps":{"alert":"still here"}}}"#.utf8)
            ))
            goodSource = SourcePosition(topic: report.topic, partition: report.partition, offset: report.offset)

            let deadline = ContinuousClock.now + .seconds(60)
            while results.count < expectedResults || deadLetters.count < corpus.count, ContinuousClock.now < deadline, workerExited.count == 0 {
                try await Task.sleep(for: .milliseconds(100))
            }
            try await Task.sleep(for: .milliseconds(300))  // let a stray duplicate show up
            #expect(workerExited.items.isEmpty, "the worker stopped: \(workerExited.items)")
            consumer.close()
            reader.close()
            clients.shutdown()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop()
        let elapsed = ContinuousClock.now - started
        #expect(sources.count == corpus.count)

        // The good job, published last, was delivered.
        let delivered = results.items.filter { $0.source == goodSource }
        #expect(delivered.count == 1 && delivered.first?.outcome == .delivered && delivered.first?.status == 200, "\(delivered)")

        // Each hostile record: its results and its DLQ copy.
        let resultsBySource = Dictionary(grouping: results.items.filter { $0.source != goodSource }, by: \.source)
        var deadLettersBySource: [SourcePosition: [KafkaRecord]] = [:]
        for record in deadLetters.items {
            guard let headers = try? DeadLetterHeaders(headers: record.headers) else {
                Issue.record("a DLQ record without readable DLQ headers: \(record.headers)")
                continue
            }
            deadLettersBySource[headers.source, default: []].append(record)
        }
        #expect(Set(resultsBySource.keys).isSubset(of: Set(sources.keys)), "results for records never sent")
        #expect(deadLetters.count == corpus.count, "one DLQ copy per hostile record, none for the good job")

        for (source, record) in sources.sorted(by: { $0.value.name < $1.value.name }) {
            let mine = resultsBySource[source] ?? []
            #expect(mine.count == record.results, "\(record): \(mine.count) results, expected \(record.results): \(mine.map(\.reason))")
            // A retry record with a valid `attempt` was sent before: `failed` with its attempts,
            // not `invalid` ("never sent").
            let attempts = record.headers.first { $0.key == "attempt" }?.text.flatMap { Int($0) }.flatMap { (1...1_000_000).contains($0) ? $0 : nil }
            for result in mine {
                #expect(result.outcome == (attempts == nil ? .invalid : .failed), "\(record)")
                #expect(result.attempts == (attempts ?? 0) && result.status == nil, "\(record): attempts \(result.attempts)")
                #expect(result.reason?.contains(record.reason) == true, "\(record): reason \(result.reason ?? "nil") lacks \(record.reason)")
                #expect(result.token.isEmpty || (try? DeviceToken(hex: result.token)) != nil, "\(record): token \(result.token)")
            }
            let copies = deadLettersBySource[source] ?? []
            #expect(copies.count == 1, "\(record): \(copies.count) DLQ copies")
            guard let copy = copies.first else { continue }
            #expect(copy.value == record.value, "\(record): the DLQ copy is not the original bytes")
            #expect(record.headers.allSatisfy { copy.headers.contains($0) }, "\(record): the original headers are kept")
            let reason = copy.headers.text(DeadLetterHeaders.reasonKey) ?? ""
            #expect(reason.contains(record.reason), "\(record): dlq-reason \(reason) lacks \(record.reason)")
            // The reason goes into a header, a result and a log line: no raw control characters
            // (a CR/LF from a hostile header must not forge a line), and no megabyte echoes.
            #expect(!reason.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "\(record): control characters in \(reason.debugDescription)")
            #expect(reason.utf8.count < 512, "\(record): a \(reason.utf8.count)-byte reason")
        }
        #expect(simulator.counters.snapshot().totals.answered == 1, "only the good job reached APNs")
        #expect(elapsed < .seconds(20), "took \(elapsed)")
    }
}
