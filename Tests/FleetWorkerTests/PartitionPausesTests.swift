import APNsCore
import FleetLoad
import FleetTestSupport
import KafkaTransport
import Logging
import Prometheus
import Testing

@testable import FleetWorker

@Suite("Back-pressure pauses across a rebalance", .timeLimit(.minutes(2)))
struct PartitionPausesTests {
    static let logger = {
        var logger = Logger(label: "partition-pauses-tests")
        logger.logLevel = .error
        return logger
    }()

    /// A consumer of `topic` on `cluster`, in `group`, named `id`.
    static func consumer(_ cluster: MockKafkaCluster, group: String, topic: String, id: String = "first") throws -> KafkaConsumer {
        var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
        client.clientID = id
        client.statisticsInterval = nil
        var configuration = KafkaConsumerConfiguration(client: client, groupID: group, topics: [topic])
        // The mock cluster's rebalances take about session.timeout.ms - 1 s.
        configuration.sessionTimeout = .milliseconds(6000)
        configuration.client.properties["heartbeat.interval.ms"] = "500"
        configuration.pollTimeout = .milliseconds(50)
        return try KafkaConsumer(configuration: configuration, logger: logger)
    }

    @Test("the paused-partitions gauge follows the assignment a rebalance changed while paused, not the one at the pause")
    func gaugeFollowsRebalance() async throws {
        let logger = Self.logger
        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        try cluster.createTopic("paused", partitions: 4)
        let first = try Self.consumer(cluster, group: "paused-group", topic: "paused", id: "first")
        let second = try Self.consumer(cluster, group: "paused-group", topic: "paused", id: "second")
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

    @Test("a retry partition is paused only once it holds as many waiting records, or bytes, as it may; it resumes once down to half")
    func retryWaitsPauseAtTheCap() async throws {
        let logger = Self.logger
        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        try cluster.createTopic("retries", partitions: 2)
        let consumer = try Self.consumer(cluster, group: "retry-group", topic: "retries")
        let registry = PrometheusCollectorRegistry()
        let pauses = PartitionPauses(consumer: consumer, logger: logger, metrics: PrometheusMetricsFactory(registry: registry))
        @Sendable func retryWaitPaused() -> Double? {
            prometheusSamples(String(decoding: registry.emitToBuffer(), as: UTF8.self))
                .first { $0.name == "apns_worker_partitions_paused" && $0.labels["reason"] == "retry_wait" }?.value
        }
        let (first, second) = (TopicPartition(topic: "retries", partition: 0), TopicPartition(topic: "retries", partition: 1))
        try await withTimeout(60, "the pauses") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                try await waitUntil("the assignment") { consumer.assignment.count == 2 }
                let cap = PartitionPauses.waitingRecordsPerPartition
                for _ in 1..<cap { pauses.startWaiting(first, bytes: 100) }
                try await Task.sleep(for: .milliseconds(300))
                #expect(consumer.pausedPartitions.isEmpty, "room left: read on")
                pauses.startWaiting(first, bytes: 100)
                try await waitUntil("the full partition to be paused") { consumer.pausedPartitions == [first] }
                #expect(retryWaitPaused() == 1)
                for _ in 0..<(cap / 2 - 1) { pauses.stopWaiting(first, bytes: 100) }
                try await Task.sleep(for: .milliseconds(300))
                #expect(consumer.pausedPartitions == [first], "above half: still paused")
                pauses.stopWaiting(first, bytes: 100)
                try await waitUntil("the partition to resume at half") { consumer.pausedPartitions.isEmpty }
                #expect(retryWaitPaused() == 0)

                // Two large records fill the other partition by their bytes.
                let large = PartitionPauses.waitingBytesPerPartition / 2
                pauses.startWaiting(second, bytes: large)
                pauses.startWaiting(second, bytes: large)
                try await waitUntil("the partition full of bytes to be paused") { consumer.pausedPartitions == [second] }
                pauses.stopWaiting(second, bytes: large)
                try await waitUntil("it to resume") { consumer.pausedPartitions.isEmpty }
                consumer.close()
                try await group.waitForAll()
            }
        }
    }
}
