import APNsClient
import APNsCore
import APNsFleetConfig
import ArgumentParser
import FleetWorker
import Foundation
import KafkaTransport
import Logging
import Prometheus

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
            is in flight, flushes results, stores offsets and leaves the group. A second SIGTERM \
            or SIGINT exits at once (status 143 or 130); unfinished jobs are redone by the group.

            Example:
              apns-fleet worker --config fleet.yaml --set kafka.bootstrap-servers=kafka-1:9092
            """
    )

    @OptionGroup var options: FleetProcessOptions

    func run() async throws {
        let process = try await FleetProcess(label: "apns-fleet.worker", options: options, idPrefix: "worker")
        let fleet = process.fleet
        let logger = process.logger
        guard !fleet.apps.isEmpty else {
            throw ConfigurationError(key: "apps", "no app is configured; a worker needs at least one credential set")
        }
        let workerID = process.processID
        // Credentials first: a key file that cannot be read is the error to show, not Kafka
        // connection chatter before it. HTTP/2 pools for most apps; the legacy binary gateway
        // for apps with `protocol: binary`.
        let clients = try APNsClients(apps: fleet.apps, logger: logger)
        let requestTimeout = Duration.milliseconds(Int64(fleet.worker.requestTimeoutSeconds * 1000))
        let legacy = try LegacyBinarySender(apps: fleet.apps, requestTimeout: requestTimeout, logger: logger)
        let kafka = try KafkaClientConfiguration.checked(fleet.kafka, clientID: workerID)
        var consumerConfiguration = KafkaConsumerConfiguration(client: kafka, groupID: fleet.kafka.groupID, topics: [fleet.topics.jobs, fleet.topics.retry])
        consumerConfiguration.drainTimeout = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000))
        // Revocations reach the worker, built below: retry records waiting for their not-before
        // are handed back instead of holding up the drain (and dropped when partitions are lost).
        let revocations = RevocationForwarder()
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger, onRevoke: revocations.handler, onLoss: revocations.lossHandler)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: kafka), logger: logger)
        let sender = RoutingSender(apps: fleet.apps, binary: legacy, other: APNsClientSender(clients: clients, requestTimeout: requestTimeout))
        // Sized from the pools' streams: APNs usually allows 1000 per connection, and an app on
        // Apple's endpoints has a pool per environment it serves.
        let streams = fleet.apps.reduce(0) { $0 + $1.connections * ($1.transport == .http2 && !$1.endpoint.isCustom ? $1.environments.count : 1) } * 1000
        let maxInFlight = fleet.worker.maxInFlight > 0 ? fleet.worker.maxInFlight : min(streams, 10_000)
        let worker = PushWorker(
            configuration: .init(fleet: fleet, workerID: workerID, maxInFlight: maxInFlight),
            consumer: consumer, producer: producer, sender: sender,
            logger: logger, revocations: revocations
        )
        let registry = process.registry
        let essentialPools = clients.essentialPools(defaultEnvironments: Dictionary(fleet.apps.map { ($0.name, $0.defaults.environment) }, uniquingKeysWith: { first, _ in first }))
        let admin = AdminServer(
            host: fleet.admin.host, port: fleet.admin.port, logger: logger,
            metrics: {
                worker.refreshGauges()
                return registry.emitToBuffer()
            },
            readiness: {
                let unusable = essentialPools.filter { $0.value.statistics.usableConnections == 0 }.map { "\($0.key)" }.sorted()
                    + legacy.appsWithoutConnection.map { "\($0) (legacy gateway)" }
                if consumer.assignment.isEmpty { return .init(ready: false, detail: "no partitions assigned") }
                if !unusable.isEmpty { return .init(ready: false, detail: "no usable APNs connection for \(unusable.joined(separator: ", "))") }
                // Connected is not enough: a wrong key id, team id or key is found only when APNs
                // rejects the tokens, and a rollout must not go on past pods in that state.
                let rejected = essentialPools.compactMap { key, pool in pool.configurationError.map { "\(key): \($0.message)" } }.sorted()
                if !rejected.isEmpty { return .init(ready: false, detail: rejected.joined(separator: "; ")) }
                if let problem = worker.publishStalls.problem() { return .init(ready: false, detail: problem) }
                return .init(ready: true, detail: "\(consumer.assignment.count) partitions, \(clients.pools.count) APNs pools")
            },
            pipeline: PipelineWatch(consumer: consumer, producer: producer, publishStalls: worker.publishStalls, unhealthyAfter: fleet.admin.unhealthyAfterStall)
        )
        logger.info("worker starting", metadata: [
            "worker.id": "\(workerID)", "kafka.group": "\(fleet.kafka.groupID)",
            "apps": "\(fleet.apps.map(\.name).joined(separator: ","))", "worker.max-in-flight": "\(maxInFlight)",
            // Which environments each app's jobs can use (app.<name>.environments).
            "apns.pools": "\(clients.pools.keys.map(\.description).sorted().joined(separator: ","))",
            "malloc": "\(MemoryAllocator.description)",
        ])
        // Shutdown runs in reverse order: the consumer stops first (ending the worker's input),
        // the worker finishes in-flight work, then the APNs connections close and the producer
        // flushes. The admin server stops last, so probes and a last scrape see the drain.
        await process.run([admin, producer, clients, legacy, worker, consumer])
        process.exitStopped("worker stopped: results flushed", unfinished: consumer.recordsLeftUnfinished, commitFailure: consumer.lastCommitFailure)
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}
