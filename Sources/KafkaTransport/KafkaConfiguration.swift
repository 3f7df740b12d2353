import APNsCore
import CoreMetrics

/// Settings shared by producers and consumers: where the brokers are, how to authenticate, and
/// any librdkafka property passed through as is.
public struct KafkaClientConfiguration: Sendable {
    /// `host:port` of one or more brokers. Default: none (required).
    public var bootstrapServers: [String]
    /// `client.id`, shown in broker logs and metrics. Default: `apns-fleet`.
    public var clientID: String = "apns-fleet"
    /// How to reach and authenticate to the brokers. Default: plaintext, no authentication.
    public var security: Security = .plaintext
    /// How often librdkafka emits statistics (mapped to metrics); `nil` turns them off.
    /// Default: 15 seconds.
    public var statisticsInterval: Duration? = .seconds(15)
    /// Any librdkafka property (see librdkafka's CONFIGURATION.md), applied after everything
    /// above, so it wins. Values of properties whose names suggest secrets (`*password*`,
    /// `*secret*`, `*.key.pem`, `sasl.oauthbearer.config`, …) are never logged. Default: empty.
    public var properties: [String: String] = [:]
    /// Where this client's metrics go. Default: `nil`, the process's (`MetricsSystem.factory`).
    /// Tests give a client a registry of its own, to read what it alone reports. Clients that
    /// share a registry need distinct `clientID`s: their per-partition gauges are told apart by
    /// it, and a consumer drops its gauge when it gives a partition up.
    public var metricsFactory: (any MetricsFactory)?

    /// `metricsFactory`, or the process's when none is given.
    var metrics: any MetricsFactory { metricsFactory ?? MetricsSystem.factory }

    public init(bootstrapServers: [String]) {
        self.bootstrapServers = bootstrapServers
    }

    /// Transport security and authentication.
    public struct Security: Sendable {
        /// TLS settings; `nil` means plaintext.
        public var tls: TLS?
        /// SASL authentication; `nil` means none.
        public var sasl: SASL?

        public init(tls: TLS? = nil, sasl: SASL? = nil) {
            self.tls = tls
            self.sasl = sasl
        }

        public static let plaintext = Security()

        /// `security.protocol` as librdkafka spells it.
        var securityProtocol: String {
            switch (tls != nil, sasl != nil) {
            case (false, false): "plaintext"
            case (true, false): "ssl"
            case (false, true): "sasl_plaintext"
            case (true, true): "sasl_ssl"
            }
        }
    }

    /// TLS settings. Paths are PEM files. Default for each: unset (system CA store, no client
    /// certificate).
    public struct TLS: Sendable {
        /// CA certificate(s) to verify the brokers (`ssl.ca.location`).
        public var caLocation: String?
        /// Client certificate for mutual TLS (`ssl.certificate.location`).
        public var certificateLocation: String?
        /// Client private key (`ssl.key.location`).
        public var keyLocation: String?
        /// Passphrase of the client key (`ssl.key.password`).
        public var keyPassword: Secret?
        /// Verify that the broker's certificate names the host (`ssl.endpoint.identification.algorithm`).
        /// Default: true.
        public var verifyHostname = true

        public init(
            caLocation: String? = nil,
            certificateLocation: String? = nil,
            keyLocation: String? = nil,
            keyPassword: Secret? = nil
        ) {
            self.caLocation = caLocation
            self.certificateLocation = certificateLocation
            self.keyLocation = keyLocation
            self.keyPassword = keyPassword
        }
    }

    /// SASL username/password authentication.
    public struct SASL: Sendable {
        public enum Mechanism: String, Sendable, CaseIterable {
            case plain = "PLAIN"
            case scramSHA256 = "SCRAM-SHA-256"
            case scramSHA512 = "SCRAM-SHA-512"
        }

        public var mechanism: Mechanism
        public var username: String
        public var password: Secret

        public init(mechanism: Mechanism, username: String, password: Secret) {
            self.mechanism = mechanism
            self.username = username
            self.password = password
        }
    }

