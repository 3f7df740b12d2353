import APNsCore
import APNsFleetConfig
import Configuration
import FleetTestSupport
import Foundation
import Synchronization
import Testing

private func temporaryFile(_ name: String, _ contents: String, mode: Int = 0o600) throws -> String {
    let directory = temporaryTestPath("apns-fleet-config")
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let path = (directory as NSString).appendingPathComponent(name)
    try Data(contents.utf8).write(to: URL(fileURLWithPath: path))
    try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
    return path
}

private let yaml = """
    kafka:
      bootstrap-servers: broker-1:9092,broker-2:9092
      properties: [linger.ms=5, batch.size=1000000]
    topics:
      results: analytics.apns-results
    apps: [example, legacy]
    app:
      example:
        key-file: /secrets/AuthKey.p8
        key-id: ABC123DEFG
        team-id: DEF123GHIJ
        topic: com.example.app
        topics: [com.example.app, com.example.app.voip]
        environment: sandbox
        environments: [sandbox, production]
        connections: 4
      legacy:
        auth: certificate
        certificate-file: /secrets/legacy.pem
        private-key-file: /secrets/legacy.key
        protocol: binary
        legacy-gateway: 127.0.0.1:2295
        legacy-feedback: 127.0.0.1:2296
        legacy-tls: false
        legacy-format: simple
        legacy-quiet-period-ms: 250
        legacy-error-reconnects-per-second: 40
    worker:
      max-in-flight: 5000
    retry:
      max-attempts: 5
    """

@Suite("Configuration loading")
struct ConfigurationLoaderTests {
    @Test("no file, no environment: docs/design.md's defaults")
    func defaults() async throws {
        let configuration = try await ConfigurationLoader().load()
        #expect(configuration.kafka.bootstrapServers == "127.0.0.1:9092")
        #expect(configuration.topics.all == ["apns.jobs", "apns.jobs.retry", "apns.jobs.dlq", "apns.results", "apns.token-events"])
        #expect(configuration.apps.isEmpty)
        #expect(configuration.admin.host == "127.0.0.1")
        #expect(configuration.retry.inProcessAttempts == 3)
        #expect(configuration.retry.possiblyDelivered == .retry)
        let cautious = try await ConfigurationLoader(environment: ["APNS_FLEET_RETRY_POSSIBLY_DELIVERED": "give-up"]).load()
        #expect(cautious.retry.possiblyDelivered == .giveUp)
    }

    @Test("a YAML file fills every section")
    func yamlFile() async throws {
        let path = try temporaryFile("fleet.yaml", yaml)
        let configuration = try await ConfigurationLoader(filePath: path).load()
        #expect(configuration.kafka.bootstrapServers == "broker-1:9092,broker-2:9092")
        #expect(configuration.kafka.properties == ["linger.ms": "5", "batch.size": "1000000"])
        #expect(configuration.topics.results == "analytics.apns-results")
        #expect(configuration.apps.map(\.name) == ["example", "legacy"])
        let example = try #require(configuration.app(named: "example"))
        guard case .token(let keyFile, let keyID, let teamID) = example.authentication else {
            Issue.record("expected token auth")
            return
        }
        #expect((keyFile, keyID, teamID) == ("/secrets/AuthKey.p8", "ABC123DEFG", "DEF123GHIJ"))
        #expect(example.endpoint == .sandbox)
        #expect(example.defaults.environment == .sandbox)
        #expect(example.environments == [.sandbox, .production])
        #expect(example.connections == 4)
        #expect(example.topics == ["com.example.app", "com.example.app.voip"])
        let legacy = try #require(configuration.app(named: "legacy"))
        #expect(legacy.endpoint == .production)
        #expect(legacy.transport == .binary)
        #expect(legacy.legacyFormat == .simple && legacy.legacyQuietPeriodMilliseconds == 250)
        #expect(legacy.legacyErrorReconnectsPerSecond == 40 && example.legacyErrorReconnectsPerSecond == 5)
        #expect(example.legacyFormat == .enhanced && example.legacyQuietPeriodMilliseconds == 1000)
        #expect(example.legacyFeedback == nil, "a token app gets no legacy endpoint by default")
        #expect(legacy.legacyGateway == LegacyEndpoint(host: "127.0.0.1", port: 2295, tls: false))
        #expect(configuration.worker.maxInFlight == 5000)
        #expect(configuration.retry.maxAttempts == 5)
    }

