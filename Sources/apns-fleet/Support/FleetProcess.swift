import APNsCore
import APNsFleetConfig
import ArgumentParser
import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import Synchronization
import UnixSignals

/// The options every long-running fleet process takes.
struct FleetProcessOptions: ParsableArguments {
    @Option(help: "Configuration file (YAML or JSON).")
    var config: String?

    @Option(name: .customLong("set"), help: ArgumentHelp("Override a configuration key. Not for secrets: arguments are visible to every process on the host.", valueName: "key=value"))
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
    /// Set by the first SIGTERM or SIGINT: services that start new work on their own (the
    /// feedback worker's polls) stop doing so at once, before their turn in the shutdown order.
    let shuttingDown = ShutdownFlag()
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
    /// A service's error ends the process here, with that error's exit status. `atRisk` says
    /// what an exit before the stop finishes (overdue, or a second signal) loses for good,
    /// nil when nothing (the group redoes unfinished records).
    func run(_ services: [any Service], atRisk: @escaping @Sendable () -> String? = { nil }) async {
        let shuttingDown = self.shuttingDown
        let logger = self.logger
        var configuration = ServiceGroupConfiguration(
            services: services.map { .init(service: ExitOnFailure(base: $0, shuttingDown: shuttingDown, logger: logger, atRisk: atRisk)) },
            // Signals are handled below: the first drains, the second exits.
            gracefulShutdownSignals: [],
            cancellationSignals: [],
            logger: logger
        )
        let gracefulBudget = Duration.milliseconds(Int64(fleet.worker.drainTimeoutSeconds * 1000)) + .seconds(15)
        configuration.maximumGracefulShutdownDuration = gracefulBudget
        configuration.maximumCancellationDuration = .seconds(5)
        let group = ServiceGroup(configuration: configuration)
        // One handler for both signals, installed before the group runs so none is missed.
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        await withTaskGroup(of: Void.self) { tasks in
            tasks.addTask {
                for await signal in signals {
                    if !shuttingDown.isSet {
                        shuttingDown.set()
                        logger.info("\(signal): draining; send it again to exit at once")
                        await group.triggerGracefulShutdown()
                        // Past both budgets ServiceLifecycle stops the process with fatalError
                        // (a crash, exit 132): a stop that cannot finish (Kafka unreachable, so
                        // nothing flushes) ends here first, with a line that says so.
                        // Unstructured: the process ends (exitStopped) right after the group.
                        Task {
                            try? await Task.sleep(for: gracefulBudget + .seconds(3))
                            Self.exitOverdue(budget: gracefulBudget, lost: atRisk(), logger: logger)
                        }
                    } else {
                        Self.exitNow(signal: signal, lost: atRisk(), logger: logger)
                    }
                }
            }
            do {
                try await group.run()
            } catch {
                // Exit here rather than unwind: unwinding tears down librdkafka's handles, which
                // has been seen to stall, and the signals that could end a stall are ignored by
                // now (the handler above owns them).
                Self.exit(after: error, "stopping: \(error)", lost: atRisk(), logger: logger)
            }
            tasks.cancelAll()
        }
    }

    /// The last line of a stop, then exit 0 (or 1, see `lost`). `stopped` says what was flushed;
    /// `unfinished` is how many records the drain gave up on (the group redoes them). Exits now rather than
    /// wait for librdkafka's handles to be torn down: with both clients closed, rd_kafka_destroy
    /// has been seen to stall here, and a stopping pod must not hang.
    ///
    /// `lost` names what the stop lost for good (nothing redoes it): then the line is an error
    /// and the status 1. `commitFailure` is why the consumer's last offset commit failed, if it
    /// did: the group then redoes what finished since the last successful one (duplicates, so a
    /// warning and still status 0).
    func exitStopped(_ stopped: String, unfinished: Int, commitFailure: String?, lost: String? = nil) -> Never {
        if let lost {
            logger.error("\(stopped), group left; lost: \(lost)", metadata: ["kafka.unfinished": "\(unfinished)"])
            fflush(nil)
            _exit(1)
        }
        if unfinished > 0 {
            logger.warning("\(stopped), group left; the drain ran out of time, so the group redoes the unfinished records", metadata: ["kafka.unfinished": "\(unfinished)"])
        } else if let commitFailure {
            logger.warning("\(stopped), group left; the last offset commit failed, so the group redoes what finished since the last successful one", metadata: ["kafka.error": "\(commitFailure)"])
        } else {
            logger.info("\(stopped), offsets stored, group left")
        }
        // `_exit`, as on every other path: `exit` runs atexit handlers (OpenSSL's cleanup among
        // them) while librdkafka's threads, whose handles are never destroyed, still run.
        fflush(nil)
        _exit(0)
    }

