import APNsCore
import Foundation

/// Everything the simulator does, in one value. Start with `APNsSimulatorConfiguration()` and
/// set what you need; `APNsSimulatorConfigFile` reads the same settings from JSON.
public struct APNsSimulatorConfiguration: Sendable {
    /// The longest latency, window or timeout the simulator takes. Durations become event-loop
    /// timers: huge ones would not fit, and a day is far beyond any test.
    static let longestDuration = Duration.seconds(86_400)

    /// Where to listen. A port of 0 picks a free one; nil disables the listener.
    public struct Listeners: Sendable {
        /// Default: "127.0.0.1".
        public var host = "127.0.0.1"
        /// HTTP/2 over TLS (ALPN h2, or prior knowledge without ALPN). Needs `tls`. Default: nil.
        public var http2TLSPort: Int?
        /// HTTP/2 over cleartext TCP with prior knowledge (h2c), for local load tests. Default: nil.
        public var http2CleartextPort: Int?
        /// The admin HTTP/1.1 endpoint (counters, on-demand GOAWAY). Default: nil.
        public var adminPort: Int?
        /// Legacy binary gateway over TLS (Apple's 2195). Needs `tls`. Default: nil.
        public var legacyGatewayTLSPort: Int?
        /// Legacy binary gateway over plain TCP (the reference test server's 2295). Default: nil.
        public var legacyGatewayPlainPort: Int?
        /// Legacy feedback service over TLS (Apple's 2196). Needs `tls`. Default: nil.
        public var legacyFeedbackTLSPort: Int?
        /// Legacy feedback service over plain TCP (the reference test server's 2296). Default: nil.
        public var legacyFeedbackPlainPort: Int?

        public init(host: String = "127.0.0.1", http2TLSPort: Int? = nil, http2CleartextPort: Int? = nil, adminPort: Int? = nil) {
            self.host = host
            self.http2TLSPort = http2TLSPort
            self.http2CleartextPort = http2CleartextPort
            self.adminPort = adminPort
        }
    }

    /// The server's TLS identity, and the CA that client certificates (certificate auth) must chain to.
    public struct TLS: Sendable {
        public var certificateChainPEM: String
        public var privateKeyPEM: String
        /// On the HTTP/2 ports, client certificates are requested and, when presented, must chain
        /// to this CA; the connection then uses certificate auth. On the legacy TLS ports one is
        /// required. Nil: clients use token auth only. Default: nil.
        public var clientCAPEM: String?

        public init(certificateChainPEM: String, privateKeyPEM: String, clientCAPEM: String? = nil) {
            self.certificateChainPEM = certificateChainPEM
            self.privateKeyPEM = privateKeyPEM
            self.clientCAPEM = clientCAPEM
        }
    }

    public struct Authentication: Sendable {
        /// Keys that may sign provider tokens, by key id and team. Default: none.
        public var tokenKeys: [ProviderTokenKey] = []
        /// Topics (bundle ids) each team may push to; a team not listed may push to any topic. Default: empty.
        public var teamTopics: [String: [String]] = [:]
        /// Topics a client certificate grants when it names none itself: the certificate's topics
        /// extension (1.2.840.113635.100.6.3.6) comes first, then its subject UID, then this list.
        /// Empty grants any topic. Default: empty.
        public var certificateTopics: [String] = []
        /// Oldest acceptable `iat`, in seconds. Default: 3600.
        public var maximumTokenAge: Int64 = 3600
        /// Seconds between token changes on one connection. Default: 1200.
        public var minimumTokenChangeInterval: Int64 = 1200
        /// A token-auth connection gets MAX_CONCURRENT_STREAMS 1 until a valid token arrives. Default: true.
        public var singleStreamUntilAuthenticated = true

        public init() {}
    }

