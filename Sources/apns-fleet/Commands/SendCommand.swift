import APNsClient
import APNsCore
import ArgumentParser
import Foundation
import Logging
import NIOCore
import Synchronization

/// `apns-fleet send`: a curl for APNs, and the client's benchmark (`--count`, `--concurrency`, `--json`).
struct SendCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Send a notification to APNs (or the simulator) and print the answer.",
        discussion: """
            Sends over the same client the worker uses: HTTP/2 over TLS with ALPN h2, the \
            server certificate always verified (system roots for production and sandbox, \
            --ca-file for a custom --host). Credentials: --key-file/--key-id/--team-id (token), \
            --cert/--key (PEM) or --pkcs12 (certificate).

            Prints one line per notification: status, reason, apns-id and latency. With \
            --count N the notification is sent N times over --connections connections with up \
            to --concurrency in flight; --json then prints one summary line: notifications per \
            second, client CPU µs per notification (this process's rusage), p50/p99 latency \
            and peak RSS.

            Example (dev-credentials prints the key id and team id to use):
              apns-fleet dev-credentials --out ./dev   # once (--force replaces)
              apns-fleet simulator --config ./dev/simulator.json &
              echo '{"aps":{"alert":"hello"}}' > aps.json
              apns-fleet send --host 127.0.0.1 --port 2197 --ca-file ./dev/ca.pem \\
                --key-file ./dev/AuthKey_<KEY_ID>.p8 --key-id <KEY_ID> --team-id <TEAM_ID> \\
                --topic com.example.app --token <64 hex digits> --payload @aps.json
              apns-fleet send ... --count 100000 --concurrency 1000 --json
            """
    )

    @Option(help: "Device token (hex).")
    var token: String

    @Option(help: "apns-topic (bundle id).")
    var topic: String?

    @Option(name: .customLong("push-type"), help: "apns-push-type.")
    var pushType: String = "alert"

    @Option(help: "apns-priority: 10, 5 or 1.")
    var priority: Int?

    @Option(help: "apns-expiration, unix seconds.")
    var expiration: Int64?

    @Option(name: .customLong("collapse-id"), help: "apns-collapse-id.")
    var collapseID: String?

    @Option(name: .customLong("apns-id"), help: "apns-id (a UUID). Default: APNs makes one.")
    var apnsID: String?

    @Option(help: "The payload JSON, or @FILE to read it from a file (sent byte for byte).")
    var payload: String = #"{"aps":{"alert":"Hello from apns-fleet"}}"#

    @Option(name: .customLong("key-file"), help: "Token auth: the .p8 signing key.")
    var keyFile: String?

    @Option(name: .customLong("key-id"), help: "Token auth: the key id.")
    var keyID: String?

    @Option(name: .customLong("team-id"), help: "Token auth: the team id.")
    var teamID: String?

    @Option(help: "Certificate auth: the PEM client certificate.")
    var cert: String?

    @Option(help: "Certificate auth: the PEM private key of --cert.")
    var key: String?

    @Option(help: "Certificate auth: a PKCS#12 bundle.")
    var pkcs12: String?

    @Option(help: "Password of --key or --pkcs12, read from this environment variable.")
    var passwordEnv: String?

    @Option(help: "Apple's production or sandbox APNs (default: sandbox, for development builds; the worker's apps default to production). Not with --host.")
    var environment: String?

    @Option(help: "A custom APNs host (a simulator).")
    var host: String?

    @Option(help: "Port of --host (the simulator's is 2197). Default: 443.")
    var port: Int?

    @Option(name: .customLong("ca-file"), help: "CA certificates (PEM) that --host's certificate must chain to.")
    var caFile: String?

    @Option(help: "Send the notification this many times.")
    var count: Int = 1

    @Option(help: "Requests in flight at most.")
    var concurrency: Int = 1

    @Option(help: "Connections to open.")
    var connections: Int = 1

    @Option(help: "Send this many first, unmeasured (warm-up), before the --count that is timed.")
    var warmup: Int = 0

    @Option(help: "Seconds each request may take.")
    var timeout: Double = 10

    @Flag(help: "Print one JSON summary line instead of one line per notification.")
    var json = false

    func validate() throws {
        guard (1...100_000_000).contains(count) else { throw ValidationError("--count must be 1 to 100,000,000") }
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        guard (0...100_000_000).contains(warmup) else { throw ValidationError("--warmup must be 0 to 100,000,000") }
        guard connections >= 1 else { throw ValidationError("--connections must be at least 1") }
        guard PushType(rawValue: pushType) != nil else { throw ValidationError("unknown --push-type \(pushType)") }
        if let priority, NotificationPriority(rawValue: priority) == nil { throw ValidationError("--priority must be 10, 5 or 1") }
        guard timeout > 0, timeout <= 3600 else { throw ValidationError("--timeout must be more than 0 and at most 3600 seconds") }
        // The job contract's own rules: what goes into a header or :path must not carry CR, LF
        // or a slash into the request.
        try check("--token") { () throws(JobRejection) in _ = try DeviceToken(hex: token) }
        if let topic { try check("--topic") { () throws(JobRejection) in _ = try JobRules.topic(topic) } }
        if let collapseID { try check("--collapse-id") { () throws(JobRejection) in _ = try JobRules.collapseID(collapseID) } }
        if let apnsID { try check("--apns-id") { () throws(JobRejection) in _ = try JobRules.apnsID(apnsID) } }
        if host != nil {
            guard environment == nil else { throw ValidationError("--environment picks Apple's production or sandbox; it does not go with --host") }
            if let port, !(1...65_535).contains(port) { throw ValidationError("--port must be 1 to 65535, got \(port)") }
        } else {
            guard caFile == nil else { throw ValidationError("--ca-file goes with --host: production and sandbox verify against the system roots") }
            guard port == nil else { throw ValidationError("--port goes with --host: production and sandbox are on Apple's port 443") }
            guard environment == nil || environment == "production" || environment == "sandbox" else {
                throw ValidationError("--environment must be production or sandbox")
            }
        }
        switch (keyFile, cert, pkcs12) {
        case (_?, nil, nil):
            guard let keyID, let teamID else { throw ValidationError("--key-file needs --key-id and --team-id") }
            try checkAppleIdentifiers(["--key-id": keyID, "--team-id": teamID])
        case (nil, _?, nil):
            guard key != nil else { throw ValidationError("--cert needs --key") }
        case (nil, nil, _?):
            break
        default:
            throw ValidationError("give exactly one of --key-file (token auth), --cert (PEM) or --pkcs12")
        }
        if passwordEnv != nil, keyFile != nil {
            throw ValidationError("--password-env is for --key or --pkcs12; a .p8 --key-file has no password")
        }
        if let passwordEnv, ProcessInfo.processInfo.environment[passwordEnv] == nil {
            throw ValidationError("--password-env \(passwordEnv): that environment variable is not set")
        }
    }

    func run() async throws {
        var logger = Logger(label: "apns-fleet.send")
        logger.logLevel = .warning
        let configuration = try makeConfiguration()
        let pool = try APNsClientPool(configuration: configuration, logger: logger)
        let notification = APNsNotification(
            deviceToken: token,
            topic: topic,
            pushType: PushType(rawValue: pushType),
            priority: priority.flatMap { NotificationPriority(rawValue: $0) },
            expiration: expiration,
            collapseID: collapseID,
            apnsID: apnsID,
            payload: RawJSON(bytes: try readPayload()[...])
        )
        let timeout = Duration.milliseconds(Int64(self.timeout * 1000))
        let quiet = json
        let total = count

        let summary = await withTaskGroup(of: Void.self) { group -> Summary in
            group.addTask { try? await pool.run() }
            defer { pool.shutdown() }
            // Wait for the first connection, or its failure, before timing anything.
            let readyBy = ContinuousClock.now + timeout
            while pool.statistics.usableConnections == 0, pool.connectError == nil, ContinuousClock.now < readyBy {
                try? await Task.sleep(for: .milliseconds(5))
            }
            if pool.statistics.usableConnections == 0 {
                return Summary(samples: [], elapsed: .zero, cpu: 0, peakRSSKilobytes: 0, configurationError: pool.connectError ?? pool.configurationError)
            }
            // Warm-up: the same load, not measured (connections settle, buffers and caches fill).
            if warmup > 0 {
                _ = await LoadRun(pool: pool, notification: notification, timeout: timeout, total: warmup, printEach: false).run(concurrency: concurrency)
            }
            let startUsage = ProcessUsage.now()
            let start = ContinuousClock.now
            let results = await LoadRun(pool: pool, notification: notification, timeout: timeout, total: total, printEach: !quiet).run(concurrency: concurrency)
            let elapsed = ContinuousClock.now - start
            let usage = ProcessUsage.now()
            return Summary(samples: results, elapsed: elapsed, cpu: usage.cpuSeconds - startUsage.cpuSeconds, peakRSSKilobytes: usage.peakRSSKilobytes, configurationError: pool.configurationError)
        }
        if summary.samples.isEmpty {
            // Not connected: the error below says why.
        } else if json {
            print(summary.json(connections: connections, concurrency: concurrency))
        } else if count > 1 {
            print(summary.text)
        }
        if let error = summary.configurationError {
            var text = "\(error)"
            if host != nil, caFile == nil, text.contains("CERTIFICATE_VERIFY_FAILED") {
                text += "\n(a simulator's certificate? pass --ca-file with the CA that signed it, such as ./dev/ca.pem from dev-credentials)"
            }
            FileHandle.standardError.write(Data("\(text)\n".utf8))
        } else if summary.samples.isEmpty {
            // The wait ended before the connection attempt failed (packets silently dropped, say).
            let endpoint = configuration.endpoint
            FileHandle.standardError.write(Data("no connection to \(endpoint.host):\(endpoint.port) within \(self.timeout) s (--timeout); nothing was sent\n".utf8))
        }
        if summary.samples.isEmpty || summary.samples.contains(where: { $0.status != 200 }) { throw ExitCode(1) }
    }

    private func makeConfiguration() throws -> APNsClientConfiguration {
        let endpoint: AppConfiguration.Endpoint
        // The flags' combinations were checked in validate().
        if let host {
            endpoint = .custom(host: host, port: port ?? 443, caFile: caFile)
        } else {
            endpoint = environment == "production" ? .production : .sandbox
        }
        let password = passwordEnv.flatMap { ProcessInfo.processInfo.environment[$0] }
        let authentication: APNsAuthentication
        if let keyFile, let keyID, let teamID {
            authentication = try APNsAuthentication.loadToken(keyFile: keyFile, keyID: keyID, teamID: teamID)
        } else if let cert, let key {
            authentication = try APNsAuthentication.loadPEM(certificateFile: cert, privateKeyFile: key, password: password)
        } else if let pkcs12 {
            authentication = try APNsAuthentication.loadPKCS12(file: pkcs12, password: password)
        } else {
            throw UsageError("give exactly one of --key-file (token auth), --cert (PEM) or --pkcs12")
        }
        var configuration = APNsClientConfiguration(endpoint: endpoint, authentication: authentication)
        configuration.name = "send"
        configuration.connections = connections
        try configuration.validate()
        return configuration
    }

    private func readPayload() throws -> [UInt8] {
        guard payload.hasPrefix("@") else { return Array(payload.utf8) }
        let path = String(payload.dropFirst())
        guard let data = FileManager.default.contents(atPath: path) else { throw UsageError("cannot read the payload file \(path)") }
        return Array(data)
    }

    static func line(index: Int, total: Int, outcome: APNsOutcome) -> String {
        let prefix = total > 1 ? "[\(index + 1)/\(total)] " : ""
        switch outcome {
        case .answered(let response):
            var parts = ["\(response.status)"]
            if let reason = response.reason { parts.append(reason.rawValue) }
            if let timestamp = response.timestamp { parts.append("timestamp=\(timestamp)") }
            parts.append("apns-id=\(response.apnsID ?? "-")")
            if let unique = response.apnsUniqueID { parts.append("apns-unique-id=\(unique)") }
            parts.append(String(format: "%.2fms", Sample.milliseconds(response.latency)))
            return prefix + parts.joined(separator: " ")
        case .notAnswered(let why):
            return prefix + "no answer: \(why)"
        }
    }
}

