@testable import KafkaTransport
import FleetLoad
import Prometheus
import Testing

@Suite("Kafka client properties")
struct KafkaConfigurationTests {
    @Test("passthrough properties cannot undo what at-least-once rests on")
    func managedPropertiesStay() {
        var client = KafkaClientConfiguration(bootstrapServers: ["127.0.0.1:9092"])
        client.properties = [
            "enable.auto.offset.store": "true", "enable.auto.commit": "false", "enable.idempotence": "false", "group.id": "other", "linger.ms": "20",
            "delivery.report.only.error": "true", "offset.store.method": "file",
        ]
        // Applied in order: the last value of a name is the one librdkafka keeps.
        let producer = Dictionary(KafkaProducerConfiguration(client: client).rdKafkaProperties().map { ($0.key, $0.value) }, uniquingKeysWith: { $1 })
        let consumer = Dictionary(KafkaConsumerConfiguration(client: client, groupID: "g", topics: ["t"]).rdKafkaProperties().map { ($0.key, $0.value) }, uniquingKeysWith: { $1 })
        #expect(producer["enable.idempotence"] == "true" && producer["linger.ms"] == "20")
        #expect(producer["delivery.report.only.error"] == "false", "every message's report finishes its record")
        #expect(consumer["enable.auto.offset.store"] == "false" && consumer["enable.auto.commit"] == "true" && consumer["group.id"] == "g")
        #expect(consumer["offset.store.method"] == nil, "librdkafka's own default, broker, is the only one that commits at a rebalance")
    }

    @Test("one kafka.properties list serves both clients: each takes only what it understands")
    func splitPassthrough() {
        var client = KafkaClientConfiguration(bootstrapServers: ["127.0.0.1:9092"])
        client.properties = ["session.timeout.ms": "6000", "linger.ms": "20", "socket.keepalive.enable": "true"]
        let producer = Dictionary(KafkaProducerConfiguration(client: client).rdKafkaProperties().map { ($0.key, $0.value) }, uniquingKeysWith: { $1 })
        let consumer = Dictionary(KafkaConsumerConfiguration(client: client, groupID: "g", topics: ["t"]).rdKafkaProperties().map { ($0.key, $0.value) }, uniquingKeysWith: { $1 })
        #expect(producer["session.timeout.ms"] == nil)
        #expect(producer["linger.ms"] == "20", "a passthrough wins over the producer's own default")
        #expect(consumer["linger.ms"] == nil)
        #expect(consumer["session.timeout.ms"] == "6000")
        #expect(producer["socket.keepalive.enable"] == "true" && consumer["socket.keepalive.enable"] == "true")
    }

    @Test("librdkafka's configuration dump (debug=conf) hides secret-looking values it does not hide itself")
    func configurationDumpRedacted() {
        #expect(ClientContext.redactingConfigurationLine("  sasl.oauthbearer.client.secret = s3cr3t-value") == "  sasl.oauthbearer.client.secret = [redacted]")
        #expect(ClientContext.redactingConfigurationLine("  sasl.password = [redacted]") == "  sasl.password = [redacted]")
        #expect(ClientContext.redactingConfigurationLine("  linger.ms = 5") == "  linger.ms = 5")
        #expect(ClientContext.redactingConfigurationLine("Client configuration:") == "Client configuration:")
    }
}

@Suite("librdkafka statistics as metrics")
struct StatisticsMetricsTests {
    @Test("a broker that leaves the client's statistics loses its round-trip gauge instead of reporting its last figure for good")
    func departedBrokerGaugeRemoved() {
        let registry = PrometheusCollectorRegistry()
        let context = ClientContext(logger: testLogger, clientID: "stats", role: "producer", metrics: PrometheusMetricsFactory(registry: registry))
        func rtts() -> [String: Double] {
            let samples = prometheusSamples(String(decoding: registry.emitToBuffer(), as: UTF8.self)).filter { $0.name == "kafka_broker_rtt_us" }
            return Dictionary(samples.map { ($0.labels["broker"] ?? "?", $0.value) }, uniquingKeysWith: { first, _ in first })
        }
        func statistics(_ brokers: String) -> [UInt8] {
            Array(#"{"type":"producer","msg_cnt":0,"brokers":{\#(brokers)}}"#.utf8)
        }
        context.statistics(statistics(#""a:9092/1":{"rtt":{"avg":1500}},"b:9092/2":{"rtt":{"avg":2500}}"#))
        #expect(rtts() == ["a:9092/1": 1500, "b:9092/2": 2500])
        // Broker 2 idle for a window: still a member, its gauge stays.
        context.statistics(statistics(#""a:9092/1":{"rtt":{"avg":1700}},"b:9092/2":{"rtt":{"avg":0}}"#))
        #expect(rtts() == ["a:9092/1": 1700, "b:9092/2": 2500])
        // Broker 2 removed from the cluster.
        context.statistics(statistics(#""a:9092/1":{"rtt":{"avg":1800}}"#))
        #expect(rtts() == ["a:9092/1": 1800])
    }
}