    @Test("retries turned off with retry.max-attempts alone: the unset in-process attempts follow it down")
    func maxAttemptsAloneLowersInProcessAttempts() async throws {
        for (maxAttempts, inProcess) in [(1, 1), (2, 2), (3, 3), (12, 3)] {
            let configuration = try await ConfigurationLoader(environment: ["APNS_FLEET_RETRY_MAX_ATTEMPTS": "\(maxAttempts)"]).load()
            #expect(configuration.retry.maxAttempts == maxAttempts)
            #expect(configuration.retry.inProcessAttempts == inProcess, "max-attempts \(maxAttempts)")
        }
        // Set both, the user's own in-process attempts still must fit.
        let error = await #expect(throws: ConfigurationError.self) {
            try await ConfigurationLoader(environment: ["APNS_FLEET_RETRY_MAX_ATTEMPTS": "1", "APNS_FLEET_RETRY_IN_PROCESS_ATTEMPTS": "2"]).load()
        }
        #expect(error?.description == "configuration key 'retry.in-process-attempts' (from APNS_FLEET_RETRY_IN_PROCESS_ATTEMPTS): is larger than retry.max-attempts (1)")
    }

    @Test("a legacy endpoint is host:port, or [IPv6 address]:port without the brackets in the host")
    func legacyEndpoints() async throws {
        let app = ["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ"]
        let named = try await ConfigurationLoader(environment: app.merging(["APNS_FLEET_APP_A_LEGACY_FEEDBACK": "feedback.internal:2196"]) { $1 }).load()
        #expect(named.apps.first?.legacyFeedback?.host == "feedback.internal")
        #expect(named.apps.first?.legacyFeedback?.port == 2196)
        let v6 = try await ConfigurationLoader(environment: app.merging(["APNS_FLEET_APP_A_LEGACY_FEEDBACK": "[::1]:2296", "APNS_FLEET_APP_A_LEGACY_TLS": "false"]) { $1 }).load()
        #expect(v6.apps.first?.legacyFeedback?.host == "::1")
        #expect(v6.apps.first?.legacyFeedback?.port == 2296 && v6.apps.first?.legacyFeedback?.tls == false)
    }

    @Test("flags win over the environment, which wins over the file")
    func precedence() async throws {
        let path = try temporaryFile("fleet.yaml", yaml)
        let environment = [
            "APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "from-env:9092",
            "APNS_FLEET_WORKER_MAX_IN_FLIGHT": "7",
            "APNS_FLEET_APP_EXAMPLE_CONNECTIONS": "8",
            "UNPREFIXED_IS_IGNORED": "x",
        ]
        let fromEnvironment = try await ConfigurationLoader(filePath: path, environment: environment).load()
        #expect(fromEnvironment.kafka.bootstrapServers == "from-env:9092")
        #expect(fromEnvironment.worker.maxInFlight == 7)
        #expect(fromEnvironment.app(named: "example")?.connections == 8)
        let fromFlags = try await ConfigurationLoader(
            filePath: path, environment: environment, overrides: ["kafka.bootstrap-servers=from-flag:9092"]
        ).load()
        #expect(fromFlags.kafka.bootstrapServers == "from-flag:9092")
        #expect(fromFlags.worker.maxInFlight == 7)
    }

    @Test("an empty variable or --set value counts as unset: the file's value applies, not the default")
    func emptyValuesAreUnset() async throws {
        let path = try temporaryFile("fleet.yaml", yaml)
        // Compose writes an undefined ${VAR} as "": the sandbox app must not fall back to production.
        let configuration = try await ConfigurationLoader(
            filePath: path,
            environment: ["APNS_FLEET_APP_EXAMPLE_ENVIRONMENT": "", "APNS_FLEET_APP_EXAMPLE_TOPIC": "  ", "APNS_FLEET_TOPICS_RESULTS": ""],
            overrides: ["app.example.key-id="]
        ).load()
        let example = try #require(configuration.app(named: "example"))
        #expect(example.defaults.environment == .sandbox)
        #expect(example.defaults.topic == "com.example.app")
        #expect(configuration.topics.results == "analytics.apns-results")
        guard case .token(_, let keyID, _) = example.authentication else {
            Issue.record("token auth expected")
            return
        }
        #expect(keyID == "ABC123DEFG")
    }

    @Test("a setting given as ~ or null in YAML is an error naming it, unless a flag or variable sets it; nothing after the colon, an empty section and a quoted \"null\" are fine")
    func nullSettingInYAML() async throws {
        for (text, key) in [("worker:\n  id: ~\n", "worker.id"), ("kafka:\n  sasl:\n    password: null\n", "kafka.sasl.password"), ("worker:\n  max-in-flight: null\n", "worker.max-in-flight")] {
            let path = try temporaryFile("fleet.yaml", text)
            let error = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(filePath: path).load() }
            #expect(error?.key == key && error?.problem.contains("null") == true, "\(String(describing: error))")
        }
        let path = try temporaryFile("fleet.yaml", "worker:\n  id: \"null\"\nadmin:\n  # port: 9464\n  host:\n")
        let configuration = try await ConfigurationLoader(filePath: path).load()
        #expect(configuration.worker.id == "null")
        #expect(configuration.admin.port == 9464 && configuration.admin.host == "127.0.0.1")
        #expect(configuration.admin.unhealthyAfterStall == .seconds(300))
        #expect(try await ConfigurationLoader(environment: ["APNS_FLEET_ADMIN_LIVENESS_STALL_SECONDS": "0"]).load().admin.unhealthyAfterStall == nil)
        // Unset, the limit grows with what a notification may take in process.
        #expect(try await ConfigurationLoader(environment: ["APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS": "120"]).load().admin.unhealthyAfterStall == .seconds(421))

        // What the file leaves null is not read when a variable or a flag sets it, or when it
        // belongs to an app the deployment does not list.
        let overridden = try temporaryFile("fleet.yaml", "kafka:\n  sasl:\n    username: ~\napp:\n  staging:\n    ca-file: ~\n")
        let fromEnvironment = try await ConfigurationLoader(filePath: overridden, environment: ["APNS_FLEET_KAFKA_SASL_USERNAME": "fleet"]).load()
        #expect(fromEnvironment.kafka.saslUsername == "fleet")
        let fromFlag = try await ConfigurationLoader(filePath: overridden, overrides: ["kafka.sasl.username=flag"]).load()
        #expect(fromFlag.kafka.saslUsername == "flag")
        // An empty one counts as unset (Compose writes an undefined ${VAR} as ""), so the null stands, and is refused.
        let nullTopic = try temporaryFile("fleet.yaml", "topics:\n  jobs: null\n")
        for loader in [
            ConfigurationLoader(filePath: nullTopic, environment: ["APNS_FLEET_TOPICS_JOBS": " "]),
            ConfigurationLoader(filePath: nullTopic, overrides: ["topics.jobs="]),
        ] {
            let error = await #expect(throws: ConfigurationError.self) { try await loader.load() }
            #expect(error.map { "\($0)" }?.hasPrefix("configuration key 'topics.jobs': is null") == true, "\(error.map { "\($0)" } ?? "no error")")
        }
    }

    @Test("JSON: true for a number is an error naming the key, unless a variable sets it; null sets nothing")
    func jsonTypes() async throws {
        for (text, key, problem) in [
            (#"{"worker":{"max-in-flight":true}}"#, "worker.max-in-flight", "must be an integer, got true "),
            (#"{"retry":{"base-delay-ms":false}}"#, "retry.base-delay-ms", "must be an integer, got false "),
        ] {
            let path = try temporaryFile("fleet.json", text)
            let error = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(filePath: path).load() }
            #expect(error?.key == key && error?.problem == "\(problem)(in \(path))", "\(String(describing: error))")
        }
        let path = try temporaryFile("fleet.json", #"{"worker":{"id":null,"max-in-flight":5},"admin":null}"#)
        let configuration = try await ConfigurationLoader(filePath: path).load()
        #expect(configuration.worker.maxInFlight == 5 && configuration.worker.id == nil && configuration.admin.port == 9464)
        let overridden = try await ConfigurationLoader(
            filePath: try temporaryFile("fleet.json", #"{"worker":{"max-in-flight":true}}"#), environment: ["APNS_FLEET_WORKER_MAX_IN_FLIGHT": "9"]
        ).load()
        #expect(overridden.worker.maxInFlight == 9)
    }

    @Test(
        "bad configuration fails at start, naming the key and the problem",
        arguments: [
            (["APNS_FLEET_WORKER_MAX_IN_FLIGHT": "lots"], "configuration key 'worker.max-in-flight': must be an integer, got \"lots\""),
            (["APNS_FLEET_ADMIN_PORT": "70000"], "configuration key 'admin.port': is 70000; it must be between 0 and 65535"),
            // Shorter than a stall takes to be reported, than a revocation's drain, or than a
            // notification's in-process attempts (3 × 10 s plus 0.1 and 0.2 s by default): restarts for nothing.
            (["APNS_FLEET_ADMIN_LIVENESS_STALL_SECONDS": "30"],
             "configuration key 'admin.liveness-stall-seconds': is 30.0 s; it must be 0 (never) or at least 91 s: 60, 30 more than worker.drain-timeout-seconds, and 60 more than a notification's in-process attempts can take (retry.in-process-attempts × worker.request-timeout-seconds, plus backoff: 31 s), or workers that are only waiting would be restarted"),
            (["APNS_FLEET_ADMIN_LIVENESS_STALL_SECONDS": "100", "APNS_FLEET_WORKER_DRAIN_TIMEOUT_SECONDS": "90"],
             "configuration key 'admin.liveness-stall-seconds': is 100.0 s; it must be 0 (never) or at least 120 s: 60, 30 more than worker.drain-timeout-seconds, and 60 more than a notification's in-process attempts can take (retry.in-process-attempts × worker.request-timeout-seconds, plus backoff: 31 s), or workers that are only waiting would be restarted"),
            // Slow requests: 3 × 120 s.
            (["APNS_FLEET_ADMIN_LIVENESS_STALL_SECONDS": "300", "APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS": "120"],
             "configuration key 'admin.liveness-stall-seconds': is 300.0 s; it must be 0 (never) or at least 421 s: 60, 30 more than worker.drain-timeout-seconds, and 60 more than a notification's in-process attempts can take (retry.in-process-attempts × worker.request-timeout-seconds, plus backoff: 361 s), or workers that are only waiting would be restarted"),
            // More than a job record (512 KiB at most) can hold: a limit that could never be reached.
            (["APNS_FLEET_WORKER_MAX_TOKENS_PER_JOB": "10000"], "configuration key 'worker.max-tokens-per-job': is 10000; it must be between 1 and 7500"),
            (["APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "tls"], "configuration key 'kafka.security-protocol': is \"tls\"; expected one of plaintext, ssl, sasl_plaintext, sasl_ssl"),
            (["APNS_FLEET_RETRY_POSSIBLY_DELIVERED": "never"], "configuration key 'retry.possibly-delivered': is \"never\"; expected one of retry, give-up"),
            (["APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "sasl_ssl"], "configuration key 'kafka.sasl.mechanism': is required with security protocol sasl_ssl"),
            (["APNS_FLEET_APPS": "a"], "configuration key 'app.a.key-file': is required for token auth (the .p8 signing key)"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "short", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ"],
             "configuration key 'app.a.key-id': must be 10 letters or digits, got 5 characters"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_ENVIRONMENT": "staging"],
             "configuration key 'app.a.environment': is \"staging\"; expected production, sandbox or custom"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_PRIORITY": "7"],
             "configuration key 'app.a.priority': priority is 7; it must be 10, 5 or 1"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_ENVIRONMENTS": "sandbox"],
             "configuration key 'app.a.environments': must include production, the app's app.a.environment"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_ENVIRONMENTS": "production,staging"],
             "configuration key 'app.a.environments': lists \"staging\"; expected production and/or sandbox"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ",
              "APNS_FLEET_APP_A_ENVIRONMENT": "custom", "APNS_FLEET_APP_A_HOST": "127.0.0.1", "APNS_FLEET_APP_A_ENVIRONMENTS": "sandbox"],
             "configuration key 'app.a.environments': does not apply to environment custom: one pool serves jobs of both environments"),
            (["APNS_FLEET_APPS": "a,a"], "configuration key 'apps': app a is listed twice"),
            (["APNS_FLEET_APPS": "foo,foo-private"],
             "configuration key 'apps': app.foo.private-key-file and app.foo-private.key-file would both be read from APNS_FLEET_APP_FOO_PRIVATE_KEY_FILE; rename one of the apps"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem", "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem", "APNS_FLEET_APP_A_PROTOCOL": "binary",
              "APNS_FLEET_APP_A_LEGACY_GATEWAY": "127.0.0.1:2295", "APNS_FLEET_APP_A_ENVIRONMENT": "custom"],
             "configuration key 'app.a.environment': is custom, which protocol binary ignores: it sends through app.a.legacy-gateway; leave app.a.environment, app.a.host and app.a.port out"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem", "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem", "APNS_FLEET_APP_A_PROTOCOL": "binary"],
             "configuration key 'app.a.legacy-gateway': is required for protocol binary (Apple's own binary gateway closed on 31 March 2021; use protocol http2 for Apple)"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem", "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem",
              "APNS_FLEET_APP_A_PROTOCOL": "binary", "APNS_FLEET_APP_A_LEGACY_GATEWAY": "127.0.0.1:2295", "APNS_FLEET_APP_A_LEGACY_QUIET_PERIOD_MS": "5000",
              "APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS": "5"],
             "configuration key 'app.a.legacy-quiet-period-ms': is 5000 ms; it must be at least 1 s below worker.request-timeout-seconds (5000 ms), or every binary notification times out before it counts as delivered and is sent again"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "enable.auto.offset.store=true"],
             "configuration key 'kafka.properties': enable.auto.offset.store cannot be set here: offsets are stored only once a record's results are acknowledged (at-least-once)"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "sasl.password:hunter2"], "configuration key 'kafka.properties': entries are name=value; entry 1 has no '=' or no name before it"),
            (["APNS_FLEET_DEFAULT_APP": "ghost"], "configuration key 'default-app': names app ghost, which is not in apps"),
            (["APNS_FLEET_RETRY_IN_PROCESS_ATTEMPTS": "13"], "configuration key 'retry.in-process-attempts': is larger than retry.max-attempts (12)"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "max.poll.interval.ms=5min"],
             "configuration key 'kafka.properties': max.poll.interval.ms is \"5min\"; it must be a positive whole number of milliseconds"),
            (["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092,kafka-2:abc"],
             "configuration key 'kafka.bootstrap-servers': \"kafka-2:abc\" has port \"abc\"; it must be 1 to 65535"),
            (["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:99999"],
             "configuration key 'kafka.bootstrap-servers': \"127.0.0.1:99999\" has port \"99999\"; it must be 1 to 65535"),
            (["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": ",,"],
             "configuration key 'kafka.bootstrap-servers': names no broker"),
            (["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092,tls://kafka-2:9093"],
             "configuration key 'kafka.bootstrap-servers': \"tls://kafka-2:9093\" has scheme \"tls\"; librdkafka knows plaintext, ssl, sasl_plaintext and sasl_ssl"),
            (["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "SSL://kafka-1:9093"],
             "configuration key 'kafka.bootstrap-servers': \"SSL://kafka-1:9093\" says ssl, but kafka.security-protocol is plaintext; librdkafka would drop it and every broker after it"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "auto.commit.interval.ms=0"],
             "configuration key 'kafka.properties': auto.commit.interval.ms is \"0\"; it must be 1 to 300000 milliseconds (0 would stop librdkafka committing stored offsets except at a rebalance or a clean stop, and a crash redoes up to one interval of jobs)"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "security.protocol=sasl_ssl"],
             "configuration key 'kafka.properties': security.protocol cannot be set here: set kafka.security-protocol instead"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "offset.store.method=file"],
             "configuration key 'kafka.properties': offset.store.method cannot be set here: offsets are committed to the group's broker (the default); any other method loses the offsets stored at a rebalance or a stop"),
            (["APNS_FLEET_WORKER_DRAIN_TIMEOUT_SECONDS": "400"],
             "configuration key 'worker.drain-timeout-seconds': is 400.0 s; it must stay at least 30 s below Kafka's max.poll.interval.ms (300000 ms), or a revocation's drain outlasts the poll interval and the worker is dropped from the group mid-drain"),
            (["APNS_FLEET_KAFKA_PROPERTIES": "delivery.report.only.error=true"],
             "configuration key 'kafka.properties': delivery.report.only.error cannot be set here: a job's offset is stored only once the delivery reports of its results arrive, successes included"),
            // Two topics with one name would loop: a DLQ copy read back as a job, forever.
            (["APNS_FLEET_TOPICS_DLQ": "apns.jobs"],
             "configuration key 'topics.dlq': is apns.jobs, the same topic as topics.jobs; each of the five topics must be its own"),
            (["APNS_FLEET_TOPICS_RESULTS": "apns.jobs.retry"],
             "configuration key 'topics.results': is apns.jobs.retry, the same topic as topics.retry; each of the five topics must be its own"),
            (["APNS_FLEET_TOPICS_JOBS": "apns/jobs:x"],
             "configuration key 'topics.jobs': is \"apns/jobs:x\"; a Kafka topic name may only use letters, digits, '.', '_' and '-', not '/'"),
            (["APNS_FLEET_TOPICS_RETRY": ".."], "configuration key 'topics.retry': is \"..\"; a Kafka topic name has 1 to 249 characters, and is not '.' or '..'"),
            // Settings the chosen mode would ignore: a simulator's host left in without
            // `environment: custom` would send the jobs to Apple.
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_HOST": "simulator"],
             "configuration key 'app.a.host': is set but not used: app.a.environment is production; set it to custom to send to this host"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_ENVIRONMENT": "sandbox", "APNS_FLEET_APP_A_PORT": "2197"],
             "configuration key 'app.a.port': is set but not used: app.a.environment is sandbox; set it to custom to send to this host"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem"],
             "configuration key 'app.a.certificate-file': is set but not used: app.a.auth is token"),
            // Legacy settings on an app that goes to Apple over HTTP/2: ignored, they would hide a mistake.
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_GATEWAY": "gw.internal:2195"],
             "configuration key 'app.a.legacy-gateway': is set but not used: app.a.protocol is http2 (only the binary interface sends through the legacy gateway)"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_QUIET_PERIOD_MS": "500"],
             "configuration key 'app.a.legacy-quiet-period-ms': is set but not used: app.a.protocol is http2 (only the binary interface sends through the legacy gateway)"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_TLS": "false"],
             "configuration key 'app.a.legacy-tls': is set but not used: neither app.a.legacy-gateway nor app.a.legacy-feedback is set"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_CA_FILE": "/ca.pem"],
             "configuration key 'app.a.ca-file': is set but not used: it applies to environment custom and the legacy endpoints, and app.a.environment is production with no legacy endpoint"),
            // host:port, with brackets around an IPv6 address.
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_FEEDBACK": "::1"],
             "configuration key 'app.a.legacy-feedback': must be host:port, or [IPv6 address]:port, got \"::1\""),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_FEEDBACK": "gw host:99"],
             "configuration key 'app.a.legacy-feedback': must be host:port, or [IPv6 address]:port, got \"gw host:99\""),
            (["APNS_FLEET_RETRY_BASE_DELAY_MS": "600000", "APNS_FLEET_RETRY_MAX_DELAY_MS": "100"],
             "configuration key 'retry.base-delay-ms': is larger than retry.max-delay-ms (100); every delay would be the maximum"),
            (["APNS_FLEET_RETRY_MAX_DELAY_MS": "50"],
             "configuration key 'retry.max-delay-ms': is smaller than retry.base-delay-ms (100, the default); lower that too"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_LEGACY_ERROR_RECONNECTS_PER_SECOND": "50"],
             "configuration key 'app.a.legacy-error-reconnects-per-second': is set but not used: app.a.protocol is http2 (only the binary interface sends through the legacy gateway)"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem", "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG"],
             "configuration key 'app.a.key-id': is set but not used: app.a.auth is certificate"),
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_PKCS12_FILE": "/c.p12", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem"],
             "configuration key 'app.a.certificate-file': is set but not used: app.a.pkcs12-file is set; give either the PKCS#12 bundle or the PEM files"),
            // Topic routing: entries are checked, and a topic routes to one app only.
            (["APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_TOPICS": "com.example.app,bad topic\u{1}"],
             "configuration key 'app.a.topics': entry 2: topic contains control character U+0001 at position 10"),
            (["APNS_FLEET_APPS": "a,b", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_TOPICS": "com.example.app",
              "APNS_FLEET_APP_B_KEY_FILE": "/k.p8", "APNS_FLEET_APP_B_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_B_TEAM_ID": "XYZ123GHIJ", "APNS_FLEET_APP_B_TOPIC": "com.example.app"],
             "configuration key 'app.a.topics': routes topic com.example.app to app a, but app b claims it too; a topic may route to one app only"),
        ]
    )
    func errors(environment: [String: String], message: String) async {
        await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(environment: environment).load() }
        do {
            _ = try await ConfigurationLoader(environment: environment).load()
        } catch {
            // Where the value came from is checked on its own (`errorOrigins`).
            var problem = error
            problem.origin = nil
            #expect(problem.description == message)
        }
    }

    @Test("a key given twice in a file is an error: a JSON name repeated in one object, a YAML key both dotted and nested")
    func keysGivenTwice() async throws {
        let json = try temporaryFile("fleet.json", #"{"admin": {"port": 99999, "port": 9464}}"#)
        let jsonError = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(filePath: json).load() }
        #expect(jsonError?.description.hasPrefix("configuration key 'admin.port': is given twice in \(json)") == true, "\(jsonError.map { "\($0)" } ?? "")")
        let yaml = try temporaryFile("fleet.yaml", "admin:\n  port: 9464\nadmin.port: 9500\n")
        let yamlError = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(filePath: yaml).load() }
        #expect(yamlError?.description.hasPrefix("configuration key 'admin.port': is given twice in \(yaml)") == true, "\(yamlError.map { "\($0)" } ?? "")")
        // A byte-order mark, as Windows editors write, is not a reason to refuse the file.
        let marked = try temporaryFile("fleet.json", "\u{FEFF}" + #"{"admin": {"port": 9501}}"#)
        #expect(try await ConfigurationLoader(filePath: marked).load().admin.port == 9501)
        // A top-level x-* key holds shared values (YAML anchors), in JSON as in YAML: not a setting.
        let shared = try temporaryFile("fleet.json", #"{"x-common": {"anything": 1}, "admin": {"port": 9500}}"#)
        #expect(try await ConfigurationLoader(filePath: shared).load().admin.port == 9500)
    }

    @Test("an error says where the bad value came from: --set, the variable, or the file")
    func errorOrigins() async throws {
        let path = try temporaryFile("fleet.yaml", "worker:\n  request-timeout-seconds: 0\n")
        func message(_ loader: ConfigurationLoader) async -> String {
            do {
                _ = try await loader.load()
                return "no error"
            } catch {
                return error.description
            }
        }
        let problem = "is 0.0; it must be between 0.1 and 600.0"
        #expect(await message(ConfigurationLoader(filePath: path)) == "configuration key 'worker.request-timeout-seconds' (in \(path)): \(problem)")
        #expect(await message(ConfigurationLoader(environment: ["APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS": "0"]))
            == "configuration key 'worker.request-timeout-seconds' (from APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS): \(problem)")
        #expect(await message(ConfigurationLoader(filePath: path, environment: ["APNS_FLEET_WORKER_REQUEST_TIMEOUT_SECONDS": "10"], overrides: ["worker.request-timeout-seconds=0"]))
            == "configuration key 'worker.request-timeout-seconds' (from --set): \(problem)")
        // A key no layer sets (a required one) names none.
        #expect(await message(ConfigurationLoader(environment: ["APNS_FLEET_APPS": "a"])) == "configuration key 'app.a.key-file': is required for token auth (the .p8 signing key)")
    }

    @Test("secrets never show up in errors or descriptions")
    func secretsStayHidden() async throws {
        let password = "hunter2-very-secret"
        let environment = [
            "APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "APNS_FLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "APNS_FLEET_KAFKA_SASL_USERNAME": "fleet",
            "APNS_FLEET_KAFKA_SASL_PASSWORD": password,
        ]
        let configuration = try await ConfigurationLoader(environment: environment).load()
        #expect(configuration.kafka.saslPassword?.revealed == password)
        #expect("\(configuration.kafka)".contains(password) == false)
        #expect(String(reflecting: configuration.kafka.saslPassword).contains(password) == false)

        var broken = environment
        broken["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE"] = "/nonexistent"
        do {
            _ = try await ConfigurationLoader(environment: broken).load()
            Issue.record("expected an error")
        } catch {
            #expect(!error.description.contains(password))
            #expect(error.description == "configuration key 'kafka.sasl.password-file' (from APNS_FLEET_KAFKA_SASL_PASSWORD_FILE): give kafka.sasl.password or kafka.sasl.password-file, not both")
        }
    }

    @Test("every value the configuration library's access log sees is marked secret: from the file as from the environment")
    func accessLogGetsOnlySecrets() async throws {
        let file = try temporaryFile("fleet.yaml", """
            kafka:
              properties: [sasl.oauthbearer.client.secret=FILE-SECRET-1, ssl.keystore.password=FILE-SECRET-2]
              sasl:
                password: FILE-SECRET-3
            worker:
              max-in-flight: 500
            """)
        let events = RecordedAccesses()
        var loader = ConfigurationLoader(filePath: file, environment: ["APNS_FLEET_KAFKA_SSL_KEY_PASSWORD": "ENV-SECRET-4"])
        loader.accessReporter = events
        let configuration = try await loader.load()
        #expect(configuration.kafka.saslPassword?.revealed == "FILE-SECRET-3")
        let found = events.found
        // The reads happened and found the values: the check below is not about an empty log.
        for key in ["kafka.properties", "kafka.sasl.password", "kafka.ssl.key-password", "worker.max-in-flight"] {
            #expect(found.contains { $0.key == key }, "no read of \(key) reached the reporter")
        }
        // The library's own reporters (CONFIG_ACCESS_LOG_FILE) write a secret value as redacted.
        #expect(found.filter { !$0.isSecret }.map(\.key) == [])
    }

    @Test("a SASL password can come from a file")
    func passwordFile() async throws {
        let path = try temporaryFile("sasl", "from-file\n")
        let configuration = try await ConfigurationLoader(environment: [
            "APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": path,
        ]).load()
        #expect(configuration.kafka.saslPassword?.revealed == "from-file")

        // One line end goes, whichever an editor wrote; anything else is the password's own.
        for (contents, password) in [("crlf\r\n", "crlf"), ("cr\r", "cr"), ("two\n\n", "two\n"), (" spaced ", " spaced ")] {
            let path = try temporaryFile("sasl-line-end", contents)
            let loaded = try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": path]).load()
            #expect(loaded.kafka.saslPassword?.revealed == password, "from \(contents.debugDescription)")
        }
        let onlyLineEnd = try temporaryFile("sasl-empty", "\r\n")
        let empty = await #expect(throws: ConfigurationError.self) {
            try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": onlyLineEnd]).load()
        }
        #expect(empty?.problem.hasSuffix("is empty") == true, "\(String(describing: empty))")

        // A path mistyped to something large is refused before it is read whole.
        for (large, problem) in [
            (try temporaryFile("big", String(repeating: "x", count: 70_000)), "is larger than 64 KiB; a password file holds one line"),
            ("/dev/zero", "is larger than 64 KiB; a password file holds one line"),
            (FileManager.default.temporaryDirectory.path, "cannot read"),
        ] {
            let error = await #expect(throws: ConfigurationError.self) {
                try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": large]).load()
            }
            #expect(error?.key == "kafka.sasl.password-file" && error?.problem.contains(problem) == true, "\(String(describing: error))")
        }
    }

    @Test("a config file the parser refuses is reported by line, never quoted (it may hold a password)")
    func syntaxErrorsDoNotQuoteTheFile() async throws {
        let secret = "hunter2-in-the-file"
        for text in [
            "kafka:\n  sasl:\n    password: \(secret)\n  brokers: [a:9092]\n  brokers: [b:9092]\n",
            "kafka:\n  sasl:\n    password: @\(secret)\n",
        ] {
            let file = try temporaryFile("fleet.yaml", text)
            do {
                _ = try await ConfigurationLoader(filePath: file).load()
                Issue.record("accepted: \(text)")
            } catch {
                let message = "\(error)"
                #expect(!message.contains(secret), "\(message)")
                #expect(message.contains("line"), "\(message)")
            }
        }
    }

    @Test("a world-readable key file is warned about")
    func worldReadableKey() async throws {
        let key = try temporaryFile("AuthKey.p8", "not really a key", mode: 0o644)
        let configuration = try await ConfigurationLoader(environment: [
            "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": key,
            "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ",
        ]).load()
        let warnings = SecretFile.permissionWarnings(for: configuration)
        #expect(warnings == ["app.a.key-file: \(key) is readable by every user (mode 644); run chmod 600 on it"])
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        #expect(SecretFile.permissionWarnings(for: configuration).isEmpty)
    }

    @Test("two apps for one bundle (production and sandbox credentials) may share their default topic, listed in topics or not")
    func sharedDefaultTopic() async throws {
        let configuration = try await ConfigurationLoader(environment: [
            "APNS_FLEET_APPS": "prod,dev",
            "APNS_FLEET_APP_PROD_KEY_FILE": "/k.p8", "APNS_FLEET_APP_PROD_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_PROD_TEAM_ID": "DEF123GHIJ",
            "APNS_FLEET_APP_PROD_TOPIC": "com.example.app", "APNS_FLEET_APP_PROD_TOPICS": "com.example.app,com.example.app.voip",
            "APNS_FLEET_APP_DEV_KEY_FILE": "/k.p8", "APNS_FLEET_APP_DEV_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_DEV_TEAM_ID": "DEF123GHIJ",
            "APNS_FLEET_APP_DEV_TOPIC": "com.example.app", "APNS_FLEET_APP_DEV_ENVIRONMENT": "sandbox",
        ]).load()
        #expect(configuration.apps.map(\.name) == ["prod", "dev"])
    }

    @Test("a single value where a list belongs is an error that says a list is wanted")
    func singleValueForList() async throws {
        let path = try temporaryFile("fleet.yaml", "apps: example\n")
        let error = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(filePath: path).load() }
        #expect(error?.description == "configuration key 'apps' (in \(path)): must be a list of names: [a, b] in YAML or JSON, a, b (comma-separated) in a variable or --set")
    }

    @Test("the TLS key and certificate passwords can come from files too, checked like the SASL one")
    func otherPasswordFiles() async throws {
        let keyPassword = try temporaryFile("kafka-key-password", "kafka-key\n")
        let certificatePassword = try temporaryFile("certificate-password", "cert-key\n", mode: 0o644)
        let environment = [
            "APNS_FLEET_KAFKA_SSL_KEY_PASSWORD_FILE": keyPassword,
            "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate",
            "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem", "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem",
            "APNS_FLEET_APP_A_CERTIFICATE_PASSWORD_FILE": certificatePassword,
        ]
        let configuration = try await ConfigurationLoader(environment: environment).load()
        #expect(configuration.kafka.sslKeyPassword?.revealed == "kafka-key")
        guard case .certificate(.pem(_, _, let password)) = configuration.apps.first?.authentication else {
            Issue.record("expected PEM certificate auth")
            return
        }
        #expect(password?.revealed == "cert-key")
        #expect(SecretFile.permissionWarnings(for: configuration) == [
            "app.a.certificate-password-file: \(certificatePassword) is readable by every user (mode 644); run chmod 600 on it",
        ])

        var both = environment
        both["APNS_FLEET_APP_A_CERTIFICATE_PASSWORD"] = "inline-secret"
        let error = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(environment: both).load() }
        #expect(error?.description == "configuration key 'app.a.certificate-password-file' (from APNS_FLEET_APP_A_CERTIFICATE_PASSWORD_FILE): give app.a.certificate-password or app.a.certificate-password-file, not both")
        #expect(error?.description.contains("inline-secret") == false)

        var kafkaBoth = environment
        kafkaBoth["APNS_FLEET_KAFKA_SSL_KEY_PASSWORD"] = "inline-secret"
        let kafkaError = await #expect(throws: ConfigurationError.self) { try await ConfigurationLoader(environment: kafkaBoth).load() }
        #expect(kafkaError?.key == "kafka.ssl.key-password-file")

        // Under token auth a certificate password file would be ignored: refused, like the password.
        let tokenApp = await #expect(throws: ConfigurationError.self) {
            try await ConfigurationLoader(environment: [
                "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG",
                "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ", "APNS_FLEET_APP_A_CERTIFICATE_PASSWORD_FILE": certificatePassword,
            ]).load()
        }
        #expect(tokenApp?.key == "app.a.certificate-password-file", "\(String(describing: tokenApp))")
    }

    @Test("a world-readable SASL password file is warned about")
    func worldReadablePasswordFile() async throws {
        let path = try temporaryFile("sasl-password", "secret\n", mode: 0o644)
        let configuration = try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": path]).load()
        #expect(SecretFile.permissionWarnings(for: configuration) == ["kafka.sasl.password-file: \(path) is readable by every user (mode 644); run chmod 600 on it"])
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        #expect(SecretFile.permissionWarnings(for: configuration).isEmpty)
    }

    @Test("a key file reached through a symbolic link (a Kubernetes secret volume) is judged by the file, not the link")
    func keyFileBehindALink() async throws {
        let key = try temporaryFile("AuthKey-target.p8", "not really a key", mode: 0o440)
        let link = key + ".link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: key)
        defer { try? FileManager.default.removeItem(atPath: link) }
        let configuration = try await ConfigurationLoader(environment: [
            "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": link,
            "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ",
        ]).load()
        #expect(SecretFile.permissionWarnings(for: configuration).isEmpty, "0440 behind a link is not world-readable")
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: key)
        #expect(SecretFile.permissionWarnings(for: configuration) == ["app.a.key-file: \(link) is readable by every user (mode 644); run chmod 600 on it"])
    }

    @Test("a legacy quiet period shorter than a round trip to a remote gateway is warned about; towards this host it is fine")
    func shortQuietPeriod() async throws {
        func warnings(gateway: String, quietMilliseconds: Int) async throws -> [String] {
            let configuration = try await ConfigurationLoader(environment: [
                "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_AUTH": "certificate", "APNS_FLEET_APP_A_CERTIFICATE_FILE": "/c.pem",
                "APNS_FLEET_APP_A_PRIVATE_KEY_FILE": "/k.pem", "APNS_FLEET_APP_A_PROTOCOL": "binary",
                "APNS_FLEET_APP_A_LEGACY_GATEWAY": gateway, "APNS_FLEET_APP_A_LEGACY_QUIET_PERIOD_MS": "\(quietMilliseconds)",
            ]).load()
            return SecurityWarnings.all(for: configuration)
        }
        let remote = try await warnings(gateway: "gateway.example.net:2195", quietMilliseconds: 100)
        #expect(remote.count == 1 && remote[0].hasPrefix("app.a.legacy-quiet-period-ms is 100 ms: an error-response from gateway.example.net"), "\(remote)")
        #expect(try await warnings(gateway: "gateway.example.net:2195", quietMilliseconds: 1000).isEmpty)
        #expect(try await warnings(gateway: "127.0.0.1:2295", quietMilliseconds: 100).isEmpty)
    }

    @Test("Kafka TLS checks switched off through kafka.properties are warned about")
    func kafkaVerificationOff() async throws {
        let relaxed = try await ConfigurationLoader(environment: [
            "APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "ssl",
            "APNS_FLEET_KAFKA_PROPERTIES": "enable.ssl.certificate.verification=false,ssl.endpoint.identification.algorithm=none",
        ]).load()
        let warnings = SecurityWarnings.all(for: relaxed)
        #expect(warnings.count == 2)
        #expect(warnings.first?.contains("enable.ssl.certificate.verification=false") == true)
        #expect(warnings.last?.contains("ssl.endpoint.identification.algorithm=none") == true)
        let strict = try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "ssl"]).load()
        #expect(SecurityWarnings.all(for: strict).isEmpty)
        let terse = try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_PROPERTIES": "enable.ssl.certificate.verification=0"]).load()
        #expect(SecurityWarnings.all(for: terse).count == 1, "librdkafka reads 0 as false too")
        // SASL credentials under plaintext are ignored: said, not silently dropped.
        let unused = try await ConfigurationLoader(environment: ["APNS_FLEET_KAFKA_SASL_USERNAME": "fleet", "APNS_FLEET_KAFKA_SASL_PASSWORD": "pw-not-shown"]).load()
        let ignored = SecurityWarnings.all(for: unused)
        #expect(ignored.count == 1 && ignored[0].hasPrefix("kafka.sasl.* is set but kafka.security-protocol is plaintext"), "\(ignored)")
        #expect(!ignored.joined().contains("pw-not-shown"))
        // PLAIN without TLS sends the password in clear, unless every broker is on this machine.
        let sasl = ["APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "APNS_FLEET_KAFKA_SASL_MECHANISM": "PLAIN",
                    "APNS_FLEET_KAFKA_SASL_USERNAME": "fleet", "APNS_FLEET_KAFKA_SASL_PASSWORD": "pw-not-shown"]
        let remote = try await ConfigurationLoader(environment: sasl.merging(["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092,kafka-1.internal:9092"]) { $1 }).load()
        #expect(SecurityWarnings.all(for: remote) == ["kafka.security-protocol is sasl_plaintext with kafka.sasl.mechanism PLAIN: the SASL password crosses the network in clear; use sasl_ssl, or a SCRAM mechanism"])
        let local = try await ConfigurationLoader(environment: sasl.merging(["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092,[::1]:9093,localhost:9094,SASL_PLAINTEXT://127.0.0.1:9095"]) { $1 }).load()
        #expect(SecurityWarnings.all(for: local).isEmpty)
        let scram = try await ConfigurationLoader(environment: sasl.merging(["APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "kafka-1.internal:9092", "APNS_FLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"]) { $1 }).load()
        #expect(SecurityWarnings.all(for: scram).isEmpty)
    }

    @Test("the legacy interface without TLS is warned about unless the host is this machine")
    func plainLegacyEndpoints() {
        func app(_ host: String) -> AppConfiguration {
            AppConfiguration(
                name: "old", authentication: .certificate(.pkcs12(file: "/nonexistent.p12", password: nil)), transport: .binary,
                legacyGateway: LegacyEndpoint(host: host, port: 2195, tls: false), legacyFeedback: LegacyEndpoint(host: host, port: 2196, tls: true)
            )
        }
        #expect(SecurityWarnings.all(for: FleetConfiguration(apps: [app("127.0.0.1")])).isEmpty)
        #expect(SecurityWarnings.all(for: FleetConfiguration(apps: [app("localhost")])).isEmpty)
        let warnings = SecurityWarnings.all(for: FleetConfiguration(apps: [app("gateway.example.com")]))
        #expect(warnings.count == 1, "only the endpoint without TLS")
        #expect(warnings.first?.hasPrefix("app.old.legacy-gateway: gateway.example.com:2195 is reached without TLS") == true)
        #expect(SecurityWarnings.all(for: FleetConfiguration(apps: [app("127.example.com")])).count == 1, "a name that starts like a loopback address")
    }

    @Test("a key nothing reads stops the process, naming it and the nearest real key")
    func unknownKeys() async throws {
        let typo = try temporaryFile("fleet.yaml", yaml.replacingOccurrences(of: "environment: sandbox\n", with: "enviroment: sandbox\n"))
        await #expect(throws: ConfigurationError(
            key: "app.example.enviroment", "is not a configuration key (did you mean app.example.environment?); see docs/configuration.md (in \(typo))"
        )) { try await ConfigurationLoader(filePath: typo).load() }

        let json = try temporaryFile("fleet.json", #"{"worker": {"max-in-flight": 10, "max_tokens_per_job": 5}}"#)
        await #expect(throws: ConfigurationError(
            key: "worker.max_tokens_per_job", "is not a configuration key (did you mean worker.max-tokens-per-job?); see docs/configuration.md (in \(json))"
        )) { try await ConfigurationLoader(filePath: json).load() }

        // A file shared by deployments may configure apps that this one does not list...
        let shared = try temporaryFile("fleet.yaml", yaml.replacingOccurrences(of: "app:\n", with: "app:\n  staging:\n    key-id: ABC123DEFG\n"))
        #expect(try await ConfigurationLoader(filePath: shared).load().apps.map(\.name) == ["example", "legacy"])
        // ...but a --set for an unlisted app is never read.
        await #expect(throws: ConfigurationError(
            key: "app.staging.connections", "app staging is not in apps (listed: example, legacy), so this is never read (in --set)"
        )) { try await ConfigurationLoader(filePath: shared, overrides: ["app.staging.connections=3"]).load() }

        await #expect(throws: ConfigurationError(key: "admin.prot", "is not a configuration key (did you mean admin.port?); see docs/configuration.md (in --set)")) {
            try await ConfigurationLoader(overrides: ["admin.prot=9000"]).load()
        }
        // A --set without '=' (a YAML habit) is refused without echoing what may be a password.
        await #expect(throws: ConfigurationError(key: nil, "--set number 2 is not key=value (the argument is not shown, as it may hold a secret)")) {
            try await ConfigurationLoader(overrides: ["admin.port=9000", "kafka.sasl.password:hunter2"]).load()
        }
        // A password that YAML reads as a mapping: the message names the key, not the value.
        let braces = try temporaryFile("fleet.yaml", "kafka:\n  sasl:\n    password: {S3cr3t: x}\n")
        await #expect(throws: ConfigurationError(key: "kafka.sasl.password", "must be a single value (secret string), not a mapping (in \(braces))")) {
            try await ConfigurationLoader(filePath: braces).load()
        }
        // A list written as a mapping: the message says a list is wanted, with its form.
        let mapped = try temporaryFile("fleet.yaml", "kafka:\n  properties: {linger.ms: 5}\n")
        await #expect(throws: ConfigurationError(key: "kafka.properties", "must be a list of name=value ([a, b] in YAML or JSON), not a mapping (in \(mapped))")) {
            try await ConfigurationLoader(filePath: mapped).load()
        }
        let merge = try temporaryFile("fleet.yaml", "x-common: &common\n  connections: 4\napps: [a]\napp:\n  a:\n    <<: *common\n")
        await #expect(throws: ConfigurationError(key: "app.a.<<.connections", "YAML merge keys (<<) are not supported; write the keys out (in \(merge))")) {
            try await ConfigurationLoader(filePath: merge).load()
        }
        // Dotted keys at the top level of a file are the same keys as nested ones; an empty
        // section, a null and an x- anchor holder set nothing.
        let dotted = try temporaryFile("fleet.yaml", "admin.port: 9000\nworker:\n  max-in-flight: 7\nkafka:\nfeedback: ~\nx-defaults: &d {any: thing}\n")
        let configuration = try await ConfigurationLoader(filePath: dotted).load()
        #expect(configuration.admin.port == 9000 && configuration.worker.maxInFlight == 7)
        let nulls = try temporaryFile("fleet.json", #"{"kafka": {"sasl": null}, "admin": {"port": 9001}}"#)
        #expect(try await ConfigurationLoader(filePath: nulls).load().admin.port == 9001)
    }

    @Test("an APNS_FLEET_ variable that sets no key is reported, to be warned about")
    func unknownEnvironmentVariables() async throws {
        let environment = [
            "APNS_FLEET_APPS": "a", "APNS_FLEET_APP_A_KEY_FILE": "/k.p8", "APNS_FLEET_APP_A_KEY_ID": "ABC123DEFG", "APNS_FLEET_APP_A_TEAM_ID": "DEF123GHIJ",
            "APNS_FLEET_APP_A_ENVIROMENT": "sandbox", "APNS_FLEET_APP_B_TOPIC": "x", "APNS_FLEET_ADMIN_PORT": "9464", "HOME": "/root",
        ]
        let loader = ConfigurationLoader(environment: environment)
        let configuration = try await loader.load()
        #expect(loader.unknownEnvironmentVariables(for: configuration) == ["APNS_FLEET_APP_A_ENVIROMENT", "APNS_FLEET_APP_B_TOPIC"])
    }

    @Test("a camelCase app name is set through the variables the configuration library reads (MY_APP), and by --set")
    func camelCaseAppNames() async throws {
        let environment = [
            "APNS_FLEET_APPS": "myApp", "APNS_FLEET_APP_MY_APP_KEY_FILE": "/k.p8", "APNS_FLEET_APP_MY_APP_KEY_ID": "ABC123DEFG",
            "APNS_FLEET_APP_MY_APP_TEAM_ID": "DEF123GHIJ",
        ]
        let loader = ConfigurationLoader(environment: environment, overrides: ["app.myApp.connections=3"])
        let configuration = try await loader.load()
        #expect(configuration.apps.first?.connections == 3)
        #expect(loader.unknownEnvironmentVariables(for: configuration).isEmpty)
        for apps in ["my-app,my_app", "myApp,my_app"] {
            do {
                _ = try await ConfigurationLoader(environment: ["APNS_FLEET_APPS": apps]).load()
                Issue.record("\(apps) was accepted")
            } catch {
                #expect(error.description.hasSuffix("would share environment variables (APNS_FLEET_APP_MY_APP_*); rename one"))
            }
        }
    }

    @Test("docs/configuration.md documents every key the loader reads")
    func referenceIsComplete() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let reference = try String(contentsOf: root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        for key in ConfigurationKeys.all {
            #expect(reference.contains("`\(key.name)`"), "docs/configuration.md lacks \(key.name)")
            #expect(reference.contains("`\(key.environmentName)`"), "docs/configuration.md lacks \(key.environmentName)")
        }
    }
}

