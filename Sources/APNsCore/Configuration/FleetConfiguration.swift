/// A secret value (a SASL password, a key password). It prints as `<redacted>` everywhere, so
/// it cannot leak through logs, error messages or string interpolation by accident.
public struct Secret: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The secret itself; read it only where it is handed to the library that needs it.
    public let revealed: String
    /// The file it was read from (a `*-file` key), so that a file every user can read is warned about.
    public let file: String?

    public init(_ value: String, file: String? = nil) {
        self.revealed = value
        self.file = file
    }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
}

/// The whole configuration of an apns-fleet process, typed and validated.
///
/// Loaded by `APNsFleetConfig.ConfigurationLoader` from a file, the environment and flags;
/// every key is documented in `docs/configuration.md`.
public struct FleetConfiguration: Sendable {
    public var kafka: KafkaSettings
    public var topics: TopicNames
    /// Credential sets, in the order configured. Jobs pick one with `app`.
    public var apps: [AppConfiguration]
    /// The app for jobs that name none and whose topic maps to no app. Default: the only app, if there is one.
    public var defaultApp: String?
    public var worker: WorkerSettings
    public var retry: RetryPolicy
    public var admin: AdminSettings
    public var feedback: FeedbackSettings

    public init(
        kafka: KafkaSettings = KafkaSettings(),
        topics: TopicNames = TopicNames(),
        apps: [AppConfiguration] = [],
        defaultApp: String? = nil,
        worker: WorkerSettings = WorkerSettings(),
        retry: RetryPolicy = RetryPolicy(),
        admin: AdminSettings = AdminSettings(),
        feedback: FeedbackSettings = FeedbackSettings()
    ) {
        self.kafka = kafka
        self.topics = topics
        self.apps = apps
        self.defaultApp = defaultApp
        self.worker = worker
        self.retry = retry
        self.admin = admin
        self.feedback = feedback
    }

    public func app(named name: String) -> AppConfiguration? {
        appIndex(named: name).map { apps[$0] }
    }

    private func appIndex(named name: String) -> Int? {
        apps.firstIndex(where: { $0.name == name })
    }

    /// Which app serves a job: its `app` field, else the app that lists its topic, else the
    /// default app. The error names what was asked for.
    public func app(for job: NotificationJob) throws(JobRejection) -> AppConfiguration {
        apps[try appIndex(for: job)]
    }

    /// The one app `matches` picks for `topic`. Several match when apps share a bundle (a
    /// production and a sandbox credential set): then the default app if it is one of them, as
    /// the order of `apps` must not decide where a job goes (a sandbox token sent to production
    /// is answered BadDeviceToken, and the token is invalidated); else the job must name its app.
    private func onlyApp(for topic: String, where matches: (AppConfiguration) -> Bool) throws(JobRejection) -> Int? {
        var found: Int?
        var others: [String] = []
        for index in apps.indices where matches(apps[index]) {
            if found == nil { found = index } else { others.append(apps[index].name) }
        }
        guard let first = found, !others.isEmpty else { return found }
        if let name = defaultApp, let index = appIndex(named: name), index == first || others.contains(name) { return index }
        let names = ([apps[first].name] + others).joined(separator: ", ")
        throw JobRejection(field: "app", "topic \(JobRules.quoted(JobRules.clip(topic))) belongs to apps \(names), and the job names none of them; give the job's app, or make one of them default-app")
    }

    /// Whether `topic` is `app`'s own with the suffix the job's push type needs
    /// (`com.example.app.voip` for a VoIP job of `com.example.app`): the topic its jobs get when
    /// they state none.
    private static func app(_ app: AppConfiguration, derives topic: String, pushType: PushType?) -> Bool {
        guard let bundle = app.defaults.topic, let suffix = (pushType ?? app.defaults.pushType).requiredTopicSuffix else { return false }
        return topic == bundle + suffix
    }