/// Sends `total` notifications with at most `concurrency` in flight, through the pool's
/// `submit`: each outcome records its sample and submits the next request, so no task waits per
/// request (the way the push worker drives the client).
private final class LoadRun: APNsOutcomeReceiver {
    private struct State {
        var submitted = 0
        var samples: [Sample] = []
        var finished: CheckedContinuation<[Sample], Never>?
    }

    private let pool: APNsClientPool
    private let notification: APNsNotification
    private let timeout: TimeAmount
    private let total: Int
    private let printEach: Bool
    private let state = Mutex(State())

    init(pool: APNsClientPool, notification: APNsNotification, timeout: Duration, total: Int, printEach: Bool) {
        self.pool = pool
        self.notification = notification
        self.timeout = TimeAmount(timeout)
        self.total = total
        self.printEach = printEach
    }

    func run(concurrency: Int) async -> [Sample] {
        await withCheckedContinuation { continuation in
            let first = state.withLock { state -> Int in
                state.finished = continuation
                state.samples.reserveCapacity(total)
                state.submitted = min(concurrency, total)
                return state.submitted
            }
            for index in 0..<first { submit(index) }
        }
    }

    private func submit(_ index: Int) {
        pool.submit(notification, deadline: .now() + timeout, to: self, tag: index)
    }