@Suite("Kafka TLS files")
struct KafkaTLSFileTests {
    @Test("a Kafka TLS file that cannot be read is a configuration error naming its key and path, before any client starts")
    func unreadableFileNamed() throws {
        var kafka = KafkaSettings()
        kafka.securityProtocol = .ssl
        kafka.sslCAFile = "/nonexistent/ca.pem"
        do {
            try kafka.checkReadableFiles()
            Issue.record("expected an error")
        } catch {
            #expect(error.key == "kafka.ssl.ca-file")
            #expect(error.description.contains("/nonexistent/ca.pem") && error.description.contains("No such file"), "\(error)")
        }
        // Without TLS the files are not used (a warning elsewhere says so), so not checked.
        kafka.securityProtocol = .plaintext
        try kafka.checkReadableFiles()
        kafka.securityProtocol = .ssl
        kafka.sslCAFile = CommandLine.arguments[0]
        try kafka.checkReadableFiles()
    }
}

/// What an access reporter heard: each key read that found a value, and whether the value was
/// marked secret.
private final class RecordedAccesses: AccessReporter, Sendable {
    private let state = Mutex<[(key: String, isSecret: Bool)]>([])

    func report(_ event: AccessEvent) {
        guard case .success(let value?) = event.result else { return }
        state.withLock { $0.append((event.metadata.key.components.joined(separator: "."), value.isSecret)) }
    }

    var found: [(key: String, isSecret: Bool)] { state.withLock { $0 } }
}
