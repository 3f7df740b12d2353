import APNsCore
import CRdKafka
import Logging
import Metrics
import Synchronization

/// The Swift state librdkafka's callbacks reach through the handle's opaque pointer
/// (`rd_kafka_conf_set_opaque`). The handle keeps it alive for as long as librdkafka may call back.
final class ClientContext: Sendable {
    let logger: Logger
    let clientID: String
    /// "producer" or "consumer" (librdkafka's handle type): a worker's two clients share a
    /// client id, and their metrics must say which of them they are about.
    let role: String
    /// Called on the polling thread, inside `rd_kafka_consumer_poll` or `rd_kafka_consumer_close`.
    let rebalance: (@Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void)?
    /// A consumer's: an offset commit completed (its result and offsets). Called on the polling
    /// thread, like `rebalance`.
    let committed: (@Sendable (rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?) -> Void)?
    let delivered: Counter
    let deliveryFailed: Counter
    let consumed: Counter

    /// Where this client's metrics go (its configuration's, or the process's).
    let metrics: any MetricsFactory
    /// librdkafka's fatal error, once it has raised one: the client is unusable from then on.
    let fatalError = Mutex<KafkaError?>(nil)
    /// Whether `fatalError` is set: read for every message sent, so a plain atomic.
    let isFatal = Atomic<Bool>(false)
    /// A consumer's: a rebalance callback has run, so its group has completed a SyncGroup (see
    /// `RDKafkaHandle.deinit`).
    let groupSynced = Atomic<Bool>(false)
    /// A consumer's: it asked to join its group (`rd_kafka_subscribe`). One that never did
    /// cannot be in the state `RDKafkaHandle.deinit` must not destroy.
    let subscribed = Atomic<Bool>(false)
    /// Set when the handle is left undestroyed: its threads may still log, and nobody reads it.
    let silenced = Atomic<Bool>(false)
    /// Brokers (by librdkafka's name) with a round-trip gauge: one that leaves the client's
    /// statistics (removed from the cluster, or a bootstrap entry replaced by the real brokers)
    /// has its gauge removed, rather than reporting its last figure for good.
    private let brokersWithRTT = Mutex<Set<String>>([])

    init(
        logger: Logger,
        clientID: String,
        role: String,
        metrics: any MetricsFactory = MetricsSystem.factory,
        rebalance: (@Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void)? = nil,
        committed: (@Sendable (rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?) -> Void)? = nil
    ) {
        self.logger = logger
        self.clientID = clientID
        self.role = role
        self.rebalance = rebalance
        self.committed = committed
        self.metrics = metrics
        self.delivered = Counter(label: "kafka.producer.messages", dimensions: [("client", clientID), ("result", "delivered")], factory: metrics)
        self.deliveryFailed = Counter(label: "kafka.producer.messages", dimensions: [("client", clientID), ("result", "failed")], factory: metrics)
        self.consumed = Counter(label: "kafka.consumer.records", dimensions: [("client", clientID)], factory: metrics)
    }

    static func from(_ rk: OpaquePointer?) -> ClientContext? {
        guard let rk, let opaque = rd_kafka_opaque(rk) else { return nil }
        return Unmanaged<ClientContext>.fromOpaque(opaque).takeUnretainedValue()
    }

    func log(level: Int32, facility: String, message: String) {
        guard !silenced.load(ordering: .relaxed) else { return }
        // librdkafka uses syslog levels.
        let swiftLevel: Logger.Level
        switch level {
        case ...2: swiftLevel = .critical
        // A broker connection failing is routine while a broker restarts, and librdkafka retries.
        case 3 where facility == "FAIL": swiftLevel = .warning
        case 3: swiftLevel = .error
        case 4: swiftLevel = .warning
        case 5: swiftLevel = .notice
        case 6: swiftLevel = .info
        default: swiftLevel = .debug
        }
        let text = facility == "CONF" ? Self.redactingConfigurationLine(message) : message
        logger.log(level: swiftLevel, "\(text)", metadata: ["kafka.facility": "\(facility)"], source: "librdkafka")
    }

