import APNsCore
import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import UnixSignals

/// `apns-fleet simulator`: the APNs HTTP/2 provider API simulator.
struct SimulatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulator",
        abstract: "Run an APNs simulator: HTTP/2 provider API, legacy binary gateway and feedback service.",
        discussion: """
            Answers POST /3/device/<token> like APNs: every request rule and reason of the \
            provider API, token auth (ES256 JWT, verified against the configured keys) and \
            certificate auth (mTLS against --client-ca), plus configurable behaviour: \
            unregistered tokens (410), per-device 429, 500/503 rates, GOAWAY, stream limits, \
            latency and idle timeout. The legacy binary gateway (commands 0, 1, 2; error-response \
            8) and feedback service listen on TLS and plain ports; unregistered tokens are \
            accepted there and reported by the feedback service. Flags override the --config \
            file (JSON, see docs/simulator.md). Turn a listener off with -1, written with an \
            equals sign so it is not read as a flag: --h2c-port=-1. Counters: \
            GET http://HOST:ADMIN/counters while it runs; they are printed at exit (SIGINT or \
            SIGTERM).

            Example:
              apns-fleet dev-credentials --out ./dev   # once (--force replaces)
              apns-fleet simulator --config ./dev/simulator.json --unregistered <64 hex digits> --dump &
              curl -s http://127.0.0.1:9197/counters
            """
    )

    @Option(help: "JSON config file; flags given here override it.")
    var config: String?

    @Option(help: "Address to listen on.")
    var host: String?

    @Option(name: .customLong("h2-port"), help: "HTTP/2 over TLS port (0: any free port). Enabled when a certificate is configured. Default: 2197.")
    var http2Port: Int?

    @Option(name: .customLong("h2c-port"), help: "HTTP/2 cleartext (prior knowledge) port (0: any free port; -1: off). Default: 2198.")
    var http2CleartextPort: Int?

    @Option(name: .customLong("admin-port"), help: "Admin HTTP port for counters and GOAWAY (0: any free port; -1: off). Default: 9197.")
    var adminPort: Int?

    @Option(name: .customLong("gateway-port"), help: "Legacy binary gateway over TLS (0: any free port; -1: off). Default: 2195 when a certificate is configured.")
    var gatewayPort: Int?

    @Option(name: .customLong("gateway-plain-port"), help: "Legacy binary gateway over plain TCP (0: any free port; -1: off). Default: 2295.")
    var gatewayPlainPort: Int?

    @Option(name: .customLong("feedback-port"), help: "Legacy feedback service over TLS (0: any free port; -1: off). Default: 2196 when a certificate is configured.")
    var feedbackPort: Int?

    @Option(name: .customLong("feedback-plain-port"), help: "Legacy feedback service over plain TCP (0: any free port; -1: off). Default: 2296.")
    var feedbackPlainPort: Int?

    @Option(name: .customLong("invalid-token"), help: "A token the legacy gateway answers with error-response 8 (Invalid token). Repeatable.")
    var invalidTokens: [String] = []

    @Option(help: "Server certificate chain (PEM).")
    var certificate: String?

    @Option(name: .customLong("private-key"), help: "Server private key (PEM).")
    var privateKey: String?

    @Option(name: .customLong("client-ca"), help: "CA (PEM) that client certificates must chain to; enables certificate auth.")
    var clientCA: String?

    @Option(name: .customLong("token-key"), help: "A provider-token key as KEY_ID:TEAM_ID:FILE (.p8 or PEM public key). Repeatable.")
    var tokenKeys: [String] = []

    @Option(name: .customLong("team-topics"), help: "Topics a team may push to, as TEAM_ID=topic1,topic2. Repeatable.")
    var teamTopics: [String] = []

    @Option(name: .customLong("certificate-topic"), help: "A topic client certificates grant when they name none (no topics extension, no subject UID). Repeatable.")
    var certificateTopics: [String] = []

    @Option(help: "A token answered 410 Unregistered, as TOKEN or TOKEN@TIMESTAMP_MS. Repeatable.")
    var unregistered: [String] = []

    @Option(name: .customLong("device-topic"), help: "Bind a token to a topic (others get DeviceTokenNotForTopic), as TOKEN=topic. Repeatable.")
    var deviceTopics: [String] = []

    @Option(name: .customLong("per-device-limit"), help: "Requests one device may get per window before 429 TooManyRequests.")
    var perDeviceLimit: Int?

    @Option(name: .customLong("per-device-window-ms"), help: "The per-device window in milliseconds. Default: 1000.")
    var perDeviceWindowMilliseconds: Int64?

    @Option(name: .customLong("error-500-rate"), help: "Fraction (0...1) of accepted requests answered 500 InternalServerError.")
    var internalServerErrorRate: Double?

    @Option(name: .customLong("error-503-rate"), help: "Fraction (0...1) of accepted requests answered 503 ServiceUnavailable.")
    var serviceUnavailableRate: Double?

    @Option(name: .customLong("goaway-after"), help: "Send GOAWAY after this many streams on a connection.")
    var goAwayAfterStreams: Int?

    @Option(name: .customLong("goaway-reason"), help: "The reason in GOAWAY's JSON. Default: Shutdown.")
    var goAwayReason: String?

    @Option(name: .customLong("max-concurrent-streams"), help: "SETTINGS_MAX_CONCURRENT_STREAMS. Default: 1000.")
    var maxConcurrentStreams: UInt32?

    @Option(help: "production, or development to answer as APNs's development server does (200s carry apns-unique-id). Default: production.")
    var environment: String?

    @Flag(name: .customLong("drop-to-one-stream-after-rejection"), help: "After a rejected notification allow one stream until one is accepted, as APNs does.")
    var dropToOneStreamAfterRejection = false

    @Flag(name: .customLong("no-single-stream-until-authenticated"), help: "Do not limit new token-auth connections to one stream until a valid token arrives.")
    var noSingleStreamUntilAuthenticated = false

    @Option(name: .customLong("latency-ms"), help: "Answer every request after this many milliseconds.")
    var latencyMilliseconds: Int64?

    @Option(name: .customLong("latency-jitter-ms"), help: "Plus up to this many random milliseconds.")
    var latencyJitterMilliseconds: Int64?

    @Option(name: .customLong("idle-timeout"), help: "Seconds without requests before GOAWAY IdleTimeout.")
    var idleTimeoutSeconds: Int64?

    @Option(help: "Random seed for error rates and jitter (repeatable runs).")
    var seed: UInt64?

    @Flag(help: "Print every request: headers, hex dump and parsed payload, and the answer.")
    var dump = false

    func run() async throws {
        let configuration: APNsSimulatorConfiguration
        do {
            configuration = try makeConfiguration(now: Int64(Date().timeIntervalSince1970))
        } catch let error as SimulatorConfigurationError {
            throw UsageError(error.description)
        }
        let logger = Logger(label: "apns-fleet.simulator")
        let service = APNsSimulatorService(
            configuration: configuration,
            onStart: { simulator in
                var parts: [String] = []
                let host = configuration.listeners.host
                if let port = simulator.port(.http2TLS) { parts.append("h2 (TLS) \(host):\(port)") }
                if let port = simulator.port(.http2Cleartext) { parts.append("h2c \(host):\(port)") }
                if let port = simulator.port(.admin) { parts.append("admin http://\(host):\(port)/counters") }
                if let port = simulator.port(.legacyGatewayTLS) { parts.append("gateway (TLS) \(host):\(port)") }
                if let port = simulator.port(.legacyGatewayPlain) { parts.append("gateway \(host):\(port)") }
                if let port = simulator.port(.legacyFeedbackTLS) { parts.append("feedback (TLS) \(host):\(port)") }
                if let port = simulator.port(.legacyFeedbackPlain) { parts.append("feedback \(host):\(port)") }
                // Written straight to the file descriptor so that scripts waiting for this line see it at once.
                FileHandle.standardOutput.write(Data(("apns-fleet simulator listening: " + parts.joined(separator: ", ") + "\n").utf8))
            },
            onStop: { simulator in
                FileHandle.standardOutput.write(Data(("apns-fleet simulator counters at exit:\n" + simulator.counters.snapshot().summary + "\n").utf8))
                if let legacy = simulator.legacy?.counts {
                    let errors = legacy.errorResponses.sorted { $0.key < $1.key }.map { "status \($0.key): \($0.value)" }.joined(separator: ", ")
                    let text = "legacy gateway: \(legacy.gatewayConnections) connections, \(legacy.accepted) notifications accepted "
                        + "(\(legacy.acceptedForUnregistered) to unregistered tokens), error-responses: \(errors.isEmpty ? "none" : errors); "
                        + "feedback: \(legacy.feedbackConnections) connections, \(legacy.feedbackTuplesSent) tuples\n"
                    FileHandle.standardOutput.write(Data(text.utf8))
                }
            }
        )
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(services: [.init(service: service)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await group.run()
    }

    func makeConfiguration(now: Int64) throws -> APNsSimulatorConfiguration {
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners.http2TLSPort = 2197
        configuration.listeners.http2CleartextPort = 2198
        configuration.listeners.adminPort = 9197
        configuration.listeners.legacyGatewayTLSPort = 2195
        configuration.listeners.legacyGatewayPlainPort = 2295
        configuration.listeners.legacyFeedbackTLSPort = 2196
        configuration.listeners.legacyFeedbackPlainPort = 2296
        if let config {
            let (file, directory) = try APNsSimulatorConfigFile.load(path: config)
            try file.apply(to: &configuration, relativeTo: directory, now: now)
        }
        func port(_ value: Int?, _ current: Int?) -> Int? {
            guard let value else { return current }
            return value < 0 ? nil : value
        }
        if let host { configuration.listeners.host = host }
        configuration.listeners.http2TLSPort = port(http2Port, configuration.listeners.http2TLSPort)
        configuration.listeners.http2CleartextPort = port(http2CleartextPort, configuration.listeners.http2CleartextPort)
        configuration.listeners.adminPort = port(adminPort, configuration.listeners.adminPort)
        configuration.listeners.legacyGatewayTLSPort = port(gatewayPort, configuration.listeners.legacyGatewayTLSPort)
        configuration.listeners.legacyGatewayPlainPort = port(gatewayPlainPort, configuration.listeners.legacyGatewayPlainPort)
        configuration.listeners.legacyFeedbackTLSPort = port(feedbackPort, configuration.listeners.legacyFeedbackTLSPort)
        configuration.listeners.legacyFeedbackPlainPort = port(feedbackPlainPort, configuration.listeners.legacyFeedbackPlainPort)

        if certificate != nil || privateKey != nil {
            guard let certificate, let privateKey else { throw SimulatorConfigurationError("--certificate and --private-key go together") }
            configuration.tls = .init(certificateChainPEM: try read(certificate), privateKeyPEM: try read(privateKey), clientCAPEM: configuration.tls?.clientCAPEM)
        }
        if let clientCA {
            guard configuration.tls != nil else { throw SimulatorConfigurationError("--client-ca needs --certificate and --private-key") }
            configuration.tls?.clientCAPEM = try read(clientCA)
        }
        // Without a server certificate there is no TLS listener.
        if configuration.tls == nil {
            configuration.listeners.http2TLSPort = nil
            configuration.listeners.legacyGatewayTLSPort = nil
            configuration.listeners.legacyFeedbackTLSPort = nil
        }

        for spec in tokenKeys {
            let parts = spec.split(separator: ":", maxSplits: 2).map(String.init)
            guard parts.count == 3 else { throw SimulatorConfigurationError("--token-key \(spec): expected KEY_ID:TEAM_ID:FILE") }
            do {
                configuration.authentication.tokenKeys.append(try ProviderTokenKey(keyID: parts[0], teamID: parts[1], pem: try read(parts[2])))
            } catch let error as ProviderTokenError {
                throw SimulatorConfigurationError("--token-key \(parts[0]): \(error.message)")
            }
        }
        for spec in teamTopics {
            let parts = spec.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2 else { throw SimulatorConfigurationError("--team-topics \(spec): expected TEAM_ID=topic1,topic2") }
            configuration.authentication.teamTopics[parts[0]] = parts[1].split(separator: ",").map(String.init)
        }
        if !certificateTopics.isEmpty { configuration.authentication.certificateTopics = certificateTopics }
        if noSingleStreamUntilAuthenticated { configuration.authentication.singleStreamUntilAuthenticated = false }

        for spec in unregistered {
            let parts = spec.split(separator: "@", maxSplits: 1).map(String.init)
            var timestamp = now * 1000
            if parts.count == 2 {
                guard let value = Int64(parts[1]), value >= 0 else { throw SimulatorConfigurationError("--unregistered \(spec): the timestamp must be milliseconds") }
                // 0 means the start time, as in the configuration file.
                if value > 0 { timestamp = value }
            }
            configuration.behaviour.unregisteredTokens[parts[0].lowercased()] = timestamp
        }
        for spec in deviceTopics {
            let parts = spec.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2 else { throw SimulatorConfigurationError("--device-topic \(spec): expected TOKEN=topic") }
            configuration.behaviour.deviceTopics[parts[0].lowercased()] = parts[1]
        }
        for token in invalidTokens {
            do {
                configuration.behaviour.invalidLegacyTokens.insert(try DeviceToken(hex: token).hex)
            } catch {
                throw SimulatorConfigurationError("--invalid-token \(token.prefix(16)): \(error.message)")
            }
        }
        if let perDeviceLimit { configuration.behaviour.perDeviceLimit = perDeviceLimit }
        if let perDeviceWindowMilliseconds { configuration.behaviour.perDeviceWindow = .milliseconds(perDeviceWindowMilliseconds) }
        if let internalServerErrorRate { configuration.behaviour.internalServerErrorRate = internalServerErrorRate }
        if let serviceUnavailableRate { configuration.behaviour.serviceUnavailableRate = serviceUnavailableRate }
        if let goAwayAfterStreams { configuration.behaviour.goAwayAfterStreams = goAwayAfterStreams }
        if let goAwayReason { configuration.behaviour.goAwayReason = goAwayReason }
        if let maxConcurrentStreams { configuration.behaviour.maxConcurrentStreams = maxConcurrentStreams }
        if dropToOneStreamAfterRejection { configuration.behaviour.dropToOneStreamAfterRejection = true }
        if let environment { configuration.behaviour.development = try APNsSimulatorConfiguration.isDevelopment(environment) }
        if let latencyMilliseconds { configuration.behaviour.latency = .milliseconds(latencyMilliseconds) }
        if let latencyJitterMilliseconds { configuration.behaviour.latencyJitter = .milliseconds(latencyJitterMilliseconds) }
        if let idleTimeoutSeconds { configuration.behaviour.idleTimeout = .seconds(idleTimeoutSeconds) }
        if let seed { configuration.behaviour.randomSeed = seed }
        if dump { configuration.dump = true }
        try configuration.validate()
        return configuration
    }

    private func read(_ path: String) throws -> String {
        guard let data = FileManager.default.contents(atPath: path) else { throw SimulatorConfigurationError("cannot read \(path)") }
        return String(decoding: data, as: UTF8.self)
    }
}
