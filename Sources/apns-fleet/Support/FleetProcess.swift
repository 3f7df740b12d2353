import APNsCore
import APNsFleetConfig
import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import UnixSignals

/// What the long-running fleet processes (`worker`, `feedback`) share: configuration, logging,
/// metrics and a service group that drains on the first SIGTERM or SIGINT and exits at once on
/// the second.
struct FleetProcess {
    let fleet: FleetConfiguration
    let logger: Logger
    let registry: PrometheusCollectorRegistry
    /// `worker.id`, or one made from the host name and pid.
    let processID: String

    init(label: String, configFile: String?, overrides: [String], logLevel: Logger.Level, idPrefix: String) async throws {
        fleet = try await ConfigurationLoader(filePath: configFile, environment: ProcessInfo.processInfo.environment, overrides: overrides).load()
        var logger = Logger(label: label)
        logger.logLevel = logLevel
        for warning in SecretFile.permissionWarnings(for: fleet) { logger.warning("\(warning)") }
        self.logger = logger
        registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        processID = fleet.worker.id ?? "\(idPrefix)-\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
    }

    /// Runs `services` until a signal; shutdown runs them down in reverse order. The drain is
    /// bounded by `worker.drain-timeout-seconds` plus a margin, then cancellation takes over.
    func run(_ services: [any Service]) async throws {
        var configuration = ServiceGroupConfiguration(
            services: services.map { .init(service: $0) },
            gracefulShutdownSignals: [.sigterm, .sigint],
            cancellationSignals: [],
            logger: logger
        )
        configuration.maximumGracefulShutdownDuration = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000)) + .seconds(15)
        configuration.maximumCancellationDuration = .seconds(5)
        let group = ServiceGroup(configuration: configuration)
        let logger = self.logger
        // The first signal drains (the service group handles it); a second one means "now".
        let impatience = Task {
            var seen = 0
            for await signal in await UnixSignalsSequence(trapping: .sigterm, .sigint) {
                seen += 1
                if seen >= 2 {
                    logger.warning("second \(signal) while draining: exiting now, without waiting for in-flight work")
                    Foundation.exit(130)
                }
            }
        }
        defer { impatience.cancel() }
        try await group.run()
    }
}