    /// Where in `apps` the app serving `job` is (see `app(for:)`). On the hot path, so that
    /// the caller reads the fields it needs instead of copying the whole configuration.
    public func appIndex(for job: NotificationJob) throws(JobRejection) -> Int {
        if let name = job.app {
            guard let index = appIndex(named: name) else {
                let known = apps.map(\.name).joined(separator: ", ")
                throw JobRejection(field: "app", "unknown app \(JobRules.quoted(JobRules.clip(name))); configured apps: \(known.isEmpty ? "none" : known)")
            }
            return index
        }
        if let topic = job.topic {
            // A topic an app names outright wins over one only derived from another's bundle id
            // (a VoIP certificate's own `com.x.voip` app beside the `com.x` app).
            if let index = try onlyApp(for: topic, where: { $0.topics.contains(topic) || $0.defaults.topic == topic }) { return index }
            if let index = try onlyApp(for: topic, where: { Self.app($0, derives: topic, pushType: job.pushType) }) { return index }
        }
        if let name = defaultApp ?? (apps.count == 1 ? apps.first?.name : nil), let index = appIndex(named: name) {
            return index
        }
        throw JobRejection(field: "app", "the job names no app, its topic maps to none, and no default app is configured")
    }
}

public struct KafkaSettings: Sendable {
    public enum SecurityProtocol: String, Sendable, CaseIterable {
        case plaintext, ssl
        case saslPlaintext = "sasl_plaintext"
        case saslSSL = "sasl_ssl"

        public var usesSASL: Bool { self == .saslPlaintext || self == .saslSSL }
        public var usesTLS: Bool { self == .ssl || self == .saslSSL }
    }

    public enum SASLMechanism: String, Sendable, CaseIterable {
        case plain = "PLAIN"
        case scramSHA256 = "SCRAM-SHA-256"
        case scramSHA512 = "SCRAM-SHA-512"
    }

    /// Default: `127.0.0.1:9092`.
    public var bootstrapServers: String

    /// Consumer group of the push workers. Default: `apns-fleet-push`.
    public var groupID: String
    /// Consumer group of the feedback worker. Default: `apns-fleet-feedback`.
    public var feedbackGroupID: String
    /// Default: plaintext.
    public var securityProtocol: SecurityProtocol
    public var saslMechanism: SASLMechanism?
    public var saslUsername: String?
    public var saslPassword: Secret?
    public var sslCAFile: String?
    public var sslCertificateFile: String?
    public var sslKeyFile: String?
    public var sslKeyPassword: Secret?
    /// Extra librdkafka properties, passed through unchanged (they win over everything above,
    /// except `managedProperties`).
    public var properties: [String: String]

    /// The largest record the producer takes (librdkafka's `message.max.bytes`, 1,000,000 unless
    /// `properties` sets it): value, key and headers together.
    public var producerMessageMaxBytes: Int {
        properties["message.max.bytes"].flatMap { Int($0) } ?? 1_000_000
    }

    /// librdkafka properties `properties` may not set, with the reason: those the delivery
    /// guarantees rest on, and those that have their own keys.
    public static let managedProperties: [String: String] = [
        "enable.idempotence": "results and events are produced idempotently, always",
        "enable.auto.offset.store": "offsets are stored only once a record's results are acknowledged (at-least-once)",
        "enable.auto.commit": "stored offsets are committed by librdkafka's commit timer; without it nothing is committed",
        "group.id": "set kafka.group-id (push workers) or kafka.feedback-group-id instead",
        "enable.partition.eof": "the consumer does not handle end-of-partition events",
        "delivery.report.only.error": "a job's offset is stored only once the delivery reports of its results arrive, successes included",
        // librdkafka 2.0.2 commits a revoked partition's offsets only with the "broker" method.
        "offset.store.method": "offsets are committed to the group's broker (the default); any other method loses the offsets stored at a rebalance or a stop",
        // One source for each, so that the brokers' schemes can be checked against the protocol.
        "security.protocol": "set kafka.security-protocol instead",
        "bootstrap.servers": "set kafka.bootstrap-servers instead",
    ]

