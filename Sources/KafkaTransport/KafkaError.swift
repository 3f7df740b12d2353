import CRdKafka

/// An error from the Kafka layer. Its description names the problem and, when librdkafka reported
/// one, librdkafka's error name and text. It never contains a secret.
public struct KafkaError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure this is. Extensible: match on the static members.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case configuration, clientCreation, subscription, produce, delivery, queueFull
            case flushTimeout, closed, rebalance, mockCluster, invalidArgument, fatal
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A configuration property was rejected (unknown name or invalid value).
        public static let configuration = Code(.configuration)
        /// librdkafka could not create the client.
        public static let clientCreation = Code(.clientCreation)
        /// Subscribing to topics failed.
        public static let subscription = Code(.subscription)
        /// librdkafka refused to enqueue a message.
        public static let produce = Code(.produce)
        /// A message was enqueued but its delivery failed (timed out, rejected by the broker, purged).
        public static let delivery = Code(.delivery)
        /// The producer's local queue is full; retry after some delivery reports arrive.
        public static let queueFull = Code(.queueFull)
        /// Flushing did not finish before its deadline.
        public static let flushTimeout = Code(.flushTimeout)
        /// The client is shut down.
        public static let closed = Code(.closed)
        /// A rebalance step failed.
        public static let rebalance = Code(.rebalance)
        /// A mock cluster operation failed.
        public static let mockCluster = Code(.mockCluster)
        /// An argument is out of range or unknown.
        public static let invalidArgument = Code(.invalidArgument)
        /// librdkafka raised a fatal error (an idempotent producer that can no longer guarantee
        /// its ordering, say): the client is unusable and the process should restart.
        public static let fatal = Code(.fatal)

        public var description: String { base.rawValue }
    }

    /// librdkafka's `MSG_SIZE_TOO_LARGE` (locally or from the broker): never succeeds as it is.
    public static let messageSizeTooLargeCode = RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE.rawValue

    public var code: Code
    /// What failed, in words.
    public var message: String
    /// librdkafka's error code (`rd_kafka_resp_err_t`), when it reported one.
    public var rdKafkaCode: Int32?
    /// librdkafka's name for `rdKafkaCode`, e.g. `MSG_TIMED_OUT` or `_QUEUE_FULL`.
    public var rdKafkaName: String?
    /// Whether trying again later may succeed.
    public var isRetryable: Bool

    public init(
        code: Code,
        message: String,
        rdKafkaCode: Int32? = nil,
        rdKafkaName: String? = nil,
        isRetryable: Bool = false
    ) {
        self.code = code
        self.message = message
        self.rdKafkaCode = rdKafkaCode
        self.rdKafkaName = rdKafkaName
        self.isRetryable = isRetryable
    }

    init(code: Code, message: String, rdKafka error: rd_kafka_resp_err_t, retryable: Bool? = nil) {
        self.init(
            code: code,
            message: "\(message): \(KafkaError.errorText(error))",
            rdKafkaCode: error.rawValue,
            rdKafkaName: KafkaError.errorName(error),
            isRetryable: retryable ?? KafkaError.isRetriable(error)
        )
    }

    /// Consumes an `rd_kafka_error_t` (destroying it).
    init(code: Code, message: String, consuming error: OpaquePointer) {
        let rdCode = rd_kafka_error_code(error)
        let text = rd_kafka_error_string(error).map { String(cString: $0) } ?? "unknown error"
        let retriable = rd_kafka_error_is_retriable(error) != 0
        rd_kafka_error_destroy(error)
        self.init(
            code: code,
            message: "\(message): \(text)",
            rdKafkaCode: rdCode.rawValue,
            rdKafkaName: KafkaError.errorName(rdCode),
            isRetryable: retriable
        )
    }

    public var description: String {
        if let rdKafkaName {
            return "Kafka \(code) error [\(rdKafkaName)]: \(message)"
        }
        return "Kafka \(code) error: \(message)"
    }

    static func errorName(_ error: rd_kafka_resp_err_t) -> String {
        rd_kafka_err2name(error).map { String(cString: $0) } ?? "\(error.rawValue)"
    }

    static func errorText(_ error: rd_kafka_resp_err_t) -> String {
        rd_kafka_err2str(error).map { String(cString: $0) } ?? "error \(error.rawValue)"
    }

    static func isRetriable(_ error: rd_kafka_resp_err_t) -> Bool {
        switch error {
        case RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__TIMED_OUT,
             RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
             RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
             RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
             RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
             RD_KAFKA_RESP_ERR__PURGE_INFLIGHT, RD_KAFKA_RESP_ERR__PURGE_QUEUE:
            return true
        default:
            return false
        }
    }
}

/// librdkafka's error codes by name (`NOT_LEADER_FOR_PARTITION`, `_MSG_TIMED_OUT`), for commands
/// and configuration that name errors in text.
public enum KafkaErrorCodes {
    /// The code for `name` (with or without the `RD_KAFKA_RESP_ERR_` prefix, any case), or a
    /// decimal code. `nil` when librdkafka knows no such error.
    public static func code(named name: String) -> Int32? {
        if let number = Int32(name) { return number }
        var wanted = name.uppercased()
        if wanted.hasPrefix("RD_KAFKA_RESP_ERR_") { wanted.removeFirst("RD_KAFKA_RESP_ERR_".count) }
        var descriptions: UnsafePointer<rd_kafka_err_desc>?
        var count = 0
        rd_kafka_get_err_descs(&descriptions, &count)
        guard let descriptions else { return nil }
        for index in 0..<count {
            let entry = descriptions[index]
            guard let namePointer = entry.name else { continue }
            if String(cString: namePointer) == wanted { return entry.code.rawValue }
        }
        return nil
    }

    /// librdkafka's name for a code.
    public static func name(of code: Int32) -> String {
        KafkaError.errorName(rd_kafka_resp_err_t(rawValue: code))
    }
}
