import APNsCore
import APNsFleetConfig
import ArgumentParser
import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import UnixSignals

/// The options every long-running fleet process takes.
struct FleetProcessOptions: ParsableArguments {
    @Option(help: "Configuration file (YAML or JSON).")
    var config: String?

    @Option(name: .customLong("set"), help: ArgumentHelp("Override a configuration key.", valueName: "key=value"))
    var overrides: [String] = []

    @Option(help: "Log level: trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info
}

/// What the long-running fleet processes (`worker`, `feedback`) share: configuration, logging,
/// metrics and a service group that drains on the first SIGTERM or SIGINT and exits at once on
/// the second.
struct FleetProcess {
    let fleet: FleetConfiguration
    let logger: Logger
    let registry: PrometheusCollectorRegistry
    /// `worker.id`, or one made from the host name and pid.
    let processID: String

    init(label: String, options: FleetProcessOptions, idPrefix: String) async throws {
        let loader = ConfigurationLoader(filePath: options.config, environment: ProcessInfo.processInfo.environment, overrides: options.overrides)
        fleet = try await loader.load()
        var logger = Logger(label: label)
        logger.logLevel = options.logLevel
        for warning in SecurityWarnings.all(for: fleet) { logger.warning("\(warning)") }
        for name in loader.unknownEnvironmentVariables(for: fleet) {
            logger.warning("environment variable \(name) sets no configuration key; ignored (a typo? see docs/configuration.md)")
        }
        self.logger = logger
        registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        // The latency the worker adds is a matter of milliseconds, below the default buckets
        // (5 ms and up).
        factory.durationHistogramBuckets["apns.worker.added_latency"] = [
            .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
            .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
            .milliseconds(500), .seconds(1), .seconds(5),
        ]
        MetricsSystem.bootstrap(factory)
        processID = fleet.worker.id ?? "\(idPrefix)-\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
    }

    /// Runs `services` until a signal; shutdown runs them down in reverse order. The drain is
    /// bounded by `worker.drain-timeout-seconds` plus a margin, then cancellation takes over.
    func run(_ services: [any Service]) async throws {
        var configuration = ServiceGroupConfiguration(
            services: services.map { .init(service: $0) },
            // Signals are handled below: the first drains, the second exits.
            gracefulShutdownSignals: [],
            cancellationSignals: [],
            logger: logger
        )
        configuration.maximumGracefulShutdownDuration = .milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000)) + .seconds(15)
        configuration.maximumCancellationDuration = .seconds(5)
        let group = ServiceGroup(configuration: configuration)
        // One handler for both signals, installed before the group runs so none is missed.
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let logger = self.logger
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask {
                var drainRequested = false
                for await signal in signals {
                    if !drainRequested {
                        drainRequested = true
                        logger.info("\(signal): draining; send it again to exit at once")
                        await group.triggerGracefulShutdown()
                    } else {
                        Self.exitNow(signal: signal, logger: logger)
                    }
                }
            }
            try await group.run()
            tasks.cancelAll()
        }
    }

    /// The second signal: the operator wants the process gone, drain or not. Offsets stop at the
    /// unfinished work, so the group redoes it (duplicates, never losses). `_exit` skips atexit
    /// handlers and librdkafka's teardown, either of which could stall.
    static func exitNow(signal: UnixSignal, logger: Logger) -> Never {
        let status: Int32 = signal == .sigint ? 130 : 143
        logger.warning("second \(signal) while draining: exiting now with status \(status); unfinished jobs will be redelivered")
        fflush(nil)  // every stream, so the line above is not lost
        _exit(status)
    }
}