    public init(
        bootstrapServers: String = "127.0.0.1:9092",
        groupID: String = "apns-fleet-push",
        feedbackGroupID: String = "apns-fleet-feedback",
        securityProtocol: SecurityProtocol = .plaintext,
        saslMechanism: SASLMechanism? = nil,
        saslUsername: String? = nil,
        saslPassword: Secret? = nil,
        sslCAFile: String? = nil,
        sslCertificateFile: String? = nil,
        sslKeyFile: String? = nil,
        sslKeyPassword: Secret? = nil,
        properties: [String: String] = [:]
    ) {
        self.bootstrapServers = bootstrapServers
        self.groupID = groupID
        self.feedbackGroupID = feedbackGroupID
        self.securityProtocol = securityProtocol
        self.saslMechanism = saslMechanism
        self.saslUsername = saslUsername
        self.saslPassword = saslPassword
        self.sslCAFile = sslCAFile
        self.sslCertificateFile = sslCertificateFile
        self.sslKeyFile = sslKeyFile
        self.sslKeyPassword = sslKeyPassword
        self.properties = properties
    }
}

// MARK: - Bootstrap list

extension KafkaSettings {
    /// One entry of a bootstrap list, as librdkafka reads it: `host`, `host:port` or
    /// `[IPv6]:port` (9092 by default), optionally after `scheme://` and before a path it ignores.
    public struct Broker: Sendable, Hashable {
        public var host: String
        /// Nil: librdkafka's default, 9092.
        public var port: Int?
    }

    /// The entries of a bootstrap list: spaces around each trimmed and empty ones dropped, as
    /// librdkafka does.
    public static func bootstrapEntries(_ list: String) -> [Substring] {
        list.split(separator: ",").compactMap { part in
            let start = part.drop { $0 == " " }
            return start.lastIndex { $0 != " " }.map { start[...$0] }
        }
    }

    /// The brokers of a bootstrap list, or what is wrong with it. librdkafka takes what it
    /// cannot use without an error and then never connects: a port that is not one, or a scheme
    /// it does not know or that is not `securityProtocol` (it then drops that entry and every
    /// one after it). An IPv6 address must be in brackets: unbracketed, its last group would
    /// pass for the port. (The fleet's configuration refuses spaces before this; `bench kafka`
    /// passes them on.)
    public static func brokers(_ list: String, securityProtocol: SecurityProtocol? = nil) -> Result<[Broker], BootstrapProblem> {
        let entries = bootstrapEntries(list)
        guard !entries.isEmpty else { return .failure(BootstrapProblem("names no broker")) }
        var brokers: [Broker] = []
        for entry in entries {
            switch broker(entry, securityProtocol: securityProtocol) {
            case .success(let broker): brokers.append(broker)
            case .failure(let problem): return .failure(problem)
            }
        }
        return .success(brokers)
    }

    /// What is wrong with a bootstrap list, or nil: `brokers`' problem.
    public static func bootstrapServersProblem(_ list: String, securityProtocol: SecurityProtocol? = nil) -> String? {
        guard case .failure(let problem) = brokers(list, securityProtocol: securityProtocol) else { return nil }
        return problem.description
    }

    /// Why a bootstrap list cannot work, for an error message that names the entry (unless it
    /// may hold a password).
    public struct BootstrapProblem: Error, Sendable, Hashable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    private static func broker(_ entry: Substring, securityProtocol: SecurityProtocol?) -> Result<Broker, BootstrapProblem> {
        func problem(_ text: String) -> Result<Broker, BootstrapProblem> { .failure(BootstrapProblem(text)) }
        // Not shown: what comes before an "@" may be a password.
        guard !entry.contains("@") else {
            return problem("has an entry with \"@\" (user:password@host?); brokers take no credentials: set kafka.sasl.username and kafka.sasl.password-file")
        }
        let shown = JobRules.quoted(JobRules.clip(String(entry)))
        guard !entry.contains(where: \.isWhitespace) else { return problem("\(shown) has a space in it") }
        var rest = entry
        if let separator = rest.firstRange(of: "://") {
            let written = rest[..<separator.lowerBound]
            guard let stated = SecurityProtocol(rawValue: written.lowercased()) else {
                return problem("\(shown) has scheme \(JobRules.quoted(String(written))); librdkafka knows plaintext, ssl, sasl_plaintext and sasl_ssl")
            }
            if let securityProtocol, stated != securityProtocol {
                return problem("\(shown) says \(stated.rawValue), but kafka.security-protocol is \(securityProtocol.rawValue); librdkafka would drop it and every broker after it")
            }
            rest = rest[separator.upperBound...]
        }
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        var host = rest
        var port: Substring?
        if rest.hasPrefix("[") {
            guard let end = rest.firstIndex(of: "]") else { return problem("\(shown) has no ']' after its IPv6 address") }
            host = rest[rest.index(after: rest.startIndex)..<end]
            let after = rest[rest.index(after: end)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return problem("\(shown): only :port may follow ']'") }
                port = after.dropFirst()
            }
        } else if rest.filter({ $0 == ":" }).count > 1 {
            // librdkafka would read "::1:9092" as the address ::1:9092 on port 9092.
            return problem("\(shown): an IPv6 address needs brackets, as in [::1]:9092")
        } else if let colon = rest.firstIndex(of: ":") {
            host = rest[..<colon]
            port = rest[rest.index(after: colon)...]
        }
        var number: Int?
        if let port {
            guard port.allSatisfy({ ("0"..."9").contains($0) }), let value = Int(port), (1...65_535).contains(value) else {
                return problem("\(shown) has port \(JobRules.quoted(String(port))); it must be 1 to 65535")
            }
            number = value
        }
        return .success(Broker(host: String(host), port: number))
    }
}