    /// With `debug=conf`, librdkafka 2.0.2 prints its configuration one "  name = value" line at
    /// a time, and hides only the properties it marks sensitive (not, for one,
    /// `sasl.oauthbearer.client.secret`). Values of secret-looking names are hidden here too.
    static func redactingConfigurationLine(_ line: String) -> String {
        guard let equals = line.firstRange(of: " = ") else { return line }
        let name = String(line[..<equals.lowerBound].drop(while: { $0 == " " }))
        guard KafkaClientConfiguration.isSecret(name) else { return line }
        return line[..<equals.upperBound] + "[redacted]"
    }

    func recordFatal(_ error: KafkaError, cause: String = "librdkafka raised a fatal error") {
        fatalError.withLock { $0 = $0 ?? error }
        isFatal.store(true, ordering: .releasing)
        logger.critical("\(cause); this client is unusable and the process stops", metadata: ["kafka.error": "\(error)"])
    }

    func error(code: Int32, reason: String) {
        let name = KafkaErrorCodes.name(of: code)
        Counter(label: "kafka.errors", dimensions: [("client", clientID), ("role", role), ("code", name)], factory: metrics).increment()
        // Broker connection errors are routine while a broker restarts; librdkafka retries them.
        let transient = code == RD_KAFKA_RESP_ERR__TRANSPORT.rawValue || code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN.rawValue
            || code == RD_KAFKA_RESP_ERR__RESOLVE.rawValue
        logger.log(
            level: code == RD_KAFKA_RESP_ERR__FATAL.rawValue ? .critical : (transient ? .info : .warning),
            "librdkafka error",
            metadata: ["kafka.error": "\(name)", "kafka.reason": "\(reason)"]
        )
    }

    func statistics(_ json: [UInt8]) {
        guard let stats = try? JSONParser.parse(json) else { return }
        // A worker's consumer and producer share a client id: the role keeps their gauges apart.
        let client = ("client", clientID)
        let role = ("role", self.role)
        for (field, label) in [
            ("msg_cnt", "kafka.client.queue.messages"), ("msg_size", "kafka.client.queue.bytes"),
            ("txmsgs", "kafka.client.tx.messages"), ("rxmsgs", "kafka.client.rx.messages"),
            ("replyq", "kafka.client.reply.queue"),
        ] {
            if let value = stats[field]?.double { Gauge(label: label, dimensions: [client, role], factory: metrics).record(value) }
        }
        guard case .object(let brokers)? = stats["brokers"] else { return }
        func rttGauge(_ broker: String) -> Gauge {
            Gauge(label: "kafka.broker.rtt.us", dimensions: [client, role, ("broker", broker)], factory: metrics)
        }
        var reported = Set<String>()
        for broker in brokers {
            // Average round-trip time in microseconds over the last window.
            if let rtt = broker.value["rtt"]?["avg"]?.double, rtt > 0 {
                rttGauge(broker.key).record(rtt)
                reported.insert(broker.key)
            }
        }
        let present = Set(brokers.map(\.key))
        let gone = brokersWithRTT.withLock { known -> Set<String> in
            known.formUnion(reported)
            let gone = known.subtracting(present)
            known.subtract(gone)
            return gone
        }
        for broker in gone { rttGauge(broker).destroy() }
    }
}

