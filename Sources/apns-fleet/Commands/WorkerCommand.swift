import APNsClient
import APNsCore
import APNsFleetConfig
import ArgumentParser
import FleetWorker
import Foundation
import KafkaTransport
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import UnixSignals

/// `apns-fleet worker`: the push worker. Consumes jobs, sends them to APNs, publishes one result
/// per notification, and stores offsets only behind acknowledged results.
struct WorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "worker",
        abstract: "Run a push worker: Kafka jobs → APNs → one result per notification.",
        discussion: """
            Reads its configuration from --config, APNS_FLEET_* environment variables and --set \
            key=value flags (see docs/configuration.md). Serves /metrics, /healthz and /readyz on \
            admin.host:admin.port. SIGTERM or SIGINT drains: it stops taking jobs, finishes what \
            is in flight, flushes results, stores offsets and leaves the group.

            Example:
              apns-fleet worker --config fleet.yaml --set kafka.bootstrap-servers=kafka-1:9092
            """
    )

    @Option(help: "Configuration file (YAML or JSON).")
    var config: String?

    @Option(name: .customLong("set"), help: ArgumentHelp("Override a configuration key.", valueName: "key=value"))
    var overrides: [String] = []

    @Option(help: "Log level: trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    func run() async throws {
        let fleet = try await ConfigurationLoader(filePath: config, environment: ProcessInfo.processInfo.environment, overrides: overrides).load()
        guard !fleet.apps.isEmpty else {
            throw ConfigurationError(key: "apps", "no app is configured; a worker needs at least one credential set")
        }
        var logger = Logger(label: "apns-fleet.worker")
        logger.logLevel = logLevel
        for warning in SecretFile.permissionWarnings(for: fleet) { logger.warning("\(warning)") }

        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))

        let workerID = fleet.worker.id ?? "worker-\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
        let kafka = KafkaClientConfiguration(settings: fleet.kafka, clientID: workerID)
        var consumerConfiguration = KafkaConsumerConfiguration(client: kafka, groupID: fleet.kafka.groupID, topics: [fleet.topics.jobs, fleet.topics.retry])
        consumerConfiguration.drainTimeout = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000))
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: kafka), logger: logger)
        let environments = Set(fleet.apps.map(\.defaults.environment))
        let clients = try APNsClients(apps: fleet.apps, environments: environments, logger: logger)
        // Sized from the pools' streams: APNs usually allows 1000 per connection.
        let streams = fleet.apps.reduce(0) { $0 + $1.connections } * 1000
        let maxInFlight = fleet.worker.maxInFlight > 0 ? fleet.worker.maxInFlight : min(streams, 10_000)
        let worker = PushWorker(
            configuration: .init(fleet: fleet, workerID: workerID, maxInFlight: maxInFlight),
            consumer: consumer, producer: producer,
            sender: APNsClientSender(clients: clients, requestTimeout: .milliseconds(Int64(fleet.worker.requestTimeoutSeconds * 1000))),
            logger: logger
        )
        let admin = AdminServer(
            host: fleet.admin.host, port: fleet.admin.port, logger: logger,
            metrics: { registry.emitToBuffer() },
            readiness: {
                let unusable = clients.pools.filter { $0.value.statistics.usableConnections == 0 }.map { "\($0.key)" }.sorted()
                if consumer.assignment.isEmpty { return .init(ready: false, detail: "no partitions assigned") }
                if !unusable.isEmpty { return .init(ready: false, detail: "no usable APNs connection for \(unusable.joined(separator: ", "))") }
                return .init(ready: true, detail: "\(consumer.assignment.count) partitions, \(clients.pools.count) APNs pools")
            }
        )
        logger.info("worker starting", metadata: [
            "worker.id": "\(workerID)", "kafka.group": "\(fleet.kafka.groupID)",
            "apps": "\(fleet.apps.map(\.name).joined(separator: ","))", "worker.max-in-flight": "\(maxInFlight)",
        ])
        // Shutdown runs in reverse order: the consumer stops first (ending the worker's input),
        // the worker finishes in-flight work, then the APNs pools close and the producer flushes.
        var groupConfiguration = ServiceGroupConfiguration(
            services: [
                .init(service: producer), .init(service: clients), .init(service: admin),
                .init(service: worker), .init(service: consumer),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            cancellationSignals: [],
            logger: logger
        )
        // A drain that outlives the grace period becomes cancellation; cancellation is bounded too.
        groupConfiguration.maximumGracefulShutdownDuration = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000)) + .seconds(15)
        groupConfiguration.maximumCancellationDuration = .seconds(5)
        let group = ServiceGroup(configuration: groupConfiguration)
        try await group.run()
        logger.info("worker stopped: results flushed, offsets stored, group left")
        // Everything that matters is done. Exit now rather than wait for librdkafka's handles to
        // be torn down: with both clients closed, rd_kafka_destroy has been seen to stall here
        // (see the session notes), and a stopping pod must not hang.
        Foundation.exit(0)
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}
