import APNsCore
import CRdKafka
import Logging
import Synchronization

/// librdkafka's in-process mock Kafka cluster (`rdkafka_mock.h`): brokers listening on 127.0.0.1
/// at random ports, reachable by any Kafka client, with fault injection.
///
/// Limits (it is a test double, not Kafka): no CreateTopics or other admin APIs (create topics
/// with ``createTopic(_:partitions:replicationFactor:)``), about 5 MiB or 100,000 batches kept per
/// partition (the oldest are dropped), nothing persisted.
///
/// The control methods send an operation to the cluster's own thread and wait for its reply,
/// which takes microseconds; they are safe to call from any thread.
public final class MockKafkaCluster: @unchecked Sendable {
    // `@unchecked Sendable` is safe: both pointers are set once; librdkafka's mock API serialises
    // every call through the cluster's thread; both are freed only in deinit.
    private let host: RDKafkaHandle
    private let cluster: OpaquePointer
    /// Number of brokers; their ids are 1 through `brokerCount`.
    public let brokerCount: Int
    /// `host:port,host:port,...` of the brokers.
    public let bootstrapServers: String
    /// Partition counts of the topics created here. librdkafka checks neither the topic nor the
    /// partition of a leader move: an unknown topic is created on the spot, and a negative
    /// partition writes outside its array.
    private let createdTopics = Mutex<[String: Int]>([:])

    public init(brokers: Int, logger: Logger = Logger(label: "kafka.mock")) throws(KafkaError) {
        guard brokers >= 1 else {
            throw KafkaError(code: .invalidArgument, message: "a mock cluster needs at least one broker, not \(brokers)")
        }
        // The cluster lives inside a client handle; this one is never used to produce.
        host = try RDKafkaHandle(
            type: RD_KAFKA_PRODUCER,
            // Warnings and up only: the host has no bootstrap servers, which librdkafka notes.
            properties: [("client.id", "kafka-mock-host"), ("log_level", "4")],
            context: ClientContext(logger: logger, clientID: "kafka-mock-host", role: "producer")
        )
        guard let cluster = rd_kafka_mock_cluster_new(host.pointer, Int32(brokers)) else {
            throw KafkaError(code: .mockCluster, message: "librdkafka could not start a mock cluster of \(brokers) broker(s)")
        }
        self.cluster = cluster
        self.brokerCount = brokers
        self.bootstrapServers = rd_kafka_mock_cluster_bootstraps(cluster).map { String(cString: $0) } ?? ""
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
    }