/// Owns one `rd_kafka_t`, destroying it in `deinit`.
///
/// `@unchecked Sendable` is safe: the pointer never changes, librdkafka's handle API is thread-safe
/// for every call made through it here, and `rd_kafka_destroy` runs only in `deinit`, when no
/// other reference (the polling thread holds one) can still use the pointer.
final class RDKafkaHandle: @unchecked Sendable {
    /// The error behind a `_FATAL` (`rd_kafka_fatal_error`), as a non-retryable ``KafkaError``.
    static func fatalError(of rk: OpaquePointer) -> KafkaError {
        var buffer = [CChar](repeating: 0, count: 512)
        let code = rd_kafka_fatal_error(rk, &buffer, buffer.count)
        let text = String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return KafkaError(code: .fatal, message: "fatal: \(text)", rdKafkaCode: code.rawValue, rdKafkaName: KafkaError.errorName(code), isRetryable: false)
    }

    let pointer: OpaquePointer
    let context: ClientContext
    private let isConsumer: Bool

    /// The retained context passed to librdkafka; balanced in `deinit`.
    private let contextOpaque: UnsafeMutableRawPointer

    /// Topic handles (`rd_kafka_topic_new`) by name, for producing without librdkafka looking
    /// the topic up by name (under its client-wide write lock) for every message. Destroyed in
    /// `deinit`, before the client. Bounded: past ``maxCachedTopics`` names, callers fall back to
    /// producing by name.
    private let topics = Mutex<[(name: String, rkt: OpaquePointer)]>([])
    private static let maxCachedTopics = 64

    init(
        type: rd_kafka_type_t,
        properties: [(key: String, value: String)],
        context: ClientContext,
        configure: (OpaquePointer) -> Void = { _ in }
    ) throws(KafkaError) {
        guard let conf = rd_kafka_conf_new() else {
            throw KafkaError(code: .clientCreation, message: "rd_kafka_conf_new returned nothing")
        }
        var confOwned = true
        defer { if confOwned { rd_kafka_conf_destroy(conf) } }

        for (key, value) in properties {
            try Self.set(conf, key, value)
        }
        let opaque = Unmanaged.passRetained(context).toOpaque()
        rd_kafka_conf_set_opaque(conf, opaque)
        rd_kafka_conf_set_log_cb(conf) { rk, level, facility, message in
            guard let context = ClientContext.from(rk) else { return }
            context.log(
                level: level,
                facility: facility.map { String(cString: $0) } ?? "",
                message: message.map { String(cString: $0) } ?? ""
            )
        }
        rd_kafka_conf_set_error_cb(conf) { rk, code, reason, _ in
            guard let context = ClientContext.from(rk) else { return }
            if code == RD_KAFKA_RESP_ERR__FATAL.rawValue, let rk {
                context.recordFatal(RDKafkaHandle.fatalError(of: rk))
            }
            context.error(code: code, reason: reason.map { String(cString: $0) } ?? "")
        }
        rd_kafka_conf_set_stats_cb(conf) { rk, json, length, _ in
            guard let json, let context = ClientContext.from(rk) else { return 0 }
            let bytes = [UInt8](UnsafeRawBufferPointer(start: json, count: length))
            context.statistics(bytes)
            return 0  // librdkafka frees `json`
        }
        configure(conf)

        var errorText = [CChar](repeating: 0, count: 512)
        guard let handle = rd_kafka_new(type, conf, &errorText, errorText.count) else {
            Unmanaged<ClientContext>.fromOpaque(opaque).release()
            let text = errorText.withUnsafeBufferPointer { buffer in
                buffer.baseAddress.map { String(cString: $0) } ?? ""
            }
            // What fails here is the settings' content: a TLS file librdkafka cannot load, a
            // wrong key password, a SASL mechanism it lacks. Its text names the property (never
            // a password's value).
            throw KafkaError(code: .clientCreation, message: "librdkafka could not create the client from its settings (check the kafka.ssl.* and kafka.sasl.* files and values): \(text)")
        }
        confOwned = false  // rd_kafka_new took it
        self.pointer = handle
        self.context = context
        self.contextOpaque = opaque
        self.isConsumer = type == RD_KAFKA_CONSUMER
    }

