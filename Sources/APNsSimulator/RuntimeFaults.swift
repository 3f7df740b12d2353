import Synchronization

/// Faults switched on and off while the simulator runs (the admin endpoint's `POST /faults`), on
/// top of the configured ``APNsSimulatorConfiguration/Behaviour``: reliability tests open a fault
/// window (a burst of 500s, answers slower than the client's deadline) and close it again without
/// restarting the simulator, which would change its ports and drop every connection.
public final class RuntimeFaults: Sendable {
    /// Values that replace the configured ones while set; nil leaves the configured value.
    public struct Overrides: Sendable, Hashable, CustomStringConvertible {
        /// Fraction (0…1) of accepted requests answered 500 InternalServerError.
        public var internalServerErrorRate: Double?
        /// Fraction (0…1) of accepted requests answered 503 ServiceUnavailable.
        public var serviceUnavailableRate: Double?
        /// Fraction (0…1) of accepted requests answered 503 Shutdown (the server is going away).
        public var shutdownRate: Double?
        /// Every answer waits this long (jitter as configured).
        public var latency: Duration?
        /// After a rejection, one stream until an accepted request.
        public var dropToOneStreamAfterRejection: Bool?

        public init(
            internalServerErrorRate: Double? = nil, serviceUnavailableRate: Double? = nil, shutdownRate: Double? = nil,
            latency: Duration? = nil, dropToOneStreamAfterRejection: Bool? = nil
        ) {
            self.internalServerErrorRate = internalServerErrorRate
            self.serviceUnavailableRate = serviceUnavailableRate
            self.shutdownRate = shutdownRate
            self.latency = latency
            self.dropToOneStreamAfterRejection = dropToOneStreamAfterRejection
        }

        public var isEmpty: Bool { self == Overrides() }

        public var description: String {
            var parts: [String] = []
            if let internalServerErrorRate { parts.append("error_500_rate=\(internalServerErrorRate)") }
            if let serviceUnavailableRate { parts.append("error_503_rate=\(serviceUnavailableRate)") }
            if let shutdownRate { parts.append("shutdown_503_rate=\(shutdownRate)") }
            if let latency { parts.append("latency_ms=\(latency.components.seconds * 1000 + latency.components.attoseconds / 1_000_000_000_000_000)") }
            if let dropToOneStreamAfterRejection { parts.append("drop_to_one_stream=\(dropToOneStreamAfterRejection)") }
            return parts.isEmpty ? "none" : parts.joined(separator: " ")
        }

        /// Checks the values as ``APNsSimulatorConfiguration/validate()`` checks the configured ones.
        func validate(over behaviour: APNsSimulatorConfiguration.Behaviour) throws(SimulatorConfigurationError) {
            let internalServerError = internalServerErrorRate ?? behaviour.internalServerErrorRate
            let serviceUnavailable = serviceUnavailableRate ?? behaviour.serviceUnavailableRate
            let shutdown = shutdownRate ?? 0
            for rate in [internalServerError, serviceUnavailable, shutdown] where !(rate >= 0 && rate <= 1) {
                throw SimulatorConfigurationError("error rates must be between 0 and 1, got \(rate)")
            }
            guard internalServerError + serviceUnavailable + shutdown <= 1 else {
                throw SimulatorConfigurationError("the 500 and 503 rates add up to more than 1")
            }
            // A day at most, as at start: beyond that a timer (and this description) would not fit.
            if let latency, latency < .zero || latency > APNsSimulatorConfiguration.longestDuration {
                throw SimulatorConfigurationError("latency must be between 0 and a day, got \(latency)")
            }
        }
    }

    /// Checked on every request without taking the lock: false in the usual case of no faults.
    private let active = Atomic<Bool>(false)
    private let overrides = Mutex(Overrides())

    init() {}

    /// The faults in force.
    public var current: Overrides { overrides.withLock { $0 } }

    /// Replaces the faults in force (an empty value clears them).
    func set(_ value: Overrides) {
        overrides.withLock { overrides in
            overrides = value
            active.store(!value.isEmpty, ordering: .releasing)
        }
    }

    /// The behaviour one request gets: the configured one with the faults applied.
    func effective(_ configured: EffectiveBehaviour) -> EffectiveBehaviour {
        var effective = configured
        guard active.load(ordering: .acquiring) else { return effective }
        let faults = overrides.withLock { $0 }
        if let rate = faults.internalServerErrorRate { effective.internalServerErrorRate = rate }
        if let rate = faults.serviceUnavailableRate { effective.serviceUnavailableRate = rate }
        if let rate = faults.shutdownRate { effective.shutdownRate = rate }
        if let latency = faults.latency { effective.latency = latency }
        if let drop = faults.dropToOneStreamAfterRejection { effective.dropToOneStreamAfterRejection = drop }
        return effective
    }
}

/// The parts of the behaviour that runtime faults can change, as one request sees them.
struct EffectiveBehaviour: Sendable {
    var internalServerErrorRate: Double
    var serviceUnavailableRate: Double
    /// Only as a runtime fault: a configured simulator never shuts down mid-answer.
    var shutdownRate: Double = 0
    var latency: Duration
    var latencyJitter: Duration
    var dropToOneStreamAfterRejection: Bool

    init(_ behaviour: APNsSimulatorConfiguration.Behaviour) {
        internalServerErrorRate = behaviour.internalServerErrorRate
        serviceUnavailableRate = behaviour.serviceUnavailableRate
        latency = behaviour.latency
        latencyJitter = behaviour.latencyJitter
        dropToOneStreamAfterRejection = behaviour.dropToOneStreamAfterRejection
    }
}