    /// Creates a topic (the mock cluster implements no CreateTopics request).
    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1) throws(KafkaError) {
        if let problem = TopicNames.problem(with: name) {
            throw KafkaError(code: .invalidArgument, message: "topic \"\(name.prefix(60))\": \(problem)")
        }
        guard (1...100_000).contains(partitions), replicationFactor >= 1, replicationFactor <= brokerCount else {
            throw KafkaError(
                code: .invalidArgument,
                message: "topic \(name): need 1 <= partitions <= 100000 and 1 <= replication factor <= \(brokerCount)"
            )
        }
        try check(rd_kafka_mock_topic_create(cluster, name, Int32(partitions), Int32(replicationFactor)), "create topic \(name)")
        createdTopics.withLock { $0[name] = partitions }
    }

    /// Takes a broker down: its connections close and it refuses new ones until ``setBrokerUp(_:)``.
    public func setBrokerDown(_ broker: Int32) throws(KafkaError) {
        try checkBroker(broker)
        try check(rd_kafka_mock_broker_set_down(cluster, broker), "take broker \(broker) down")
    }

    public func setBrokerUp(_ broker: Int32) throws(KafkaError) {
        try checkBroker(broker)
        try check(rd_kafka_mock_broker_set_up(cluster, broker), "bring broker \(broker) up")
    }

    /// Delays every response of a broker by `milliseconds`.
    public func setRoundTripTime(broker: Int32, milliseconds: Int) throws(KafkaError) {
        try checkBroker(broker)
        guard milliseconds >= 0 else {
            throw KafkaError(code: .invalidArgument, message: "RTT must be >= 0 ms, not \(milliseconds)")
        }
        try check(rd_kafka_mock_broker_set_rtt(cluster, broker, Int32(clamping: milliseconds)), "set RTT of broker \(broker)")
    }

    /// Makes the next requests of one API (on any broker) fail with these errors, in order.
    public func pushRequestErrors(api: KafkaAPIKey, errors: [Int32]) {
        guard !errors.isEmpty else { return }
        let codes = errors.map { rd_kafka_resp_err_t(rawValue: $0) }
        codes.withUnsafeBufferPointer { buffer in
            rd_kafka_mock_push_request_errors_array(cluster, api.rawValue, buffer.count, buffer.baseAddress)
        }
    }

    /// Forgets errors pushed for one API.
    public func clearRequestErrors(api: KafkaAPIKey) {
        rd_kafka_mock_clear_request_errors(cluster, api.rawValue)
    }

    /// Moves the leadership of a partition to a broker.
    /// The topic must be one created by ``createTopic(_:partitions:replicationFactor:)``.
    public func setPartitionLeader(topic: String, partition: Int32, broker: Int32) throws(KafkaError) {
        try checkBroker(broker)
        let (count, known) = createdTopics.withLock { ($0[topic], $0.keys.sorted()) }
        guard let count else {
            throw KafkaError(code: .invalidArgument, message: "no topic \"\(topic.prefix(60))\" was created here (created: \(known.joined(separator: ", ")))")
        }
        guard partition >= 0, partition < count else {
            throw KafkaError(code: .invalidArgument, message: "no partition \(partition) in \(topic): its partitions are 0...\(count - 1)")
        }
        try check(rd_kafka_mock_partition_set_leader(cluster, topic, partition, broker), "move the leader of \(topic)[\(partition)]")
    }

    private func checkBroker(_ broker: Int32) throws(KafkaError) {
        guard broker >= 1, broker <= brokerCount else {
            throw KafkaError(code: .invalidArgument, message: "no broker \(broker): brokers are 1...\(brokerCount)")
        }
    }

    private func check(_ error: rd_kafka_resp_err_t, _ what: String) throws(KafkaError) {
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(code: .mockCluster, message: "could not \(what)", rdKafka: error)
        }
    }
}

/// A Kafka protocol API key, for per-API fault injection.
public struct KafkaAPIKey: Sendable, Hashable, CustomStringConvertible {
    public let rawValue: Int16

    public init(rawValue: Int16) { self.rawValue = rawValue }

    public static let produce = KafkaAPIKey(rawValue: 0)
    public static let fetch = KafkaAPIKey(rawValue: 1)
    public static let listOffsets = KafkaAPIKey(rawValue: 2)
    public static let metadata = KafkaAPIKey(rawValue: 3)
    public static let offsetCommit = KafkaAPIKey(rawValue: 8)
    public static let offsetFetch = KafkaAPIKey(rawValue: 9)
    public static let findCoordinator = KafkaAPIKey(rawValue: 10)
    public static let joinGroup = KafkaAPIKey(rawValue: 11)
    public static let heartbeat = KafkaAPIKey(rawValue: 12)
    public static let leaveGroup = KafkaAPIKey(rawValue: 13)
    public static let syncGroup = KafkaAPIKey(rawValue: 14)
    public static let apiVersions = KafkaAPIKey(rawValue: 18)
    public static let initProducerID = KafkaAPIKey(rawValue: 22)

    static let names: [(String, KafkaAPIKey)] = [
        ("Produce", .produce), ("Fetch", .fetch), ("ListOffsets", .listOffsets), ("Metadata", .metadata),
        ("OffsetCommit", .offsetCommit), ("OffsetFetch", .offsetFetch), ("FindCoordinator", .findCoordinator),
        ("JoinGroup", .joinGroup), ("Heartbeat", .heartbeat), ("LeaveGroup", .leaveGroup),
        ("SyncGroup", .syncGroup), ("ApiVersions", .apiVersions), ("InitProducerId", .initProducerID),
    ]

    /// Every name ``init(name:)`` knows.
    public static var knownNames: [String] { names.map(\.0) }

    /// An API by its protocol name (`Produce`, `Fetch`, any case) or number.
    public init?(name: String) {
        if let number = Int16(name), number >= 0 {
            self.init(rawValue: number)
            return
        }
        guard let match = Self.names.first(where: { $0.0.lowercased() == name.lowercased() }) else { return nil }
        self = match.1
    }

    public var description: String {
        Self.names.first(where: { $0.1 == self })?.0 ?? "ApiKey(\(rawValue))"
    }
}
