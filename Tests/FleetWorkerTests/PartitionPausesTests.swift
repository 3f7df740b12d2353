import FleetLoad
import FleetTestSupport
import KafkaTransport
import Logging
import Prometheus
import Testing

@testable import FleetWorker

@Suite("Back-pressure pauses across a rebalance", .timeLimit(.minutes(2)))
struct PartitionPausesTests {
    @Test("the paused-partitions gauge follows the assignment a rebalance changed while paused, not the one at the pause")
    func gaugeFollowsRebalance() async throws {
        var logger = Logger(label: "partition-pauses-tests")
        logger.logLevel = .error
        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        try cluster.createTopic("paused", partitions: 4)
        func configuration(_ id: String) -> KafkaConsumerConfiguration {
            var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
            client.clientID = id
            client.statisticsInterval = nil
            var configuration = KafkaConsumerConfiguration(client: client, groupID: "paused-group", topics: ["paused"])
            // The mock cluster's rebalances take about session.timeout.ms - 1 s.
            configuration.sessionTimeout = .milliseconds(6000)
            configuration.client.properties["heartbeat.interval.ms"] = "500"
            configuration.pollTimeout = .milliseconds(50)
            return configuration
        }
        let first = try KafkaConsumer(configuration: configuration("first"), logger: logger)
        let second = try KafkaConsumer(configuration: configuration("second"), logger: logger)
        let registry = PrometheusCollectorRegistry()
        let pauses = PartitionPauses(consumer: first, logger: logger, metrics: PrometheusMetricsFactory(registry: registry))
        @Sendable func backPressurePaused() -> Double? {
            prometheusSamples(String(decoding: registry.emitToBuffer(), as: UTF8.self))
                .first { $0.name == "apns_worker_partitions_paused" && $0.labels["reason"] == "back_pressure" }?.value
        }
        try await withTimeout(90, "the rebalance") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await first.run() }
                try await waitUntil("the first consumer's assignment") { first.assignment.count == 4 }
                pauses.backPressure(.pause, inUse: 10)
                #expect(backPressurePaused() == 4)

                group.addTask { try await second.run() }
                try await waitUntil("the rebalance") { first.assignment.count == 2 && second.assignment.count == 2 }
                pauses.refreshGauges()
                #expect(backPressurePaused() == 2, "the partitions the worker still has, all paused")

                pauses.backPressure(.resume, inUse: 0)
                pauses.refreshGauges()
                #expect(backPressurePaused() == 0)
                first.close()
                second.close()
                try await group.waitForAll()
            }
        }
    }
}