    deinit {
        topics.withLock { cached in
            for entry in cached { rd_kafka_topic_destroy(entry.rkt) }
            cached.removeAll()
        }
        if isConsumer {
            // librdkafka 2.0.2 aborts the process destroying a cooperative-sticky consumer that
            // has had a JoinGroup answered but no SyncGroup yet (its assignor state is still
            // NULL; fixed in 2.3.0, librdkafka#4312). A consumer that never saw a rebalance
            // callback may be in that state, for example stopped during its first join: it is
            // left undestroyed, and silent, rather than take the process down. Only consumers
            // closed that early are, once each; one that never subscribed is destroyed.
            guard context.groupSynced.load(ordering: .acquiring) || !context.subscribed.load(ordering: .acquiring) else {
                context.silenced.store(true, ordering: .relaxed)
                return
            }
            // The consumer is closed explicitly on its polling thread (which serves the final
            // rebalance); closing again here would run callbacks nobody polls.
            rd_kafka_destroy_flags(pointer, Int32(RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE))
        } else {
            rd_kafka_destroy(pointer)
        }
        Unmanaged<ClientContext>.fromOpaque(contextOpaque).release()
    }

    /// A topic handle for `name`, created on first use and kept until the client is destroyed;
    /// `nil` when librdkafka refuses the name or the cache is full (produce by name instead).
    func topicHandle(_ name: String) -> OpaquePointer? {
        topics.withLock { cached -> OpaquePointer? in
            for entry in cached where entry.name == name { return entry.rkt }
            guard cached.count < Self.maxCachedTopics, let rkt = rd_kafka_topic_new(pointer, name, nil) else {
                return nil
            }
            cached.append((name, rkt))
            return rkt
        }
    }

    private static func set(_ conf: OpaquePointer, _ key: String, _ value: String) throws(KafkaError) {
        var errorText = [CChar](repeating: 0, count: 512)
        let result = rd_kafka_conf_set(conf, key, value, &errorText, errorText.count)
        guard result != RD_KAFKA_CONF_OK else { return }
        if result == RD_KAFKA_CONF_UNKNOWN {
            throw KafkaError(code: .configuration, message: "unknown librdkafka property '\(key)'")
        }
        if KafkaClientConfiguration.isSecret(key) {
            // librdkafka's message may quote the value.
            throw KafkaError(code: .configuration, message: "invalid value for property '\(key)' (value hidden)")
        }
        let text = errorText.withUnsafeBufferPointer { buffer in
            buffer.baseAddress.map { String(cString: $0) } ?? ""
        }
        throw KafkaError(code: .configuration, message: "invalid value for property '\(key)': \(text)")
    }
}

/// An `rd_kafka_topic_partition_list_t` built from Swift, destroyed in `deinit`.
/// Used only on the thread that made it.
final class TopicPartitionList {
    let pointer: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>

    init(capacity: Int) {
        pointer = rd_kafka_topic_partition_list_new(Int32(max(1, capacity)))
    }

    convenience init(_ partitions: some Collection<TopicPartition>) {
        self.init(capacity: partitions.count)
        for partition in partitions { add(partition) }
    }

    @discardableResult
    func add(_ partition: TopicPartition, offset: Int64? = nil) -> UnsafeMutablePointer<rd_kafka_topic_partition_t> {
        let element = rd_kafka_topic_partition_list_add(pointer, partition.topic, partition.partition)!
        if let offset { element.pointee.offset = offset }
        return element
    }

    deinit { rd_kafka_topic_partition_list_destroy(pointer) }

    static func read(_ list: UnsafePointer<rd_kafka_topic_partition_list_t>) -> [(TopicPartition, Int64, rd_kafka_resp_err_t)] {
        guard let elements = list.pointee.elems else { return [] }
        return (0..<Int(list.pointee.cnt)).map { index in
            let element = elements[index]
            let topic = element.topic.map { String(cString: $0) } ?? ""
            return (TopicPartition(topic: topic, partition: element.partition), element.offset, element.err)
        }
    }
}