/// Kafka topic names; docs/design.md's defaults.
public struct TopicNames: Sendable, Hashable {
    public var jobs: String
    public var retry: String
    public var deadLetter: String
    public var results: String
    public var tokenEvents: String

    public init(
        jobs: String = "apns.jobs",
        retry: String = "apns.jobs.retry",
        deadLetter: String = "apns.jobs.dlq",
        results: String = "apns.results",
        tokenEvents: String = "apns.token-events"
    ) {
        self.jobs = jobs
        self.retry = retry
        self.deadLetter = deadLetter
        self.results = results
        self.tokenEvents = tokenEvents
    }

    public var all: [String] { [jobs, retry, deadLetter, results, tokenEvents] }

    /// Why `name` is not a Kafka topic name, or nil when it is one: 1 to 249 of
    /// `a-z A-Z 0-9 . _ -`, not `.` or `..` (Kafka's own rule). Checked before a name reaches
    /// librdkafka, whose mock cluster takes any string (a comma, an empty name).
    public static func problem(with name: String) -> String? {
        if let bad = name.unicodeScalars.first(where: { !(("0"..."9").contains($0) || ("a"..."z").contains($0) || ("A"..."Z").contains($0) || $0 == "." || $0 == "_" || $0 == "-") }) {
            return "a Kafka topic name may only use letters, digits, '.', '_' and '-', not '\(bad)'"
        }
        guard !name.isEmpty, name.utf8.count <= 249, name != ".", name != ".." else {
            return "a Kafka topic name has 1 to 249 characters, and is not '.' or '..'"
        }
        return nil
    }
}

/// One credential set: a team's key or certificate, its topics and where its APNs is.
public struct AppConfiguration: Sendable {
    public enum Authentication: Sendable {
        /// ES256 provider tokens from a .p8 key.
        case token(keyFile: String, keyID: String, teamID: String)
        /// TLS client certificate: PEM certificate and key, or a PKCS#12 bundle.
        case certificate(CertificateSource)
    }

    public enum CertificateSource: Sendable {
        case pem(certificateFile: String, privateKeyFile: String, password: Secret?)
        case pkcs12(file: String, password: Secret?)
    }

    /// Where APNs is. Production and sandbox always verify Apple's certificate against the
    /// system roots; a custom endpoint (a simulator) verifies against its own CA file.
    public enum Endpoint: Sendable, Hashable {
        case production
        case sandbox
        case custom(host: String, port: Int, caFile: String?)

        public var host: String {
            switch self {
            case .production: "api.push.apple.com"
            case .sandbox: "api.sandbox.push.apple.com"
            case .custom(let host, _, _): host
            }
        }

        public var port: Int {
            switch self {
            case .production, .sandbox: 443
            case .custom(_, let port, _): port
            }
        }

        /// A host of your own (a simulator) rather than Apple's production or sandbox.
        public var isCustom: Bool {
            if case .custom = self { return true }
            return false
        }