    /// Injected behaviour: what makes the simulator useful for testing a client.
    public struct Behaviour: Sendable {
        /// Tokens (lowercase hex) answered 410 Unregistered, with the timestamp (ms) to report. Default: none.
        public var unregisteredTokens: [String: Int64] = [:]
        /// Tokens bound to one topic; pushing them to another topic gets DeviceTokenNotForTopic. Default: none.
        public var deviceTopics: [String: String] = [:]
        /// Requests one device token may receive per `perDeviceWindow`; more get 429 TooManyRequests. Default: nil (no limit).
        public var perDeviceLimit: Int?
        /// Default: 1 second.
        public var perDeviceWindow: Duration = .seconds(1)
        /// Fraction (0…1) of accepted requests answered 500 InternalServerError. Default: 0.
        public var internalServerErrorRate = 0.0
        /// Fraction (0…1) of accepted requests answered 503 ServiceUnavailable. Default: 0.
        public var serviceUnavailableRate = 0.0
        /// Send GOAWAY after this many streams on a connection. Default: nil.
        public var goAwayAfterStreams: Int?
        /// The `reason` in that GOAWAY's JSON. Default: "Shutdown".
        public var goAwayReason = "Shutdown"

        /// A reason that can go into GOAWAY's JSON as it is: printable ASCII, no space, quote or backslash.
        public static func isWellFormedGoAwayReason(_ reason: String) -> Bool {
            !reason.isEmpty && reason.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }
        }
        /// Answer as APNs's development (sandbox) server does: a 200 carries an `apns-unique-id`
        /// for Apple's delivery log, which production never sends. Default: false (production).
        public var development = false
        /// SETTINGS_MAX_CONCURRENT_STREAMS. Default: 1000 (what APNs usually sends).
        public var maxConcurrentStreams: UInt32 = 1000
        /// After a rejected notification, drop MAX_CONCURRENT_STREAMS to 1 until one is accepted. Default: false.
        public var dropToOneStreamAfterRejection = false
        /// Every answer waits this long (scheduled on the event loop, never blocking). Default: 0.
        public var latency: Duration = .zero
        /// Plus a uniformly random extra wait up to this. Default: 0.
        public var latencyJitter: Duration = .zero
        /// A connection without requests for this long gets GOAWAY IdleTimeout and is closed. Default: nil.
        public var idleTimeout: Duration?
        /// Seed for the error-rate and jitter draws, for repeatable runs. Default: nil (random).
        public var randomSeed: UInt64?
        /// Tokens (lowercase hex) the legacy gateway answers with error-response 8 (Invalid token). Default: none.
        public var invalidLegacyTokens: Set<String> = []

        public init() {}
    }

    public var listeners = Listeners()
    public var tls: TLS?
    public var authentication = Authentication()
    public var behaviour = Behaviour()
    /// Print every request readably (headers, hex dump and parsed payload). Default: false.
    public var dump = false
    /// Where dump text goes. Default: standard output.
    public var dumpSink: @Sendable (String) -> Void = { text in FileHandle.standardOutput.write(Data((text + "\n").utf8)) }

    public init() {}
}

/// A configuration error, naming the setting at fault.
public struct SimulatorConfigurationError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "simulator configuration: \(message)" }
}

/// Binds one listener; a failure (the port taken, an address not on this host) names the
/// listener and its port, which is a setting to change, rather than surfacing NIO's bare error.
func listening<Result>(_ listener: String, host: String, port: Int, _ bind: () async throws -> Result) async throws -> Result {
    do {
        return try await bind()
    } catch {
        throw SimulatorConfigurationError("cannot listen on \(host):\(port) for the \(listener): \(error)")
    }
}

/// The JSON config file (`apns-fleet simulator --config FILE`). Every key is optional; see
/// docs/simulator.md for the full list. File paths are relative to the file's directory.
public struct APNsSimulatorConfigFile: Decodable, Sendable {
    public struct TokenKey: Decodable, Sendable {
        public var keyID: String
        public var teamID: String
        /// A PEM public key or a .p8 private key (its public half is used).
        public var keyFile: String
        enum CodingKeys: String, CodingKey { case keyID = "key_id", teamID = "team_id", keyFile = "key_file" }
    }