    func receive(_ outcome: APNsOutcome, tag: Int) {
        if printEach { print(SendCommand.line(index: tag, total: total, outcome: outcome)) }
        let sample = Sample(outcome: outcome)
        let (next, done) = state.withLock { state -> (Int?, (CheckedContinuation<[Sample], Never>, [Sample])?) in
            state.samples.append(sample)
            if state.samples.count == total, let finished = state.finished {
                state.finished = nil
                return (nil, (finished, state.samples))
            }
            guard state.submitted < total else { return (nil, nil) }
            state.submitted += 1
            return (state.submitted - 1, nil)
        }
        if let next { submit(next) }
        if let (continuation, samples) = done { continuation.resume(returning: samples) }
    }
}

private struct Sample: Sendable {
    let status: Int?
    let latencyMilliseconds: Double?

    init(outcome: APNsOutcome) {
        switch outcome {
        case .answered(let response):
            status = response.status
            latencyMilliseconds = Self.milliseconds(response.latency)
        case .notAnswered:
            status = nil
            latencyMilliseconds = nil
        }
    }

    static func milliseconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
    }
}

private struct Summary {
    let samples: [Sample]
    let elapsed: Duration
    let cpu: Double
    let peakRSSKilobytes: Int
    let configurationError: APNsClientError?