    /// The librdkafka properties for this configuration, in the order they are applied.
    func rdKafkaProperties() -> [(key: String, value: String)] {
        var out: [(key: String, value: String)] = [
            ("bootstrap.servers", bootstrapServers.joined(separator: ",")),
            ("client.id", clientID),
            ("security.protocol", security.securityProtocol),
        ]
        if let interval = statisticsInterval {
            out.append(("statistics.interval.ms", String(max(1, interval.milliseconds))))
        }
        if let tls = security.tls {
            if let value = tls.caLocation { out.append(("ssl.ca.location", value)) }
            if let value = tls.certificateLocation { out.append(("ssl.certificate.location", value)) }
            if let value = tls.keyLocation { out.append(("ssl.key.location", value)) }
            if let value = tls.keyPassword { out.append(("ssl.key.password", value.revealed)) }
            out.append(("ssl.endpoint.identification.algorithm", tls.verifyHostname ? "https" : "none"))
        }
        if let sasl = security.sasl {
            out.append(("sasl.mechanisms", sasl.mechanism.rawValue))
            out.append(("sasl.username", sasl.username))
            out.append(("sasl.password", sasl.password.revealed))
        }
        for key in properties.keys.sorted() {
            if let value = properties[key] { out.append((key, value)) }
        }
        return out
    }

    /// Passthrough properties that only a consumer understands (librdkafka's CONFIGURATION.md,
    /// "C"). One `kafka.properties` list serves both clients of a worker; the producer skips
    /// these instead of warning about each at start.
    static let consumerOnlyProperties: Set<String> = [
        "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms",
        "heartbeat.interval.ms", "group.protocol.type", "coordinator.query.interval.ms",
        "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms", "enable.auto.offset.store",
        "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.message.max.bytes",
        "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms",
        "isolation.level", "enable.partition.eof", "check.crcs", "auto.offset.reset",
    ]

    /// Passthrough properties that only a producer understands ("P"); the consumer skips them.
    static let producerOnlyProperties: Set<String> = [
        "transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
        "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms", "linger.ms",
        "message.send.max.retries", "retries", "queue.buffering.backpressure.threshold", "compression.codec",
        "compression.type", "batch.num.messages", "batch.size", "delivery.report.only.error",
        "request.required.acks", "acks", "request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms",
        "partitioner", "compression.level", "sticky.partitioning.linger.ms",
    ]

    /// Properties the delivery guarantees rest on: passthrough `properties` never override them
    /// (the fleet's configuration refuses them with a reason).
    static let managedProperties: Set<String> = [
        "enable.idempotence", "enable.auto.offset.store", "enable.auto.commit", "group.id", "enable.partition.eof",
        "delivery.report.only.error", "offset.store.method",
    ]

    /// Whether a property's value must never be shown.
    static func isSecret(_ key: String) -> Bool {
        let lowered = key.lowercased()
        return lowered.contains("password") || lowered.contains("secret") || lowered.hasSuffix(".pem")
            || lowered.contains("oauthbearer.config") || lowered.contains("sasl.username")
            || lowered.contains("jaas")
    }
}

/// Settings of an idempotent producer.
public struct KafkaProducerConfiguration: Sendable {
    public var client: KafkaClientConfiguration
    /// How long a message may wait, including retries, before its delivery fails
    /// (`message.timeout.ms`). Default: 120 seconds, well above librdkafka's 30-second request
    /// timeout: a message that times out while its request may still land is what makes
    /// librdkafka 2.0.2's idempotent producer raise fatal errors; the callers retry anyway.
    public var messageTimeout: Duration = .seconds(120)
    /// How long to wait for more messages before sending a batch (`linger.ms`). Default: 5 ms.
    public var linger: Duration = .milliseconds(5)
    /// Largest batch in bytes (`batch.size`). A large batch halves librdkafka's CPU per message.
    /// Default: 1,000,000.
    public var batchSize = 1_000_000
    /// Most messages waiting locally (`queue.buffering.max.messages`); sending more fails with
    /// ``KafkaError/Code/queueFull`` until deliveries catch up. Default: 500,000.
    public var maxQueuedMessages = 500_000
    /// `compression.codec` (`none`, `gzip`, `snappy`, `lz4`, `zstd`). Default: `lz4`.
    public var compression = "lz4"

    public init(client: KafkaClientConfiguration) {
        self.client = client
    }

