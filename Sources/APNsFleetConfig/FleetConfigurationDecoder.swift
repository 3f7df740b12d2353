import APNsCore
import Configuration

/// Turns configuration keys into a validated `FleetConfiguration`. Every problem names its key.
struct FleetConfigurationDecoder {
    let reader: ConfigReader

    func decode() throws(ConfigurationError) -> FleetConfiguration {
        var configuration = FleetConfiguration()
        configuration.kafka = try kafka()
        configuration.topics = try topics(defaults: configuration.topics)
        let names = try stringList("apps")
        var seen = Set<String>()
        var variableNames: [String: String] = [:]
        for appName in names {
            guard !appName.isEmpty, appName.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
                throw ConfigurationError(key: "apps", "app name \"\(appName.prefix(40))\" may only use letters, digits, - and _")
            }
            guard seen.insert(appName).inserted else {
                throw ConfigurationError(key: "apps", "app \(appName) is listed twice")
            }
            let variableName = ConfigurationLoader.environmentName(for: "app.\(appName)")
            if let other = variableNames.updateValue(appName, forKey: variableName) {
                throw ConfigurationError(key: "apps", "apps \(other) and \(appName) would share environment variables (\(variableName)_*); rename one")
            }
        }
        // Distinct prefixes can still meet: apps foo and foo-private both own
        // APNS_FLEET_APP_FOO_PRIVATE_KEY_FILE (foo's private-key-file, foo-private's key-file).
        let appKeySuffixes = ConfigurationKeys.all.compactMap { key -> String? in
            guard key.name.hasPrefix("app.<name>.") else { return nil }
            return String(key.name.dropFirst("app.<name>.".count))
        }
        var owners: [String: String] = [:]
        for appName in names {
            for suffix in appKeySuffixes {
                let variable = ConfigurationLoader.environmentName(for: "app.\(appName).\(suffix)")
                if let other = owners.updateValue("app.\(appName).\(suffix)", forKey: variable), !other.hasPrefix("app.\(appName).") {
                    throw ConfigurationError(key: "apps", "\(other) and app.\(appName).\(suffix) would both be read from \(variable); rename one of the apps")
                }
            }
        }
        for appName in names {
            configuration.apps.append(try app(appName))
        }
        try checkTopicRouting(configuration.apps)
        configuration.defaultApp = try string("default-app")
        if let defaultApp = configuration.defaultApp, !seen.contains(defaultApp) {
            throw ConfigurationError(key: "default-app", "names app \(defaultApp), which is not in apps")
        }
        configuration.worker = WorkerSettings(
            id: try string("worker.id"),
            maxInFlight: try int("worker.max-in-flight", default: 0, range: 0...1_000_000),
            maxTokensPerJob: try int("worker.max-tokens-per-job", default: 1000, range: 1...JobDecoder.Limits.tokensThatFit),
            drainTimeoutSeconds: try double("worker.drain-timeout-seconds", default: 25, range: 0...3600),
            requestTimeoutSeconds: try double("worker.request-timeout-seconds", default: 10, range: 0.1...600)
        )
        let maxAttempts = try int("retry.max-attempts", default: 12, range: 1...1000)
        configuration.retry = RetryPolicy(
            // Unset, it follows a lower max-attempts down: `retry.max-attempts: 1` (no retries) must
            // not be refused over a default the user never wrote.
            inProcessAttempts: try int("retry.in-process-attempts", default: min(3, maxAttempts), range: 1...100),
            maxAttempts: maxAttempts,
            baseDelayMilliseconds: try int("retry.base-delay-ms", default: 100, range: 1...3_600_000),
            maxDelayMilliseconds: try int("retry.max-delay-ms", default: 60_000, range: 1...86_400_000),
            possiblyDelivered: try choice("retry.possibly-delivered", default: .retry)
        )
        // A binary notification counts as delivered only after its quiet period; a request
        // timeout that comes first would call every one unanswered and send it again.
        let timeoutMilliseconds = Int(configuration.worker.requestTimeoutSeconds * 1000)
        for app in configuration.apps where app.transport == .binary && app.legacyQuietPeriodMilliseconds + 1000 > timeoutMilliseconds {
            throw ConfigurationError(
                key: "app.\(app.name).legacy-quiet-period-ms",
                "is \(app.legacyQuietPeriodMilliseconds) ms; it must be at least 1 s below worker.request-timeout-seconds (\(timeoutMilliseconds) ms), or every binary notification times out before it counts as delivered and is sent again"
            )
        }
        // A revocation drains inside librdkafka's poll call; a drain that outlasts
        // max.poll.interval.ms gets the worker dropped from the group mid-drain, and the offsets
        // it then stores are never committed.
        var maxPollMilliseconds = 300_000
        if let text = configuration.kafka.properties["max.poll.interval.ms"] {
            guard let value = Int(text), value > 0 else {
                throw ConfigurationError(key: "kafka.properties", "max.poll.interval.ms is \"\(text.prefix(40))\"; it must be a positive whole number of milliseconds")
            }
            maxPollMilliseconds = value
        }
        // librdkafka takes 0 as "never commit on a timer": stored offsets would then be
        // committed only at a rebalance or a clean stop, and a crash would redo hours of jobs.
        // A crash redoes up to one interval of jobs, so five minutes at most.
        if let text = configuration.kafka.properties["auto.commit.interval.ms"], !(1...300_000).contains(Int(text) ?? 0) {
            throw ConfigurationError(
                key: "kafka.properties",
                "auto.commit.interval.ms is \"\(text.prefix(40))\"; it must be 1 to 300000 milliseconds (0 would stop librdkafka committing stored offsets except at a rebalance or a clean stop, and a crash redoes up to one interval of jobs)"
            )
        }
        if Int(configuration.worker.drainTimeoutSeconds * 1000) + 30_000 > maxPollMilliseconds {
            throw ConfigurationError(
                key: "worker.drain-timeout-seconds",
                "is \(configuration.worker.drainTimeoutSeconds) s; it must stay at least 30 s below Kafka's max.poll.interval.ms (\(maxPollMilliseconds) ms), or a revocation's drain outlasts the poll interval and the worker is dropped from the group mid-drain"
            )
        }
        if configuration.retry.inProcessAttempts > configuration.retry.maxAttempts {
            throw ConfigurationError(key: "retry.in-process-attempts", "is larger than retry.max-attempts (\(configuration.retry.maxAttempts))")
        }
        if configuration.retry.baseDelayMilliseconds > configuration.retry.maxDelayMilliseconds {
            // Blame the key that was set: a lone max-delay below the default base is its own mistake.
            if try string("retry.base-delay-ms") == nil {
                throw ConfigurationError(
                    key: "retry.max-delay-ms",
                    "is smaller than retry.base-delay-ms (\(configuration.retry.baseDelayMilliseconds), the default); lower that too"
                )
            }
            throw ConfigurationError(
                key: "retry.base-delay-ms",
                "is larger than retry.max-delay-ms (\(configuration.retry.maxDelayMilliseconds)); every delay would be the maximum"
            )
        }
        // A stall is reported after a minute at the earliest. Records legitimately take as long as
        // a revocation's drain, or a notification's in-process attempts when APNs does not answer:
        // a limit below those would restart workers that are fine. The default grows with them.
        let inProcess = configuration.retry.longestInProcessSeconds(requestTimeoutSeconds: configuration.worker.requestTimeoutSeconds)
        let shortest = max(60, configuration.worker.drainTimeoutSeconds + 30, inProcess + 60).rounded(.up)
        let liveness = try double("admin.liveness-stall-seconds", default: max(300, shortest), range: 0...86_400)
        if liveness > 0, liveness < shortest {
            throw ConfigurationError(
                key: "admin.liveness-stall-seconds",
                "is \(liveness) s; it must be 0 (never) or at least \(Int(shortest)) s: 60, 30 more than worker.drain-timeout-seconds, and 60 more than a notification's in-process attempts can take (retry.in-process-attempts × worker.request-timeout-seconds, plus backoff: \(Int(inProcess.rounded(.up))) s), or workers that are only waiting would be restarted"
            )
        }
        configuration.admin = AdminSettings(
            host: try name("admin.host", default: "127.0.0.1"),
            // 0 takes a free port, logged at start: for tests and several workers on one host.
            port: try int("admin.port", default: 9464, range: 0...65535),
            livenessStallSeconds: liveness
        )
        configuration.feedback = FeedbackSettings(
            pollIntervalSeconds: try double("feedback.poll-interval-seconds", default: 3600, range: 1...604_800),
            ledgerCapacity: try int("feedback.ledger-capacity", default: 1_000_000, range: 1_000...100_000_000)
        )
        return configuration
    }

    // MARK: - Sections

    private func kafka() throws(ConfigurationError) -> KafkaSettings {
        var kafka = KafkaSettings()
        kafka.bootstrapServers = try name("kafka.bootstrap-servers", default: kafka.bootstrapServers)
        kafka.groupID = try name("kafka.group-id", default: kafka.groupID)
        kafka.feedbackGroupID = try name("kafka.feedback-group-id", default: kafka.feedbackGroupID)
        kafka.securityProtocol = try choice("kafka.security-protocol", default: .plaintext)
        if let problem = KafkaSettings.bootstrapServersProblem(kafka.bootstrapServers, securityProtocol: kafka.securityProtocol) {
            throw ConfigurationError(key: "kafka.bootstrap-servers", problem)
        }
        kafka.saslMechanism = try optionalChoice("kafka.sasl.mechanism")
        kafka.saslUsername = try string("kafka.sasl.username")
        kafka.saslPassword = try secretOrFile("kafka.sasl.password")
        if kafka.securityProtocol.usesSASL {
            guard kafka.saslMechanism != nil else {
                throw ConfigurationError(key: "kafka.sasl.mechanism", "is required with security protocol \(kafka.securityProtocol.rawValue)")
            }
            guard kafka.saslUsername != nil, kafka.saslPassword != nil else {
                throw ConfigurationError(key: "kafka.sasl.username", "SASL needs kafka.sasl.username and a password")
            }
        }
        kafka.sslCAFile = try string("kafka.ssl.ca-file")
        kafka.sslCertificateFile = try string("kafka.ssl.certificate-file")
        kafka.sslKeyFile = try string("kafka.ssl.key-file")
        kafka.sslKeyPassword = try secretOrFile("kafka.ssl.key-password")
        for (index, entry) in try stringList("kafka.properties").enumerated() {
            // The entry is not echoed: a mistyped one may hold a password.
            guard let equals = entry.firstIndex(of: "="), equals != entry.startIndex else {
                throw ConfigurationError(key: "kafka.properties", "entries are name=value; entry \(index + 1) has no '=' or no name before it")
            }
            let name = String(entry[..<equals])
            if let reason = KafkaSettings.managedProperties[name] {
                throw ConfigurationError(key: "kafka.properties", "\(name) cannot be set here: \(reason)")
            }
            kafka.properties[name] = String(entry[entry.index(after: equals)...])
        }
        return kafka
    }

    private func app(_ appName: String) throws(ConfigurationError) -> AppConfiguration {
        let prefix = "app.\(appName)."
        func key(_ suffix: String) -> String { prefix + suffix }

        let authentication: AppConfiguration.Authentication
        switch try string(key("auth")) ?? "token" {
        case "token":
            try refuseIgnored(["certificate-file", "private-key-file", "pkcs12-file", "certificate-password", "certificate-password-file"].map(key), because: "\(key("auth")) is token")
            guard let keyFile = try string(key("key-file")) else {
                throw ConfigurationError(key: key("key-file"), "is required for token auth (the .p8 signing key)")
            }
            let keyID = try string(key("key-id")) ?? ""
            let teamID = try string(key("team-id")) ?? ""
            try checkAppleID(keyID, key: key("key-id"))
            try checkAppleID(teamID, key: key("team-id"))
            authentication = .token(keyFile: keyFile, keyID: keyID, teamID: teamID)
        case "certificate":
            try refuseIgnored(["key-file", "key-id", "team-id"].map(key), because: "\(key("auth")) is certificate")
            let password = try secretOrFile(key("certificate-password"))
            if let bundle = try string(key("pkcs12-file")) {
                try refuseIgnored(["certificate-file", "private-key-file"].map(key), because: "\(key("pkcs12-file")) is set; give either the PKCS#12 bundle or the PEM files")
                authentication = .certificate(.pkcs12(file: bundle, password: password))
            } else if let certificate = try string(key("certificate-file")) {
                guard let privateKey = try string(key("private-key-file")) else {
                    throw ConfigurationError(key: key("private-key-file"), "is required with \(key("certificate-file"))")
                }
                authentication = .certificate(.pem(certificateFile: certificate, privateKeyFile: privateKey, password: password))
            } else {
                throw ConfigurationError(key: key("certificate-file"), "certificate auth needs certificate-file and private-key-file, or pkcs12-file")
            }
        case let other:
            throw ConfigurationError(key: key("auth"), "is \"\(other.prefix(40))\"; expected token or certificate")
        }

        var defaults = JobDefaults()
        do {
            if let topic = try string(key("topic")) { defaults.topic = try JobRules.topic(topic) }
            if let pushType = try string(key("push-type")) { defaults.pushType = try JobRules.pushType(pushType) }
            if let priority = try string(key("priority")) { defaults.priority = try JobRules.priority(Int64(priority), literal: priority) }
        } catch let rejection as JobRejection {
            throw ConfigurationError(key: prefix + (rejection.field?.replacingUnderscores ?? ""), rejection.message)
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError(key: prefix, "\(error)")
        }

        let transport: AppConfiguration.TransportProtocol = try choice(key("protocol"), default: .http2)
        if transport == .binary, case .token = authentication {
            throw ConfigurationError(key: key("protocol"), "the binary interface needs certificate auth (set \(key("auth")) to certificate)")
        }
        let environmentName = try string(key("environment")) ?? "production"
        // A binary app sends through its legacy gateway: a custom host and port, taken for the
        // gateway's, would be ignored.
        if transport == .binary, environmentName == "custom" {
            throw ConfigurationError(
                key: key("environment"),
                "is custom, which protocol binary ignores: it sends through \(key("legacy-gateway")); leave \(key("environment")), \(key("host")) and \(key("port")) out"
            )
        }
        if environmentName == "production" || environmentName == "sandbox" {
            // Without `environment: custom` these would be ignored and the jobs would go to
            // Apple: a simulator's host and port left in a configuration must not do that.
            try refuseIgnored([key("host"), key("port")], because: "\(key("environment")) is \(environmentName); set it to custom to send to this host")
        }
        let endpoint: AppConfiguration.Endpoint
        switch environmentName {
        case "production":
            endpoint = .production
            defaults.environment = .production
        case "sandbox":
            endpoint = .sandbox
            defaults.environment = .sandbox
        case "custom":
            guard let host = try string(key("host")) else {
                throw ConfigurationError(key: key("host"), "is required with environment custom")
            }
            endpoint = .custom(host: host, port: try int(key("port"), default: 443, range: 1...65535), caFile: try string(key("ca-file")))
        default:
            throw ConfigurationError(key: key("environment"), "is \"\(environmentName.prefix(40))\"; expected production, sandbox or custom")
        }

        let legacyTLS = try bool(key("legacy-tls"), default: true)
        let legacyCA = try string(key("ca-file"))
        // No defaults: Apple ended its binary interface and feedback service (gateway and
        // feedback.push.apple.com) on 31 March 2021, so a default would only poll, or send to,
        // hosts that no longer serve them. They are used where set (the simulator, a gateway of
        // your own).
        let gateway = try hostPort(key("legacy-gateway"), tls: legacyTLS, caFile: legacyCA)
        let feedback = try hostPort(key("legacy-feedback"), tls: legacyTLS, caFile: legacyCA)
        if transport == .binary, gateway == nil {
            throw ConfigurationError(
                key: key("legacy-gateway"),
                "is required for protocol binary (Apple's own binary gateway closed on 31 March 2021; use protocol http2 for Apple)"
            )
        }
        // Left from a binary set-up, or meant for a simulator, these would be ignored while the
        // jobs go to Apple over HTTP/2: refused, as host and port are above.
        if transport == .http2 {
            try refuseIgnored(
                ["legacy-gateway", "legacy-format", "legacy-quiet-period-ms", "legacy-error-reconnects-per-second"].map(key),
                because: "\(key("protocol")) is http2 (only the binary interface sends through the legacy gateway)"
            )
        }
        if gateway == nil, feedback == nil {
            try refuseIgnored([key("legacy-tls")], because: "neither \(key("legacy-gateway")) nor \(key("legacy-feedback")) is set")
            if case .custom = endpoint {} else {
                try refuseIgnored(
                    [key("ca-file")],
                    because: "it applies to environment custom and the legacy endpoints, and \(key("environment")) is \(environmentName) with no legacy endpoint"
                )
            }
        }

        let legacyFormat: LegacyNotification.Format
        switch try string(key("legacy-format")) ?? "enhanced" {
        case "enhanced": legacyFormat = .enhanced
        case "simple": legacyFormat = .simple
        case let other: throw ConfigurationError(key: key("legacy-format"), "must be enhanced or simple, got \"\(other.prefix(40))\"")
        }
        var app = AppConfiguration(
            name: appName,
            authentication: authentication,
            defaults: defaults,
            topics: try routedTopics(key("topics")),
            endpoint: endpoint,
            environments: try environments(key("environments"), endpoint: endpoint, transport: transport, environmentKey: key("environment")),
            connections: try int(key("connections"), default: 2, range: 1...64),
            transport: transport,
            legacyGateway: gateway,
            legacyFeedback: feedback
        )
        app.legacyFormat = legacyFormat
        app.legacyQuietPeriodMilliseconds = try int(key("legacy-quiet-period-ms"), default: 1000, range: 10...60_000)
        app.legacyErrorReconnectsPerSecond = try int(key("legacy-error-reconnects-per-second"), default: 5, range: 1...1000)
        return app
    }

    /// `app.<name>.environments`: the Apple environments the app's jobs may use, each one a pool
    /// of its own. Nil (the app's own environment alone) when unset.
    private func environments(
        _ key: String, endpoint: AppConfiguration.Endpoint, transport: AppConfiguration.TransportProtocol, environmentKey: String
    ) throws(ConfigurationError) -> [APNsEnvironment]? {
        let names = try stringList(key)
        guard !names.isEmpty else { return nil }
        guard transport == .http2 else { throw ConfigurationError(key: key, "applies to protocol http2 only") }
        let own: APNsEnvironment
        switch endpoint {
        case .production: own = .production
        case .sandbox: own = .sandbox
        case .custom: throw ConfigurationError(key: key, "does not apply to environment custom: one pool serves jobs of both environments")
        }
        var environments: [APNsEnvironment] = []
        for name in names {
            guard let environment = APNsEnvironment(rawValue: name) else {
                throw ConfigurationError(key: key, "lists \"\(name.prefix(40))\"; expected production and/or sandbox")
            }
            if !environments.contains(environment) { environments.append(environment) }
        }
        guard environments.contains(own) else {
            throw ConfigurationError(key: key, "must include \(own.rawValue), the app's \(environmentKey)")
        }
        return environments
    }

    private func checkAppleID(_ value: String, key: String) throws(ConfigurationError) {
        guard ProviderTokenSigner.isWellFormedIdentifier(value) else {
            throw ConfigurationError(key: key, value.isEmpty ? "is required for token auth" : "must be 10 letters or digits, got \(value.count) characters")
        }
    }

    // MARK: - Typed access that tells "missing" from "wrong"

    private func lookup<T>(_ key: String, _ read: (ConfigKey) throws -> T) throws(ConfigurationError) -> T? {
        do {
            return try read(ConfigKey(key))
        } catch {
            // swift-configuration's error type is not public; Package.swift holds it to 1.4.x,
            // and every test that loads a configuration would fail if this text changed.
            if "\(error)".hasPrefix("Missing required config value") { return nil }
            throw ConfigurationError(key: key, "has a value of the wrong type")
        }
    }

    /// Any scalar as text: a YAML or JSON file may give `port: 8443` as a number, while the
    /// environment gives "8443"; the typed accessors below parse both the same way.
    private func string(_ key: String) throws(ConfigurationError) -> String? {
        let reader = self.reader
        let value = try lookup(key) { configKey in
            if let text = try? reader.requiredString(forKey: configKey) { return text }
            if let number = try? reader.requiredInt(forKey: configKey) { return String(number) }
            if let number = try? reader.requiredDouble(forKey: configKey) { return String(number) }
            if let flag = try? reader.requiredBool(forKey: configKey) { return String(flag) }
            return try reader.requiredString(forKey: configKey)
        }
        guard let value else { return nil }
        let trimmed = value.trimmingSpaces
        return trimmed.isEmpty ? nil : trimmed
    }

    private func name(_ key: String, default defaultValue: String) throws(ConfigurationError) -> String {
        let value = try string(key) ?? defaultValue
        guard !value.contains(where: { $0.isWhitespace || $0.asciiValue.map { $0 < 0x20 } == true }) else {
            throw ConfigurationError(key: key, "must not contain spaces or control characters")
        }
        return value
    }

    /// A key the chosen mode does not read is an error rather than silently ignored.
    private func refuseIgnored(_ keys: [String], because reason: String) throws(ConfigurationError) {
        for key in keys where try string(key) != nil {
            throw ConfigurationError(key: key, "is set but not used: \(reason)")
        }
    }

    /// `app.<name>.topics`: each entry an APNs topic as a job's `topic` would be checked.
    private func routedTopics(_ key: String) throws(ConfigurationError) -> [String] {
        let topics = try stringList(key)
        for (index, topic) in topics.enumerated() {
            do {
                _ = try JobRules.topic(topic)
            } catch {
                throw ConfigurationError(key: key, "entry \(index + 1): \(error.message)")
            }
        }
        return topics
    }

    /// A topic listed in one app's `topics` routes jobs that name no app there; if another app
    /// lists it too, or has it as its default `topic`, which app gets the job would depend on
    /// the order of `apps`. (Two apps may share a default topic: a production and a sandbox
    /// credential set for one bundle; their jobs name the app, or go to `default-app` if it is one of
    /// them, see `FleetConfiguration.appIndex(for:)`. An app listing its own default topic again
    /// claims nothing more.)
    private func checkTopicRouting(_ apps: [AppConfiguration]) throws(ConfigurationError) {
        for app in apps {
            for topic in app.topics where topic != app.defaults.topic {
                if let other = apps.first(where: { $0.name != app.name && ($0.topics.contains(topic) || $0.defaults.topic == topic) }) {
                    throw ConfigurationError(
                        key: "app.\(app.name).topics",
                        "routes topic \(topic) to app \(app.name), but app \(other.name) claims it too; a topic may route to one app only"
                    )
                }
            }
        }
    }

    /// The five topics: each a name Kafka accepts, and no two the same. A shared name loops:
    /// `topics.dlq: apns.jobs` would read every DLQ copy back as a job, reject it again, and
    /// publish it again, forever.
    private func topics(defaults: TopicNames) throws(ConfigurationError) -> TopicNames {
        var owners: [String: String] = [:]
        func topic(_ key: String, default defaultValue: String) throws(ConfigurationError) -> String {
            let topic = try topicName(key, default: defaultValue)
            if let other = owners.updateValue(key, forKey: topic) {
                throw ConfigurationError(key: key, "is \(topic), the same topic as \(other); each of the five topics must be its own")
            }
            return topic
        }
        return TopicNames(
            jobs: try topic("topics.jobs", default: defaults.jobs),
            retry: try topic("topics.retry", default: defaults.retry),
            deadLetter: try topic("topics.dlq", default: defaults.deadLetter),
            results: try topic("topics.results", default: defaults.results),
            tokenEvents: try topic("topics.token-events", default: defaults.tokenEvents)
        )
    }

    /// A Kafka topic name (``TopicNames/problem(with:)``), checked here so that the error names
    /// the key rather than surfacing from librdkafka.
    private func topicName(_ key: String, default defaultValue: String) throws(ConfigurationError) -> String {
        let value = try name(key, default: defaultValue)
        if let problem = TopicNames.problem(with: value) {
            throw ConfigurationError(key: key, "is \"\(value.prefix(60))\"; \(problem)")
        }
        return value
    }

    private func secret(_ key: String) throws(ConfigurationError) -> Secret? {
        guard let value = try lookup(key, { try reader.requiredString(forKey: $0, isSecret: true) }) else { return nil }
        return value.isEmpty ? nil : Secret(value)
    }

    /// A secret given as `key`, or read from the file that `key-file` names (never both).
    private func secretOrFile(_ key: String) throws(ConfigurationError) -> Secret? {
        let value = try secret(key)
        let fileKey = key + "-file"
        guard let file = try string(fileKey) else { return value }
        guard value == nil else { throw ConfigurationError(key: fileKey, "give \(key) or \(fileKey), not both") }
        return try SecretFile.read(file, key: fileKey)
    }

    private func stringList(_ key: String) throws(ConfigurationError) -> [String] {
        let values: [String]
        do {
            values = try lookup(key, { try reader.requiredStringArray(forKey: $0) }) ?? []
        } catch {
            // A single value where a list belongs (`apps: example`) is the usual cause.
            let type = UnknownKeys.catalogueType(of: key) ?? "list"
            throw ConfigurationError(key: key, "must be a \(type): [a, b] in YAML or JSON, a, b (comma-separated) in a variable or --set")
        }
        return values.map(\.trimmingSpaces).filter { !$0.isEmpty }
    }

    private func int(_ key: String, default defaultValue: Int, range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
        guard let text = try string(key) else { return defaultValue }
        guard let value = Int(text) else { throw ConfigurationError(key: key, "must be an integer, got \"\(text.prefix(40))\"") }
        guard range.contains(value) else {
            throw ConfigurationError(key: key, "is \(value); it must be between \(range.lowerBound) and \(range.upperBound)")
        }
        return value
    }

    private func double(_ key: String, default defaultValue: Double, range: ClosedRange<Double>) throws(ConfigurationError) -> Double {
        guard let text = try string(key) else { return defaultValue }
        guard let value = Double(text), value.isFinite else { throw ConfigurationError(key: key, "must be a number, got \"\(text.prefix(40))\"") }
        guard range.contains(value) else {
            throw ConfigurationError(key: key, "is \(value); it must be between \(range.lowerBound) and \(range.upperBound)")
        }
        return value
    }

    private func bool(_ key: String, default defaultValue: Bool) throws(ConfigurationError) -> Bool {
        guard let text = try string(key) else { return defaultValue }
        switch text.lowercased() {
        case "true", "yes", "1", "on": return true
        case "false", "no", "0", "off": return false
        default: throw ConfigurationError(key: key, "must be true or false, got \"\(text.prefix(40))\"")
        }
    }

    private func choice<T: RawRepresentable & CaseIterable>(_ key: String, default defaultValue: T) throws(ConfigurationError) -> T where T.RawValue == String {
        try optionalChoice(key) ?? defaultValue
    }

    private func optionalChoice<T: RawRepresentable & CaseIterable>(_ key: String) throws(ConfigurationError) -> T? where T.RawValue == String {
        guard let text = try string(key) else { return nil }
        guard let value = T(rawValue: text) else {
            let options = T.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigurationError(key: key, "is \"\(text.prefix(40))\"; expected one of \(options)")
        }
        return value
    }

    /// `host:port`, or `[address]:port` for an IPv6 address (whose colons would be ambiguous).
    private func hostPort(_ key: String, tls: Bool, caFile: String?) throws(ConfigurationError) -> LegacyEndpoint? {
        guard let text = try string(key) else { return nil }
        let problem = ConfigurationError(key: key, "must be host:port, or [IPv6 address]:port, got \"\(text.prefix(60))\"")
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (1...65535).contains(port) else {
            throw problem
        }
        var host = text[..<colon]
        if host.first == "[" {
            guard host.count > 2, host.last == "]" else { throw problem }
            host = host.dropFirst().dropLast()
        } else if host.contains(":") {
            throw problem
        }
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace || $0 == "[" || $0 == "]" || $0 == "/" }) else { throw problem }
        return LegacyEndpoint(host: String(host), port: port, tls: tls, caFile: caFile)
    }
}

extension String {
    var trimmingSpaces: String {
        var slice = Substring(self)
        while let first = slice.first, first.isWhitespace { slice.removeFirst() }
        while let last = slice.last, last.isWhitespace { slice.removeLast() }
        return String(slice)
    }

    fileprivate var replacingUnderscores: String {
        String(map { $0 == "_" ? "-" : $0 })
    }
}
