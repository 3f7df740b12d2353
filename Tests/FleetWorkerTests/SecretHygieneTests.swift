import APNsCore
import APNsSimulator
import FleetLoad
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import NIOCore
import NIOPosix
import Testing

/// Secrets in a running worker: the SASL password, the .p8 signing key and a client
/// certificate's private key must not reach its log (at debug level), its errors or /metrics.
@Suite("Secrets stay out of logs, errors and metrics", .timeLimit(.minutes(2)))
struct SecretHygieneTests {
    static let saslPassword = "sasl-Pa55word-4e1f9c-never-print-me"
    static let keyPassword = "ssl-key-Pa55-8d2a77-never-print-me"

    /// The distinctive parts of a PEM file: every base64 line of its body.
    static func pemBodyLines(_ pem: String) -> [String] {
        pem.split(separator: "\n").map(String.init).filter { !$0.hasPrefix("-----") && $0.count >= 16 }
    }

    static func leaks(in text: String, secrets: [String]) -> [String] {
        secrets.filter { text.contains($0) }
    }

    @Test("a worker with a SASL password and key files, at debug level: no secret in its log or /metrics")
    func runningWorker() async throws {
        var logger = Logger(label: "secret-hygiene-test")
        logger.logLevel = .warning
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-secrets")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: 2)
        defer { kafka.process.kill() }

        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        var simulatorConfiguration = try credentials.simulatorConfiguration()
        simulatorConfiguration.listeners.http2TLSPort = 0
        let simulator = try await APNsSimulator.start(simulatorConfiguration, logger: logger)
        let simulatorPort = try #require(simulator.port(.http2TLS))
        let path = { (name: String) in (directory as NSString).appendingPathComponent(name) }
        let config = try writeFleetFile(directory: directory, summary: summary, simulatorPort: simulatorPort, bootstrap: kafka.bootstrap)
        // A second app on certificate auth, so a client private key is loaded and used as well.
        var environment = ProcessInfo.processInfo.environment
        environment["APNS_FLEET_APPS"] = "example,certified"
        environment["APNS_FLEET_APP_CERTIFIED_AUTH"] = "certificate"
        environment["APNS_FLEET_APP_CERTIFIED_CERTIFICATE_FILE"] = path(summary.clientCertificateFile)
        environment["APNS_FLEET_APP_CERTIFIED_PRIVATE_KEY_FILE"] = path(summary.clientKeyFile)
        environment["APNS_FLEET_APP_CERTIFIED_TOPIC"] = "com.example.certified"
        environment["APNS_FLEET_APP_CERTIFIED_ENVIRONMENT"] = "custom"
        environment["APNS_FLEET_APP_CERTIFIED_HOST"] = "127.0.0.1"
        environment["APNS_FLEET_APP_CERTIFIED_PORT"] = String(simulatorPort)
        environment["APNS_FLEET_APP_CERTIFIED_CA_FILE"] = path(summary.caFile)
        func startWorker(_ environment: [String: String], id: String) throws -> ChildProcess {
            let worker = ChildProcess(
                "/bin/sh", ["-c", #"exec "$0" worker --config "$1" --set "worker.id=$2" --log-level debug 2>&1"#, binary, config, id],
                environment: environment
            )
            try worker.start()
            return worker
        }
        let signingKey = try String(contentsOfFile: path(summary.signingKeyFile), encoding: .utf8)
        let clientKey = try String(contentsOfFile: path(summary.clientKeyFile), encoding: .utf8)
        let secrets = [Self.saslPassword] + Self.pemBodyLines(signingKey) + Self.pemBodyLines(clientKey)
        #expect(secrets.count > 3)

        // 1. SASL: the mock cluster has no SASL handshake, so authentication fails again and
        //    again, the path most likely to echo a credential.
        var sasl = environment
        sasl["APNS_FLEET_KAFKA_SECURITY_PROTOCOL"] = "sasl_plaintext"
        sasl["APNS_FLEET_KAFKA_SASL_MECHANISM"] = "PLAIN"
        sasl["APNS_FLEET_KAFKA_SASL_USERNAME"] = "fleet"
        sasl["APNS_FLEET_KAFKA_SASL_PASSWORD"] = Self.saslPassword
        let failing = try startWorker(sasl, id: "w-sasl")
        defer { failing.kill() }
        let failingPort = try await failing.adminPort()
        try await waitUntil("SASL authentication to fail", timeout: 20) {
            failing.lines.value.contains { $0.contains("SASL") && $0.contains("_AUTHENTICATION") }
        }
        let failingMetrics = try httpGet(port: failingPort, path: "/metrics").body
        failing.kill()
        let failingLog = failing.lines.value.joined(separator: "\n")
        #expect(failingLog.contains(" debug "), "the log is at debug level")
        #expect(Self.leaks(in: failingLog, secrets: secrets).isEmpty, "secrets in the log of a worker whose SASL login fails")
        #expect(Self.leaks(in: failingMetrics, secrets: secrets).isEmpty, "secrets in /metrics")

        // 2. The same worker on plaintext Kafka delivers a job: the JWT is signed with the .p8
        //    key and sent; an invalid job is logged with its reason.
        let worker = try startWorker(environment, id: "w-secrets")
        defer { worker.kill() }
        let port = try await worker.adminPort()
        try await waitUntil("the worker to be ready", timeout: 30) { (try? httpGet(port: port, path: "/readyz").status) == 200 }
        var client = KafkaClientConfiguration(bootstrapServers: [kafka.bootstrap])
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            let token = String(repeating: "0", count: 62) + "07"
            _ = try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", value: Array(#"{"id":"s1","app":"example","token":"\#(token)","payload":{"aps":{}}}"#.utf8)))
            _ = try await producer.send(KafkaOutgoingMessage(topic: "apns.jobs", value: Array(#"{"id":"s2","token":"bad","payload":{}}"#.utf8)))
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        try await waitUntil("the job to be delivered", timeout: 30) {
            let samples = prometheusSamples((try? httpGet(port: port, path: "/metrics").body) ?? "")
            return samples.contains { $0.name == "apns_worker_notifications" && $0.labels["outcome"] == "delivered" && $0.value >= 1 }
        }
        let metrics = try httpGet(port: port, path: "/metrics").body
        worker.signal(SIGTERM)
        // The drain budget is 25 s plus 15 s for the services to stop; wait a little longer.
        let exitStatus = try? await worker.waitForExit(timeout: 45)
        if exitStatus == nil { print("the worker did not exit within 45 s of SIGTERM; its log ends:\n" + worker.lines.value.suffix(40).joined(separator: "\n")) }
        #expect(exitStatus == 0)
        await simulator.stop(gracePeriod: .zero)
        let log = worker.lines.value.joined(separator: "\n")
        #expect(Self.leaks(in: log, secrets: secrets).isEmpty, "secrets in the worker's log")
        // The executable runs on jemalloc with its options (a build that lost either shows here).
        #expect(log.contains("malloc=jemalloc 5.") && log.contains("dirty_decay_ms 1000"), "the worker's start-up line names its allocator")
        #expect(Self.leaks(in: metrics, secrets: secrets).isEmpty, "secrets in /metrics")
    }

    @Test("a worker that cannot start says why without printing its secrets; a bad Kafka CA is fatal; a world-readable key is warned about")
    func configurationErrors() async throws {
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-secrets")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let summary = try DevCredentials.generate(topic: "com.example.app").write(to: directory)
        let badCA = (directory as NSString).appendingPathComponent("not-a-ca.pem")
        try "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n".write(toFile: badCA, atomically: true, encoding: .utf8)
        let base = [
            "APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "APNS_FLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "APNS_FLEET_KAFKA_SASL_USERNAME": "fleet",
            "APNS_FLEET_KAFKA_SASL_PASSWORD": Self.saslPassword,
            "APNS_FLEET_KAFKA_SSL_KEY_PASSWORD": Self.keyPassword,
            "APNS_FLEET_ADMIN_PORT": "0",
            "APNS_FLEET_APPS": "a",
            "APNS_FLEET_APP_A_KEY_FILE": (directory as NSString).appendingPathComponent(summary.signingKeyFile),
            "APNS_FLEET_APP_A_KEY_ID": summary.keyID,
            "APNS_FLEET_APP_A_TEAM_ID": summary.teamID,
            "APNS_FLEET_APP_A_TOPIC": "com.example.app",
            "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
        ]
        func run(_ extra: [String: String]) async throws -> (status: Int32, output: String) {
            let process = ChildProcess(
                "/bin/sh", ["-c", #"exec "$0" worker --log-level debug 2>&1"#, binary],
                environment: base.merging(extra) { $1 }
            )
            try process.start()
            defer { process.kill() }
            let status = try await process.waitForExit(timeout: 30)
            try await Task.sleep(for: .milliseconds(100))  // the last lines
            return (status, process.lines.value.joined(separator: "\n"))
        }

        // A configuration error: both password keys given.
        let conflicting = try await run(["APNS_FLEET_KAFKA_SASL_PASSWORD_FILE": badCA])
        #expect(conflicting.status != 0)
        #expect(conflicting.output.contains("kafka.sasl.password"), "\(conflicting.output)")
        #expect(Self.leaks(in: conflicting.output, secrets: [Self.saslPassword, Self.keyPassword]).isEmpty, "\(conflicting.output)")

        // TLS to Kafka with a CA file that holds no certificate: the worker refuses to start
        // rather than connect unverified. The .p8 key is readable by everyone this time.
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: (directory as NSString).appendingPathComponent(summary.signingKeyFile))
        let unverifiable = try await run(["APNS_FLEET_KAFKA_SSL_CA_FILE": badCA])
        #expect(unverifiable.status != 0, "\(unverifiable.output)")
        #expect(unverifiable.output.contains("ssl.ca.location failed"), "\(unverifiable.output)")
        #expect(Self.leaks(in: unverifiable.output, secrets: [Self.saslPassword, Self.keyPassword]).isEmpty, "\(unverifiable.output)")
        #expect(unverifiable.output.contains("app.a.key-file:") && unverifiable.output.contains("is readable by every user (mode 644)"), "\(unverifiable.output)")

        // The admin port taken by another process: a configuration error naming the setting,
        // exit status 2, at once (it used to wait for every other service, for good).
        let taken = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        defer { taken.close(promise: nil) }
        let takenPort = try #require(taken.localAddress?.port)
        let started = ContinuousClock.now
        let busy = try await run(["APNS_FLEET_ADMIN_PORT": "\(takenPort)", "APNS_FLEET_KAFKA_SECURITY_PROTOCOL": "plaintext"])
        #expect(busy.status == 2, "\(busy.output)")
        #expect(busy.output.contains("admin.host/admin.port: cannot listen on 127.0.0.1:\(takenPort)"), "\(busy.output)")
        #expect(ContinuousClock.now - started < .seconds(20))
    }
}