    /// Ends the process on `error`: logged as `message`, written to standard error, with the
    /// error's exit status (2 for a setting to fix, 1 otherwise). `lost` names what the exit
    /// loses for good, as a stop's last line would.
    static func exit(after error: any Error, _ message: String, lost: String? = nil, logger: Logger) -> Never {
        logger.critical("\(message)")
        if let lost { logger.error("lost: \(lost)") }
        FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
        fflush(nil)
        _exit(exitStatus(of: error) ?? 1)
    }

    /// A stop that outlasted its budget (results that cannot be flushed, a client that does not
    /// close): exit 1 now, before ServiceLifecycle's cancellation limit would crash the process.
    /// Offsets stop at the unfinished work, so the group redoes it.
    static func exitOverdue(budget: Duration, lost: String?, logger: Logger) -> Never {
        logger.error("the stop did not finish within worker.drain-timeout-seconds + 15 s (\(budget)) and its cancellation; exiting with status 1; unfinished jobs will be redelivered")
        if let lost { logger.error("lost: \(lost)") }
        fflush(nil)
        _exit(1)
    }

    /// The second signal: the operator wants the process gone, drain or not. Offsets stop at the
    /// unfinished work, so the group redoes it (duplicates, never losses). `_exit` skips atexit
    /// handlers and librdkafka's teardown, either of which could stall.
    static func exitNow(signal: UnixSignal, lost: String?, logger: Logger) -> Never {
        let status: Int32 = signal == .sigint ? 130 : 143
        logger.warning("second \(signal) while draining: exiting now with status \(status); unfinished jobs will be redelivered")
        if let lost { logger.error("lost: \(lost)") }
        fflush(nil)  // every stream, so the line above is not lost
        _exit(status)
    }
}

/// Set once the first signal asked for a drain.
final class ShutdownFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .relaxed) }
    var isSet: Bool { value.load(ordering: .relaxed) }
}

/// Ends the process when its service fails, or ends by itself, outside a shutdown (the admin
/// port taken, a fatal Kafka error). ServiceLifecycle would cancel the group and wait for every other service, and
/// one blocked on Kafka or a connection kept that wait, and the process, going for good. Work in
/// flight is redone by the group from the stored offsets (duplicates, never losses).
struct ExitOnFailure: Service {
    let base: any Service
    let shuttingDown: ShutdownFlag
    let logger: Logger
    /// What exiting now would lose for good (see `FleetProcess.run`).
    let atRisk: @Sendable () -> String?

    func run() async throws {
        do {
            try await base.run()
        } catch {
            if error is CancellationError { throw error }
            if shuttingDown.isSet {
                // ServiceLifecycle logs an error during shutdown only at debug level.
                logger.error("\(type(of: base)) failed while stopping: \(error)")
                throw error
            }
            FleetProcess.exit(after: error, "\(type(of: base)) failed; exiting: \(error)", lost: atRisk(), logger: logger)
        }
        // Every service runs until asked to stop; one that ends by itself has stopped working
        // (ServiceLifecycle would then cancel the group and name only this wrapper).
        if !shuttingDown.isSet, !Task.isCancelled {
            FleetProcess.exit(after: ServiceEndedEarly(service: "\(type(of: base))"), "\(type(of: base)) ended on its own; exiting", lost: atRisk(), logger: logger)
        }
    }
}

struct ServiceEndedEarly: Error, CustomStringConvertible {
    var service: String
    var description: String { "\(service) ended before the process was asked to stop" }
}
