import APNsCore

/// A record consumed from Kafka, copied out of librdkafka's buffers.
///
/// Immutable and shared by reference: a record passes through several hands (the batch, the
/// worker's admission, the delivery that finishes it), and copying a struct of this many arrays
/// and strings cost a retain and a release for each of them at every hand-over.
public final class KafkaRecord: Sendable {
    public let topic: String
    public let partition: Int32
    public let offset: Int64
    public let key: [UInt8]?
    public let value: [UInt8]
    public let headers: [RecordHeader]
    /// Milliseconds since the epoch (create or log-append time), when the record has one.
    public let timestamp: Int64?
    /// Which assignment of the partition this record was consumed under.
    public let assignmentEpoch: UInt64
    /// When the consumer took the record from librdkafka, in nanoseconds of the monotonic clock
    /// (`DispatchTime`'s, which is also NIO's); 0 when unknown. The start of the latency the
    /// worker adds.
    public let polledAtUptimeNanoseconds: UInt64

    public init(
        topic: String,
        partition: Int32,
        offset: Int64,
        key: [UInt8]?,
        value: [UInt8],
        headers: [RecordHeader],
        timestamp: Int64?,
        assignmentEpoch: UInt64,
        polledAtUptimeNanoseconds: UInt64 = 0
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
        self.assignmentEpoch = assignmentEpoch
        self.polledAtUptimeNanoseconds = polledAtUptimeNanoseconds
    }

    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }

    /// What ``KafkaConsumer/markFinished(_:)-(KafkaRecordReceipt)`` needs, without the record's bytes,
    /// for work that outlives the record.
    public var receipt: KafkaRecordReceipt {
        KafkaRecordReceipt(topicPartition: topicPartition, offset: offset, assignmentEpoch: assignmentEpoch)
    }
}

/// Identifies one consumed record for marking it finished.
public struct KafkaRecordReceipt: Sendable, Hashable {
    public var topicPartition: TopicPartition
    public var offset: Int64
    public var assignmentEpoch: UInt64

    public init(topicPartition: TopicPartition, offset: Int64, assignmentEpoch: UInt64) {
        self.topicPartition = topicPartition
        self.offset = offset
        self.assignmentEpoch = assignmentEpoch
    }
}

/// A message to produce.
public struct KafkaOutgoingMessage: Sendable {
    public var topic: String
    /// `nil` lets the partitioner choose from the key (librdkafka's default, consistent_random).
    public var partition: Int32?
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [RecordHeader]
    /// Milliseconds since the epoch; `nil` means now.
    public var timestamp: Int64?

    public init(
        topic: String,
        partition: Int32? = nil,
        key: [UInt8]? = nil,
        value: [UInt8],
        headers: [RecordHeader] = [],
        timestamp: Int64? = nil
    ) {
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
    }
}

extension KafkaRecord {
    /// Its value, key and headers together (names and values), in bytes.
    public var contentBytes: Int { contentByteCount(key: key, value: value, headers: headers) }
}

extension KafkaOutgoingMessage {
    /// Its value, key and headers together (names and values), in bytes: what counts against
    /// `message.max.bytes` besides the record's own fields and the headers' length fields.
    public var contentBytes: Int { contentByteCount(key: key, value: value, headers: headers) }
}

private func contentByteCount(key: [UInt8]?, value: [UInt8], headers: [RecordHeader]) -> Int {
    value.count + (key?.count ?? 0) + headers.reduce(0) { $0 + $1.byteCount }
}

/// Where a produced message was written.
public struct KafkaDeliveryReport: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
}