        /// The `environment` label of the client's metrics: production, sandbox or custom.
        public var metricLabel: String {
            switch self {
            case .production: "production"
            case .sandbox: "sandbox"
            case .custom: "custom"
            }
        }
    }

    public enum TransportProtocol: String, Sendable, CaseIterable {
        case http2
        /// The legacy binary interface (gateway port 2195), certificate auth only.
        case binary
    }

    public var name: String
    public var authentication: Authentication
    public var defaults: JobDefaults
    /// Topics this app serves; jobs on these topics without `app` are routed here.
    public var topics: [String]
    public var endpoint: Endpoint
    /// The Apple environments this app's jobs may ask for (a job's `environment` picks one); the
    /// app gets a pool of `connections` in each. Default: `defaults.environment` alone. Unused
    /// by a custom endpoint (one pool serves both) and by the binary interface.
    public var environments: [APNsEnvironment]
    /// Long-lived connections per worker to this app's APNs. Default: 2.
    public var connections: Int
    public var transport: TransportProtocol
    /// The legacy binary gateway and feedback service, for `transport: binary` and feedback polling.
    public var legacyGateway: LegacyEndpoint?
    public var legacyFeedback: LegacyEndpoint?
    /// The binary interface's notification format: enhanced (command 1, the default) or simple (command 0).
    public var legacyFormat: LegacyNotification.Format = .enhanced
    /// How long the gateway must stay silent before a binary notification counts as delivered. Default: 1 s.
    public var legacyQuietPeriodMilliseconds = 1000
    /// Reconnects a second per connection, after a burst of ten, following error-responses that
    /// blame a notification (each one closes the connection). Default: 5.
    public var legacyErrorReconnectsPerSecond = 5

    public init(
        name: String,
        authentication: Authentication,
        defaults: JobDefaults = JobDefaults(),
        topics: [String] = [],
        endpoint: Endpoint = .production,
        environments: [APNsEnvironment]? = nil,
        connections: Int = 2,
        transport: TransportProtocol = .http2,
        legacyGateway: LegacyEndpoint? = nil,
        legacyFeedback: LegacyEndpoint? = nil
    ) {
        self.name = name
        self.authentication = authentication
        self.defaults = defaults
        self.topics = topics
        self.endpoint = endpoint
        self.environments = environments ?? [defaults.environment]
        self.connections = connections
        self.transport = transport
        self.legacyGateway = legacyGateway
        self.legacyFeedback = legacyFeedback
    }
}

/// A host and port of the legacy binary interface, with TLS or (for local tests) without.
public struct LegacyEndpoint: Sendable, Hashable {
    public var host: String
    public var port: Int
    public var tls: Bool
    public var caFile: String?

    public init(host: String, port: Int, tls: Bool = true, caFile: String? = nil) {
        self.host = host
        self.port = port
        self.tls = tls
        self.caFile = caFile
    }
}

public struct WorkerSettings: Sendable {
    /// Written into every result's `worker`. Default: `worker-<hostname>-<pid>`.
    public var id: String?
    /// Notifications in flight per worker; 0 sizes it from the pool's streams. Default: 0.
    public var maxInFlight: Int
    /// Tokens one fan-out job may carry. Default: 1000.
    public var maxTokensPerJob: Int
    /// How long SIGTERM waits for in-flight work before giving up. Default: 25 s.
    public var drainTimeoutSeconds: Double
    /// How long one APNs request may take before it counts as failed. Default: 10 s.
    public var requestTimeoutSeconds: Double

    public init(
        id: String? = nil,
        maxInFlight: Int = 0,
        maxTokensPerJob: Int = 1000,
        drainTimeoutSeconds: Double = 25,
        requestTimeoutSeconds: Double = 10
    ) {
        self.id = id
        self.maxInFlight = maxInFlight
        self.maxTokensPerJob = maxTokensPerJob
        self.drainTimeoutSeconds = drainTimeoutSeconds
        self.requestTimeoutSeconds = requestTimeoutSeconds
    }
}