    private var seconds: Double { Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18 }
    private var latencies: [Double] { samples.compactMap(\.latencyMilliseconds).sorted() }

    private func percentile(_ p: Double) -> Double {
        let sorted = latencies
        guard !sorted.isEmpty else { return 0 }
        let rank = max(0, Int((Double(sorted.count) * p).rounded(.up)) - 1)
        return sorted[min(sorted.count - 1, rank)]
    }

    private var statuses: [String: Int] {
        var counts: [String: Int] = [:]
        for sample in samples { counts[sample.status.map(String.init) ?? "none", default: 0] += 1 }
        return counts
    }

    func json(connections: Int, concurrency: Int) -> String {
        let statusText = statuses.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ",")
        return String(
            format: #"{"notifications":%d,"connections":%d,"concurrency":%d,"seconds":%.3f,"notifications_per_second":%.0f,"cpu_us_per_notification":%.2f,"p50_ms":%.3f,"p99_ms":%.3f,"peak_rss_mb":%.1f,"statuses":{%@}}"#,
            samples.count, connections, concurrency, seconds, Double(samples.count) / max(seconds, 1e-9),
            cpu * 1e6 / Double(max(samples.count, 1)), percentile(0.5), percentile(0.99), Double(peakRSSKilobytes) / 1024, statusText
        )
    }

    var text: String {
        String(format: "%d notifications in %.3f s (%.0f/s), p50 %.2f ms, p99 %.2f ms; statuses: %@",
               samples.count, seconds, Double(samples.count) / max(seconds, 1e-9), percentile(0.5), percentile(0.99),
               statuses.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }.joined(separator: " "))
    }
}

