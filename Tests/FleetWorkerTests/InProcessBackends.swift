import APNsCore
import APNsSimulator
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

/// What an in-process push-worker test runs against: the APNs simulator over TLS with fresh
/// development credentials, librdkafka's mock cluster with the project's topics, and the app
/// configuration that points at the simulator. The caller stops the simulator and removes
/// `directory`.
struct InProcessBackends: Sendable {
    let directory: String
    let simulator: APNsSimulator
    let cluster: MockKafkaCluster
    let topics = TopicNames()
    let client: KafkaClientConfiguration
    let app: AppConfiguration

    static func start(
        name: String, jobPartitions: Int, otherPartitions: Int, behaviour: (inout APNsSimulatorConfiguration.Behaviour) -> Void = { _ in },
        logger: Logger
    ) async throws -> InProcessBackends {
        let directory = temporaryTestPath("apns-fleet-\(name)")
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        var simulatorConfiguration = try credentials.simulatorConfiguration()
        simulatorConfiguration.listeners.http2TLSPort = 0
        behaviour(&simulatorConfiguration.behaviour)
        let simulator = try await APNsSimulator.start(simulatorConfiguration, logger: logger)
        let port = try #require(simulator.port(.http2TLS))

        let cluster = try MockKafkaCluster(brokers: 1, logger: logger)
        let topics = TopicNames()
        try cluster.createTopic(topics.jobs, partitions: jobPartitions)
        for topic in [topics.retry, topics.deadLetter, topics.results, topics.tokenEvents] {
            try cluster.createTopic(topic, partitions: otherPartitions)
        }
        var client = KafkaClientConfiguration(bootstrapServers: [cluster.bootstrapServers])
        client.statisticsInterval = nil

        func path(_ file: String) -> String { (directory as NSString).appendingPathComponent(file) }
        let app = AppConfiguration(
            name: "example",
            authentication: .token(keyFile: path(summary.signingKeyFile), keyID: summary.keyID, teamID: summary.teamID),
            defaults: JobDefaults(topic: "com.example.app"),
            endpoint: .custom(host: "127.0.0.1", port: port, caFile: path(summary.caFile)),
            connections: 1
        )
        return InProcessBackends(directory: directory, simulator: simulator, cluster: cluster, client: client, app: app)
    }
}