    public var host: String?
    public var http2TLSPort: Int?
    public var http2CleartextPort: Int?
    public var adminPort: Int?
    public var certificateFile: String?
    public var privateKeyFile: String?
    public var clientCAFile: String?
    public var tokenKeys: [TokenKey]?
    public var teamTopics: [String: [String]]?
    public var certificateTopics: [String]?
    public var maximumTokenAgeSeconds: Int64?
    public var minimumTokenChangeIntervalSeconds: Int64?
    public var singleStreamUntilAuthenticated: Bool?
    /// Token → timestamp in ms (0: the time the simulator started).
    public var unregisteredTokens: [String: Int64]?
    public var deviceTopics: [String: String]?
    public var perDeviceLimit: Int?
    public var perDeviceWindowMilliseconds: Int64?
    public var internalServerErrorRate: Double?
    public var serviceUnavailableRate: Double?
    public var goAwayAfterStreams: Int?
    public var goAwayReason: String?
    public var maxConcurrentStreams: UInt32?
    public var dropToOneStreamAfterRejection: Bool?
    public var latencyMilliseconds: Int64?
    public var latencyJitterMilliseconds: Int64?
    public var idleTimeoutSeconds: Int64?
    public var randomSeed: UInt64?
    public var dump: Bool?
    /// "production" or "development".
    public var environment: String?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case host
        case http2TLSPort = "h2_port"
        case http2CleartextPort = "h2c_port"
        case adminPort = "admin_port"
        case certificateFile = "certificate_file"
        case privateKeyFile = "private_key_file"
        case clientCAFile = "client_ca_file"
        case tokenKeys = "token_keys"
        case teamTopics = "team_topics"
        case certificateTopics = "certificate_topics"
        case maximumTokenAgeSeconds = "max_token_age_seconds"
        case minimumTokenChangeIntervalSeconds = "min_token_change_interval_seconds"
        case singleStreamUntilAuthenticated = "single_stream_until_authenticated"
        case unregisteredTokens = "unregistered_tokens"
        case deviceTopics = "device_topics"
        case perDeviceLimit = "per_device_limit"
        case perDeviceWindowMilliseconds = "per_device_window_ms"
        case internalServerErrorRate = "internal_server_error_rate"
        case serviceUnavailableRate = "service_unavailable_rate"
        case goAwayAfterStreams = "goaway_after_streams"
        case goAwayReason = "goaway_reason"
        case maxConcurrentStreams = "max_concurrent_streams"
        case dropToOneStreamAfterRejection = "drop_to_one_stream_after_rejection"
        case latencyMilliseconds = "latency_ms"
        case latencyJitterMilliseconds = "latency_jitter_ms"
        case idleTimeoutSeconds = "idle_timeout_seconds"
        case randomSeed = "random_seed"
        case dump
        case environment
    }

    public static func load(path: String) throws -> (file: APNsSimulatorConfigFile, directory: URL) {
        let url = URL(fileURLWithPath: path)
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw SimulatorConfigurationError("cannot read config file \(path)")
        }
        // A misspelt key would be ignored by the decoder, and its setting silently left at the default.
        if let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] {
            let known = Set(CodingKeys.allCases.map(\.rawValue))
            if let unknown = object.keys.sorted().first(where: { !known.contains($0) }) {
                throw SimulatorConfigurationError("config file \(path): \(unknown) is not a setting (see docs/simulator.md)")
            }
        }
        do {
            return (try JSONDecoder().decode(APNsSimulatorConfigFile.self, from: data), url.deletingLastPathComponent())
        } catch let error as DecodingError {
            throw SimulatorConfigurationError("config file \(path): \(Self.describe(error))")
        }
    }

    /// Applies the file's settings over `configuration`; paths resolve against `directory`.
    public func apply(to configuration: inout APNsSimulatorConfiguration, relativeTo directory: URL, now: Int64) throws {
        func read(_ path: String) throws -> String {
            let url = path.hasPrefix("/") ? URL(fileURLWithPath: path) : directory.appendingPathComponent(path)
            guard let text = try? String(contentsOf: url, encoding: .utf8) else {
                throw SimulatorConfigurationError("cannot read \(url.path)")
            }
            return text
        }
        if let host { configuration.listeners.host = host }
        // A negative port turns the listener off (as -1 does on the command line).
        if let http2TLSPort { configuration.listeners.http2TLSPort = http2TLSPort < 0 ? nil : http2TLSPort }
        if let http2CleartextPort { configuration.listeners.http2CleartextPort = http2CleartextPort < 0 ? nil : http2CleartextPort }
        if let adminPort { configuration.listeners.adminPort = adminPort < 0 ? nil : adminPort }
        if certificateFile != nil || privateKeyFile != nil {
            guard let certificateFile, let privateKeyFile else {
                throw SimulatorConfigurationError("certificate_file and private_key_file go together")
            }
            configuration.tls = .init(certificateChainPEM: try read(certificateFile), privateKeyPEM: try read(privateKeyFile), clientCAPEM: configuration.tls?.clientCAPEM)
        }
        if let clientCAFile {
            guard configuration.tls != nil else { throw SimulatorConfigurationError("client_ca_file needs certificate_file and private_key_file") }
            configuration.tls?.clientCAPEM = try read(clientCAFile)
        }
        for key in tokenKeys ?? [] {
            do {
                configuration.authentication.tokenKeys.append(try ProviderTokenKey(keyID: key.keyID, teamID: key.teamID, pem: try read(key.keyFile)))
            } catch let error as ProviderTokenError {
                throw SimulatorConfigurationError("token key \(key.keyID): \(error.message)")
            }
        }
        if let teamTopics { configuration.authentication.teamTopics.merge(teamTopics) { $1 } }
        if let certificateTopics { configuration.authentication.certificateTopics = certificateTopics }
        if let maximumTokenAgeSeconds { configuration.authentication.maximumTokenAge = maximumTokenAgeSeconds }
        if let minimumTokenChangeIntervalSeconds { configuration.authentication.minimumTokenChangeInterval = minimumTokenChangeIntervalSeconds }
        if let singleStreamUntilAuthenticated { configuration.authentication.singleStreamUntilAuthenticated = singleStreamUntilAuthenticated }
        for (token, timestamp) in unregisteredTokens ?? [:] {
            configuration.behaviour.unregisteredTokens[token.lowercased()] = timestamp == 0 ? now * 1000 : timestamp
        }
        for (token, topic) in deviceTopics ?? [:] { configuration.behaviour.deviceTopics[token.lowercased()] = topic }
        if let perDeviceLimit { configuration.behaviour.perDeviceLimit = perDeviceLimit }
        if let perDeviceWindowMilliseconds { configuration.behaviour.perDeviceWindow = .milliseconds(perDeviceWindowMilliseconds) }
        if let internalServerErrorRate { configuration.behaviour.internalServerErrorRate = internalServerErrorRate }
        if let serviceUnavailableRate { configuration.behaviour.serviceUnavailableRate = serviceUnavailableRate }
        if let goAwayAfterStreams { configuration.behaviour.goAwayAfterStreams = goAwayAfterStreams }
        if let goAwayReason { configuration.behaviour.goAwayReason = goAwayReason }
        if let maxConcurrentStreams { configuration.behaviour.maxConcurrentStreams = maxConcurrentStreams }
        if let dropToOneStreamAfterRejection { configuration.behaviour.dropToOneStreamAfterRejection = dropToOneStreamAfterRejection }
        if let latencyMilliseconds { configuration.behaviour.latency = .milliseconds(latencyMilliseconds) }
        if let latencyJitterMilliseconds { configuration.behaviour.latencyJitter = .milliseconds(latencyJitterMilliseconds) }
        if let idleTimeoutSeconds { configuration.behaviour.idleTimeout = .seconds(idleTimeoutSeconds) }
        if let randomSeed { configuration.behaviour.randomSeed = randomSeed }
        if let dump { configuration.dump = dump }
        if let environment { configuration.behaviour.development = try APNsSimulatorConfiguration.isDevelopment(environment) }
        // Not validated here: the caller may still add what makes it whole (the command line's
        // certificate, or dropping the TLS ports when there is none); `start` validates.
    }

    private static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
            return "\(path(context)): \(context.debugDescription)"
        case .keyNotFound(let key, let context):
            return "\(path(context)): missing key \(key.stringValue)"
        @unknown default:
            return "invalid JSON"
        }
    }
}

