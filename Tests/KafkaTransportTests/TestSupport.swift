import APNsCore
import Foundation
import KafkaTransport
import Logging
import FleetTestSupport
import Synchronization

let testLogger: Logger = {
    var logger = Logger(label: "kafka-test")
    logger.logLevel = ProcessInfo.processInfo.environment["KAFKA_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .warning
    return logger
}()

func clientConfiguration(_ cluster: MockKafkaCluster) -> KafkaClientConfiguration {
    var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
    client.statisticsInterval = nil
    return client
}

func producerConfiguration(_ cluster: MockKafkaCluster) -> KafkaProducerConfiguration {
    var configuration = KafkaProducerConfiguration(client: clientConfiguration(cluster))
    configuration.linger = .milliseconds(1)
    configuration.messageTimeout = .seconds(60)
    return configuration
}

/// A one-broker mock cluster holding `topic`, and a producer on it.
func clusterWithProducer(topic: String, partitions: Int) throws -> (MockKafkaCluster, KafkaProducer) {
    let cluster = try MockKafkaCluster(brokers: 1, logger: testLogger)
    try cluster.createTopic(topic, partitions: partitions)
    return (cluster, try KafkaProducer(configuration: producerConfiguration(cluster), logger: testLogger))
}

func consumerConfiguration(_ cluster: MockKafkaCluster, group: String, topics: [String]) -> KafkaConsumerConfiguration {
    var configuration = KafkaConsumerConfiguration(client: clientConfiguration(cluster), groupID: group, topics: topics)
    // The mock cluster's rebalances take about session.timeout.ms - 1 s.
    configuration.sessionTimeout = .milliseconds(6000)
    configuration.client.properties["heartbeat.interval.ms"] = "500"
    configuration.commitInterval = .milliseconds(200)
    configuration.pollTimeout = .milliseconds(50)
    configuration.maxBatchSize = 500
    return configuration
}

/// What one consumer received, shared between its loop and the test.
final class ReceivedRecords: Sendable {
    private let state = Mutex<[KafkaRecord]>([])

    func append(_ records: [KafkaRecord]) {
        state.withLock { $0.append(contentsOf: records) }
    }

    var all: [KafkaRecord] { state.withLock { $0 } }
    var count: Int { state.withLock { $0.count } }

    /// (partition, offset) pairs received.
    var positions: Set<Position> {
        state.withLock { records in Set(records.map { Position(partition: $0.partition, offset: $0.offset) }) }
    }
}

struct Position: Hashable, Sendable, CustomStringConvertible {
    var partition: Int32
    var offset: Int64
    var description: String { "\(partition)@\(offset)" }
}

/// Thread-safe counters and sets for delivery reports.
final class Deliveries: Sendable {
    private let state = Mutex<(delivered: Set<Position>, failures: [KafkaError])>(([], []))

    func record(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        state.withLock { state in
            switch result {
            case .success(let report): state.delivered.insert(Position(partition: report.partition, offset: report.offset))
            case .failure(let error): state.failures.append(error)
            }
        }
    }

    var delivered: Set<Position> { state.withLock { $0.delivered } }
    var failures: [KafkaError] { state.withLock { $0.failures } }
}

/// Consumes in a loop until the consumer closes, recording every record and marking it finished
/// (after `finishDelay`, from another task, if given, so that records are in flight for a while).
func consumeLoop(
    _ consumer: KafkaConsumer,
    into received: ReceivedRecords,
    finishDelay: Duration? = nil
) async {
    await withDiscardingTaskGroup { group in
        for await batch in consumer.batches {
            received.append(batch)
            if let finishDelay {
                let receipts = batch.map(\.receipt)
                group.addTask {
                    try? await Task.sleep(for: finishDelay)
                    for receipt in receipts { consumer.markFinished(receipt) }
                }
            } else {
                consumer.markFinished(batch)
            }
        }
    }
}

extension String {
    var bytes: [UInt8] { Array(utf8) }
}

/// Keeps what a producer reported to it.
final class RecordingRecipient: KafkaDeliveryRecipient, @unchecked Sendable {
    private let state = Mutex<[Result<KafkaDeliveryReport, KafkaError>]>([])

    override func kafkaDelivered(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        state.withLock { $0.append(result) }
    }

    var reports: [Result<KafkaDeliveryReport, KafkaError>] { state.withLock { $0 } }
}

/// Watches whether an object is still alive.
final class WeakReference: @unchecked Sendable {
    private let lock = NSLock()
    private weak var stored: AnyObject?

    var object: AnyObject? {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}
