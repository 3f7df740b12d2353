import APNsCore
import ArgumentParser
import Foundation
import KafkaTransport
import Logging
import Synchronization

/// `apns-fleet bench kafka`: the Kafka layer's consume-plus-produce round trip, measured.
struct KafkaBenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kafka",
        abstract: "Benchmark the Kafka layer: consume records, produce one message each, store offsets.",
        discussion: """
            Fills an input topic, then consumes it with a group consumer and, for every record, \
            produces a message of the same size to an output topic and marks the record finished \
            when that message's delivery report arrives (as the push worker does with results). \
            Prints one machine-readable line: wall time, throughput, and the process's CPU time \
            per message over the measured phase.

            Against an external broker (--bootstrap) the CPU figure is the client's alone. Without \
            it an in-process mock cluster is used, whose broker threads are counted too.

            Example:
              rm -f /tmp/kafka.bootstrap
              apns-fleet kafka-dev --partitions 32 --topic bench.in --topic bench.out \\
                --bootstrap-file /tmp/kafka.bootstrap --no-stdin &
              until [ -s /tmp/kafka.bootstrap ]; do sleep 0.1; done
              apns-fleet bench kafka --bootstrap "$(cat /tmp/kafka.bootstrap)" --messages 200000
            """
    )

    @Option(help: "Brokers to use; the topics must exist. Default: an in-process mock cluster.")
    var bootstrap: String?

    @Option(help: "Input topic.")
    var inputTopic = "bench.in"

    @Option(help: "Output topic.")
    var outputTopic = "bench.out"

    @Option(help: "Partitions of each topic (in-process cluster only).")
    var partitions = 32

    @Option(help: "Messages to send through.")
    var messages = 200_000

    @Option(help: "Value size in bytes.")
    var size = 300

    @Option(help: "Producer compression.codec (none, lz4, zstd, snappy, gzip).")
    var compression = "lz4"

    @Option(help: "Producer linger.ms. Default: the library's default (what the worker uses).")
    var lingerMs: Int?

    @Option(help: "Give up after this many seconds of consuming (a missing topic, a broker gone), naming how far it got.")
    var timeoutSeconds = 600

    func validate() throws {
        guard messages > 0, size >= 0, partitions > 0, (lingerMs ?? 0) >= 0 else {
            throw ValidationError("--messages and --partitions must be positive, --size not negative")
        }
        guard timeoutSeconds > 0 else { throw ValidationError("--timeout-seconds must be positive") }
        if let bootstrap, let problem = KafkaSettings.bootstrapServersProblem(bootstrap, securityProtocol: .plaintext) {
            throw ValidationError("--bootstrap \(problem)")
        }
    }

    func run() async throws {
        var logger = Logger(label: "kafka-bench") { label in StreamLogHandler.standardError(label: label) }
        logger.logLevel = .warning

        var cluster: MockKafkaCluster?
        let servers: String
        if let bootstrap {
            servers = bootstrap
        } else {
            let mock = try MockKafkaCluster(brokers: 1, logger: logger)
            try mock.createTopic(inputTopic, partitions: partitions)
            try mock.createTopic(outputTopic, partitions: partitions)
            servers = mock.bootstrapServers
            cluster = mock
        }
        var client = KafkaClientConfiguration(bootstrapServers: [servers])
        client.statisticsInterval = nil
        var producerConfiguration = KafkaProducerConfiguration(client: client)
        producerConfiguration.compression = compression
        if let lingerMs { producerConfiguration.linger = .milliseconds(lingerMs) }
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)

        // Fill the input topic.
        let value = [UInt8](repeating: UInt8(ascii: "x"), count: size)
        let filled = Counter()
        for index in 0..<messages {
            let message = KafkaOutgoingMessage(topic: inputTopic, key: Array("key-\(index)".utf8), value: value)
            try await producer.sendWaitingForSpace(message, retryInterval: .milliseconds(1)) { result in
                if case .success = result { filled.increment() }
            }
        }
        try await producer.flush(timeout: .seconds(120))
        guard filled.value == messages else {
            throw CommandFailure("only \(filled.value) of \(messages) input messages were delivered")
        }

        var consumerConfiguration = KafkaConsumerConfiguration(
            client: client,
            groupID: "kafka-bench-\(UUID().uuidString.prefix(8))",
            topics: [inputTopic]
        )
        consumerConfiguration.sessionTimeout = .seconds(6)
        consumerConfiguration.maxBatchSize = 2_000
        consumerConfiguration.bufferCapacity = 20_000
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let (done, doneContinuation) = AsyncStream<Void>.makeStream()
        // What each delivery report needs, in one object, so that a report's closure captures
        // (retains and releases) one reference rather than four.
        let sink = DeliverySink(consumer: consumer, total: messages, done: doneContinuation)
        let outputTopic = self.outputTopic
        let total = messages

        var started: (ContinuousClock.Instant, Double)?
        var hostAtStart: HostCPUTimes?
        var consumed = 0
        // Ends the run (both waits below) if it does not finish in time.
        let timedOut = Atomic<Bool>(false)
        let timeout = Duration.seconds(timeoutSeconds)
        let watchdog = Task {
            guard (try? await Task.sleep(for: timeout)) != nil else { return }
            timedOut.store(true, ordering: .relaxed)
            consumer.close()
            doneContinuation.finish()
        }
        defer { watchdog.cancel() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await consumer.run() }
            for await batch in consumer.batches {
                if started == nil {
                    started = (.now, ProcessUsage.now().cpuSeconds)
                    hostAtStart = HostCPUTimes.now()
                }
                for record in batch {
                    let receipt = record.receipt
                    let message = KafkaOutgoingMessage(topic: outputTopic, key: record.key, value: record.value, headers: record.headers)
                    let onDelivery: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void = { result in
                        sink.delivered(receipt, result)
                    }
                    // Usually there is room in the queue, and nothing suspends.
                    try await producer.sendWaitingForSpace(message, retryInterval: .milliseconds(1), onDelivery: onDelivery)
                }
                consumed += batch.count
                if consumed >= total { break }
            }
            for await _ in done { break }
            consumer.close()
            try await group.waitForAll()
        }
        if timedOut.load(ordering: .relaxed) {
            await producer.shutdown(flushTimeout: .seconds(5))
            throw CommandFailure(
                "the benchmark did not finish within \(timeoutSeconds) s: \(consumed) of \(messages) records consumed, \(sink.finished.value) results acknowledged (\(sink.failed.value) failed); is the topic \(inputTopic) there, and the broker reachable?"
            )
        }
        guard let (startTime, startCPU) = started else { throw CommandFailure("nothing was consumed") }
        let wall = ContinuousClock.now - startTime
        let cpu = ProcessUsage.now().cpuSeconds - startCPU
        let steal = HostCPUTimes.stealPercent(since: hostAtStart)
        await producer.shutdown(flushTimeout: .seconds(30))
        withExtendedLifetime(cluster) {}

        let seconds = Double(wall.components.seconds) + Double(wall.components.attoseconds) / 1e18
        var json = JSONWriter()
        json.beginObject()
        json.field("suite", "kafka")
        json.field("messages", messages)
        json.field("message_bytes", size)
        json.field("compression", compression)
        let linger = producerConfiguration.linger.components
        json.field("linger_ms", linger.seconds * 1000 + linger.attoseconds / 1_000_000_000_000_000)
        json.field("broker", bootstrap == nil ? "in-process-mock" : "external")
        json.field("seconds", seconds)
        json.field("messages_per_second", Double(messages) / seconds, decimals: 0)
        json.field("cpu_seconds", cpu)
        json.field("cpu_us_per_message", cpu * 1e6 / Double(messages), decimals: 2)
        json.field("messages_per_cpu_second", Double(messages) / cpu, decimals: 0)
        json.field("failed", sink.failed.value)
        if let steal { json.field("host_steal_percent", steal, decimals: 1) }
        json.endObject()
        print(String(decoding: json.bytes, as: UTF8.self))
    }
}

/// Handles the bench's delivery reports: marks the consumed record finished, counts.
private final class DeliverySink: Sendable {
    let consumer: KafkaConsumer
    let total: Int
    let done: AsyncStream<Void>.Continuation
    let finished = Counter()
    let failed = Counter()

    init(consumer: KafkaConsumer, total: Int, done: AsyncStream<Void>.Continuation) {
        self.consumer = consumer
        self.total = total
        self.done = done
    }

    func delivered(_ receipt: KafkaRecordReceipt, _ result: Result<KafkaDeliveryReport, KafkaError>) {
        if case .failure = result { failed.increment() }
        consumer.markFinished(receipt)
        if finished.increment() == total { done.yield() }
    }
}

private final class Counter: Sendable {
    private let count = Atomic<Int>(0)

    @discardableResult
    func increment() -> Int { count.add(1, ordering: .relaxed).newValue }

    var value: Int { count.load(ordering: .relaxed) }
}
