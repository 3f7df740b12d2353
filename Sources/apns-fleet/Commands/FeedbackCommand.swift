import APNsCore
import APNsFleetConfig
import APNsLegacyClient
import ArgumentParser
import FleetWorker
import Foundation
import KafkaTransport
import Logging
import Prometheus

/// `apns-fleet feedback`: the feedback worker. Dead tokens from results and from the legacy
/// feedback service become token events.
struct FeedbackCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feedback",
        abstract: "Run the feedback worker: dead tokens → apns.token-events.",
        discussion: """
            Consumes apns.results in its own group (kafka.feedback-group-id) and publishes one \
            token event, keyed <topic>/<token>, per invalidation: 410 Unregistered, BadDeviceToken \
            and DeviceTokenNotForTopic. Duplicate results do not repeat an event. Every app with \
            app.<name>.legacy-feedback set is also polled every feedback.poll-interval-seconds \
            (certificate auth). Same configuration, admin endpoint and SIGTERM drain as the worker; \
            give it its own admin.port when both run on one host.

            Example:
              apns-fleet feedback --config fleet.yaml --set admin.port=9465
            """
    )

    @OptionGroup var options: FleetProcessOptions

    func run() async throws {
        let process = try await FleetProcess(label: "apns-fleet.feedback", options: options, idPrefix: "feedback")
        let fleet = process.fleet
        let logger = process.logger
        let kafka = try KafkaClientConfiguration.checked(fleet.kafka, clientID: process.processID)
        var consumerConfiguration = KafkaConsumerConfiguration(client: kafka, groupID: fleet.kafka.feedbackGroupID, topics: [fleet.topics.results])
        consumerConfiguration.drainTimeout = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000))
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: logger)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: kafka), logger: logger)
        let services = try Self.feedbackServices(fleet, logger: logger)
        let worker = FeedbackWorker(
            configuration: .init(
                topics: fleet.topics,
                pollInterval: .milliseconds(Int64(fleet.feedback.pollIntervalSeconds * 1000)),
                // A stop waits for a poll in progress; within the drain timeout it is finished and
                // published before the process is cancelled (tuples are gone once read). A
                // service still sending at the poll's deadline is read on to twice it.
                pollTimeout: max(.seconds(5), min(.seconds(30), .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 500)))),
                ledgerCapacity: fleet.feedback.ledgerCapacity
            ),
            consumer: consumer, producer: producer, feedbackServices: services, logger: logger,
            stopRequested: { [shuttingDown = process.shuttingDown] in shuttingDown.isSet }
        )
        let registry = process.registry
        let admin = AdminServer(
            host: fleet.admin.host, port: fleet.admin.port, logger: logger,
            metrics: { registry.emitToBuffer() },
            readiness: { worker.readiness(assignedPartitions: consumer.assignment.count) },
            pipeline: PipelineWatch(consumer: consumer, producer: producer, publishStalls: worker.publishStalls, unhealthyAfter: fleet.admin.unhealthyAfterStall)
        )
        logger.info("feedback worker starting", metadata: [
            "worker.id": "\(process.processID)", "kafka.group": "\(fleet.kafka.feedbackGroupID)",
            "feedback.services": "\(services.map(\.app).joined(separator: ","))",
        ])
        // Stopped in reverse order; the admin server last, as the worker's.
        await process.run([admin, producer, worker, consumer]) {
            let atRisk = worker.eventsAtRisk
            return atRisk > 0 ? "up to \(atRisk) token events read from a legacy feedback service, which forgets what it hands out, were not acknowledged by Kafka (and any tuples the poll had read beyond them)" : nil
        }
        let lost = worker.eventsLost
        process.exitStopped(
            lost > 0 ? "feedback worker stopped" : "feedback worker stopped: events flushed", unfinished: consumer.recordsLeftUnfinished, commitFailure: consumer.lastCommitFailure,
            lost: lost > 0 ? "\(lost) token events read from a legacy feedback service, which forgets what it hands out, were never published (see the error above)" : nil
        )
    }

    /// A feedback service per app that configures one.
    static func feedbackServices(_ fleet: FleetConfiguration, logger: Logger) throws -> [FeedbackWorker.FeedbackService] {
        try fleet.apps.compactMap { app -> FeedbackWorker.FeedbackService? in
            guard let endpoint = app.legacyFeedback else { return nil }
            var certificate: AppConfiguration.CertificateSource?
            if case .certificate(let source) = app.authentication { certificate = source }
            // Over TLS the legacy service knows only certificate auth; a plain port (local tests) needs none.
            if endpoint.tls, certificate == nil {
                throw ConfigurationError(key: "app.\(app.name).legacy-feedback", "the legacy feedback service over TLS needs certificate auth (app.\(app.name).auth=certificate)")
            }
            guard let topic = app.defaults.topic ?? app.topics.first else {
                throw ConfigurationError(key: "app.\(app.name).topic", "is required to key the feedback service's token events")
            }
            let client = LegacyFeedbackClient(endpoint: endpoint, certificate: certificate, logger: logger)
            try client.checkCredentials()
            return FeedbackWorker.FeedbackService(app: app.name, topic: topic) { timeout, deliver in
                try await client.fetch(timeout: timeout, deliver: deliver)
            }
        }
    }
}