/// Exponential backoff with jitter, first in process, then through the retry topic.
public struct RetryPolicy: Sendable, Hashable {
    /// Attempts made in process before a job goes to the retry topic. Default: 3.
    public var inProcessAttempts: Int
    /// Attempts in all before the result is `failed`. Default: 12 (with the other defaults, 80 to 160 seconds of retrying).
    public var maxAttempts: Int
    /// Default: 100 ms.
    public var baseDelayMilliseconds: Int
    /// Default: 60 000 ms.
    public var maxDelayMilliseconds: Int
    /// After an attempt APNs may have taken without answering (written, then a timeout or a
    /// lost connection): send it again (a device may then show it twice, unless the job sets
    /// `collapse_id`), or give up with `failed`. Default: `.retry`.
    public var possiblyDelivered: PossiblyDelivered

    public enum PossiblyDelivered: String, Sendable, Hashable, CaseIterable {
        case retry
        case giveUp = "give-up"
    }

    public init(
        inProcessAttempts: Int = 3, maxAttempts: Int = 12, baseDelayMilliseconds: Int = 100, maxDelayMilliseconds: Int = 60_000,
        possiblyDelivered: PossiblyDelivered = .retry
    ) {
        self.inProcessAttempts = inProcessAttempts
        self.maxAttempts = maxAttempts
        self.baseDelayMilliseconds = baseDelayMilliseconds
        self.maxDelayMilliseconds = maxDelayMilliseconds
        self.possiblyDelivered = possiblyDelivered
    }

    /// The delay before attempt `attempt + 1`: base·2^(attempt-1), capped, with "full jitter"
    /// (uniform in [delay/2, delay]) so that a fleet does not retry in lockstep.
    public func delayMilliseconds(afterAttempt attempt: Int, jitter unit: Double) -> Int {
        let exponent = min(max(attempt - 1, 0), 30)
        let raw = min(Double(baseDelayMilliseconds) * Double(1 << exponent), Double(maxDelayMilliseconds))
        let clampedUnit = min(max(unit, 0), 1)
        return Int(raw / 2 + raw / 2 * clampedUnit)
    }

    /// The most one notification can spend in process before its result or retry record: every
    /// in-process attempt taking `requestTimeoutSeconds`, and the longest backoff between them.
    public func longestInProcessSeconds(requestTimeoutSeconds: Double) -> Double {
        let backoff = (1..<max(inProcessAttempts, 1)).reduce(0) { $0 + delayMilliseconds(afterAttempt: $1, jitter: 1) }
        return Double(inProcessAttempts) * requestTimeoutSeconds + Double(backoff) / 1000
    }
}

public struct AdminSettings: Sendable, Hashable {
    /// Default: 127.0.0.1, so metrics are not exposed beyond the host unless asked.
    public var host: String
    /// Default: 9464.
    public var port: Int
    /// `/healthz` fails once the Kafka consumer pipeline has been stalled this long (and Kafka
    /// itself takes what is published), so that the orchestrator restarts the process and its
    /// partitions move on. 0: never. Default: 300 s, or more when a notification's in-process
    /// attempts can take longer (see the configuration decoder).
    public var livenessStallSeconds: Double

    public init(host: String = "127.0.0.1", port: Int = 9464, livenessStallSeconds: Double = 300) {
        self.host = host
        self.port = port
        self.livenessStallSeconds = livenessStallSeconds
    }

    /// How long a stall lasts before `/healthz` fails; nil: never.
    public var unhealthyAfterStall: Duration? {
        livenessStallSeconds > 0 ? .milliseconds(Int64(livenessStallSeconds * 1000)) : nil
    }
}

/// The feedback worker: which dead tokens it remembers, and how often it asks the legacy
/// feedback service.
public struct FeedbackSettings: Sendable, Hashable {
    /// Seconds between polls of each app's legacy feedback service. Default: 3600.
    public var pollIntervalSeconds: Double
    /// Invalidations remembered to suppress repeats from duplicate results. Default: 1,000,000.
    public var ledgerCapacity: Int

    public init(pollIntervalSeconds: Double = 3600, ledgerCapacity: Int = 1_000_000) {
        self.pollIntervalSeconds = pollIntervalSeconds
        self.ledgerCapacity = ledgerCapacity
    }
}