    func rdKafkaProperties() -> [(key: String, value: String)] {
        var out: [(key: String, value: String)] = [
            // Idempotence implies acks=all, bounded in-flight requests and no reordering or
            // duplicates from librdkafka's own retries.
            ("enable.idempotence", "true"),
            // Every message's report finishes its record (and releases its context).
            ("delivery.report.only.error", "false"),
            ("message.timeout.ms", String(max(1, messageTimeout.milliseconds))),
            ("linger.ms", String(max(0, linger.milliseconds))),
            ("batch.size", String(batchSize)),
            ("queue.buffering.max.messages", String(maxQueuedMessages)),
            ("compression.codec", compression),
        ]
        // Passthrough properties of the client go last so they can override the above.
        let clientProperties = client.rdKafkaProperties().filter {
            !KafkaClientConfiguration.consumerOnlyProperties.contains($0.key) && !KafkaClientConfiguration.managedProperties.contains($0.key)
        }
        let passthrough = Set(client.properties.keys)
        out.insert(contentsOf: clientProperties.filter { !passthrough.contains($0.key) }, at: 0)
        out.append(contentsOf: clientProperties.filter { passthrough.contains($0.key) })
        return out
    }
}

/// Settings of a group consumer.
public struct KafkaConsumerConfiguration: Sendable {
    public var client: KafkaClientConfiguration
    /// `group.id`. Default: none (required).
    public var groupID: String
    /// Topics to subscribe to. Default: none (required).
    public var topics: [String]
    /// Where a partition without a committed offset starts (`auto.offset.reset`).
    /// Default: `earliest`, so no job published before the group existed is skipped.
    public var autoOffsetReset = "earliest"
    /// `session.timeout.ms`. Default: 45 seconds (Kafka's own default).
    public var sessionTimeout: Duration = .seconds(45)
    /// How often stored offsets are committed (`auto.commit.interval.ms`). Default: 5 seconds.
    public var commitInterval: Duration = .seconds(5)
    /// Most records in one batch handed to the caller. Default: 1,000.
    public var maxBatchSize = 1_000
    /// Most records buffered between librdkafka and the caller; when full the poll thread waits,
    /// then pauses fetching (it keeps serving rebalances). Default: 10,000.
    public var bufferCapacity = 10_000
    /// Most bytes (values and keys) buffered between librdkafka and the caller, as
    /// ``bufferCapacity`` bounds records: fan-out jobs of hundreds of kilobytes would otherwise
    /// buffer gigabytes. A batch stops growing at a quarter of it. Default: 32 MiB.
    public var bufferCapacityBytes = 32 << 20
    /// How long a revocation waits for in-flight records of the revoked partitions to finish
    /// before storing offsets and giving them up. Default: 10 seconds.
    public var drainTimeout: Duration = .seconds(10)
    /// How long one `rd_kafka_consumer_poll` call waits; bounds the latency of pause, resume and
    /// shutdown requests. Default: 100 ms.
    public var pollTimeout: Duration = .milliseconds(100)
    /// A worker that holds records this long without asking for more or finishing any is reported
    /// as stalled (librdkafka 2.0.2 cannot detect it, see docs/kafka.md). Default: 60 seconds.
    public var stallWarning: Duration = .seconds(60)

    public init(client: KafkaClientConfiguration, groupID: String, topics: [String]) {
        self.client = client
        self.groupID = groupID
        self.topics = topics
    }

    func rdKafkaProperties() -> [(key: String, value: String)] {
        let ours: [(key: String, value: String)] = [
            ("group.id", groupID),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("enable.auto.offset.store", "false"),
            ("enable.auto.commit", "true"),
            ("auto.commit.interval.ms", String(max(1, commitInterval.milliseconds))),
            ("auto.offset.reset", autoOffsetReset),
            ("session.timeout.ms", String(max(1, sessionTimeout.milliseconds))),
            ("enable.partition.eof", "false"),
            // Bound prefetching: librdkafka stops fetching while the consumer's local queue holds
            // 16 MiB (its default is 64 MiB). One queue for all assigned partitions.
            ("queued.max.messages.kbytes", "16384"),
        ]
        let clientProperties = client.rdKafkaProperties().filter {
            !KafkaClientConfiguration.producerOnlyProperties.contains($0.key) && !KafkaClientConfiguration.managedProperties.contains($0.key)
        }
        let passthrough = Set(client.properties.keys)
        return clientProperties.filter { !passthrough.contains($0.key) } + ours
            + clientProperties.filter { passthrough.contains($0.key) }
    }
}

extension Duration {
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