extension APNsSimulatorConfiguration {
    /// `environment` as the config file or `--environment` gives it.
    public static func isDevelopment(_ environment: String) throws -> Bool {
        switch environment {
        case "production": return false
        // The fleet's configuration calls the development environment "sandbox".
        case "development", "sandbox": return true
        default: throw SimulatorConfigurationError("environment must be production or development (sandbox), got \"\(environment.prefix(40))\"")
        }
    }

    /// Checks values that cannot work together.
    public func validate() throws {
        for (name, rate) in [("internal_server_error_rate", behaviour.internalServerErrorRate), ("service_unavailable_rate", behaviour.serviceUnavailableRate)] {
            guard rate >= 0, rate <= 1 else { throw SimulatorConfigurationError("\(name) must be between 0 and 1, got \(rate)") }
        }
        guard behaviour.internalServerErrorRate + behaviour.serviceUnavailableRate <= 1 else {
            throw SimulatorConfigurationError("the 500 and 503 rates add up to more than 1")
        }
        guard behaviour.maxConcurrentStreams >= 1 else { throw SimulatorConfigurationError("max_concurrent_streams must be at least 1") }
        if let limit = behaviour.perDeviceLimit, limit < 1 { throw SimulatorConfigurationError("per_device_limit must be at least 1") }
        if let count = behaviour.goAwayAfterStreams, count < 1 { throw SimulatorConfigurationError("goaway_after_streams must be at least 1") }
        guard Behaviour.isWellFormedGoAwayReason(behaviour.goAwayReason) else {
            throw SimulatorConfigurationError("goaway_reason must be printable ASCII without spaces, quotes or backslashes (it goes into GOAWAY's JSON)")
        }
        if listeners.http2TLSPort != nil, tls == nil {
            throw SimulatorConfigurationError("the TLS port needs a server certificate and key")
        }
        // Requests' tokens are looked up lowercased (the file and flag readers lowercase these
        // keys too): an uppercase key set through the library would never match, silently.
        func uppercase(_ token: String) -> Bool { token.utf8.contains { (UInt8(ascii: "A")...UInt8(ascii: "F")).contains($0) } }
        for token in behaviour.unregisteredTokens.keys where !RequestValidator.isWellFormedToken(token[...]) || uppercase(token) {
            throw SimulatorConfigurationError("unregistered token \(token.prefix(16))… is not 64 to 200 lowercase hex digits")
        }
        for token in behaviour.deviceTopics.keys where !RequestValidator.isWellFormedToken(token[...]) || uppercase(token) {
            throw SimulatorConfigurationError("device_topics token \(token.prefix(16))… is not 64 to 200 lowercase hex digits")
        }
        let ports: [(String, Int?)] = [
            ("h2 TLS port", listeners.http2TLSPort), ("h2c port", listeners.http2CleartextPort), ("admin port", listeners.adminPort),
            ("legacy gateway TLS port", listeners.legacyGatewayTLSPort), ("legacy gateway port", listeners.legacyGatewayPlainPort),
            ("legacy feedback TLS port", listeners.legacyFeedbackTLSPort), ("legacy feedback port", listeners.legacyFeedbackPlainPort),
        ]
        for (name, port) in ports {
            if let port, !(0...65535).contains(port) { throw SimulatorConfigurationError("the \(name) must be 0 to 65535 (0 picks a free one), got \(port)") }
        }
        let day = Self.longestDuration
        for (name, duration) in [("latency_ms", behaviour.latency), ("latency_jitter_ms", behaviour.latencyJitter)] {
            guard duration >= .zero, duration <= day else { throw SimulatorConfigurationError("\(name) must be between 0 and a day, got \(duration)") }
        }
        guard behaviour.perDeviceWindow > .zero, behaviour.perDeviceWindow <= day else {
            throw SimulatorConfigurationError("per_device_window_ms must be positive and at most a day, got \(behaviour.perDeviceWindow)")
        }
        if let idle = behaviour.idleTimeout, idle <= .zero || idle > day {
            throw SimulatorConfigurationError("idle_timeout_seconds must be positive and at most a day, got \(idle)")
        }
        guard authentication.maximumTokenAge > 0 else { throw SimulatorConfigurationError("max_token_age_seconds must be positive") }
        guard authentication.minimumTokenChangeInterval >= 0 else { throw SimulatorConfigurationError("min_token_change_interval_seconds must not be negative") }
        for (team, topics) in authentication.teamTopics where topics.isEmpty || topics.contains(where: \.isEmpty) {
            throw SimulatorConfigurationError("team \(team)'s topics must be a non-empty list of non-empty topics (an empty list would grant every topic)")
        }
    }
}
