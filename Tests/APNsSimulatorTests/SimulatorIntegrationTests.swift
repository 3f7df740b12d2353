import APNsCore
import Crypto
import FleetTestSupport
import Foundation
import ProcessLaunch
import Testing

@testable import APNsSimulator

/// Dev credentials in a fresh temporary directory, and tokens signed with them.
struct TestCredentials {
    let directory: String
    let credentials: DevCredentials
    let summary: DevCredentials.Summary

    static func make() throws -> TestCredentials {
        let directory = temporaryTestPath("apns-sim-tests")
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        return TestCredentials(directory: directory, credentials: credentials, summary: summary)
    }

    func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

    func token(issuedAt: Int64 = Int64(Date().timeIntervalSince1970)) throws -> String {
        try ProviderTokenSigner(privateKeyPEM: credentials.signingKeyPEM, keyID: credentials.keyID, teamID: credentials.teamID).token(issuedAt: issuedAt)
    }

    /// Same key id and team, another key: a forged signature.
    func forgedToken() throws -> String {
        try ProviderTokenSigner(key: P256.Signing.PrivateKey(), keyID: credentials.keyID, teamID: credentials.teamID).token(issuedAt: Int64(Date().timeIntervalSince1970))
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

/// Runs a child process with a time limit, collecting its output through a file (no pipe stalls).
enum ChildProcess {
    struct Output {
        let status: Int32
        let text: String
    }

    static func run(_ executable: String, _ arguments: [String], timeout: Duration = .seconds(60)) async throws -> Output {
        let outputPath = temporaryTestPath("apns-sim-child")
        defer { try? FileManager.default.removeItem(atPath: outputPath) }
        let process = try LaunchedProcess(
            executable: executable, arguments: arguments,
            standardOutput: .appending(toFile: outputPath), standardError: .appending(toFile: outputPath)
        )
        func text() -> String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            if ContinuousClock.now > deadline {
                process.terminate()
                try? await Task.sleep(for: .milliseconds(200))
                process.signal(SIGKILL)
                _ = await process.waitForExit()
                Issue.record("\(executable) did not finish within \(timeout)")
                return Output(status: -1, text: text())
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        return Output(status: process.termination?.status ?? -1, text: text())
    }
}

/// Starts a simulator for one test and always stops it.
func withSimulator(
    _ credentials: TestCredentials,
    _ configure: (inout APNsSimulatorConfiguration) -> Void = { _ in },
    _ body: (APNsSimulator) async throws -> Void
) async throws {
    var configuration = try credentials.credentials.simulatorConfiguration()
    configuration.listeners = .init(host: "127.0.0.1", http2TLSPort: 0, http2CleartextPort: 0, adminPort: 0)
    configure(&configuration)
    let simulator = try await APNsSimulator.start(configuration)
    do {
        try await body(simulator)
    } catch {
        await simulator.stop(gracePeriod: .milliseconds(200))
        throw error
    }
    await simulator.stop(gracePeriod: .milliseconds(200))
}

@Suite("Simulator driven by nghttp, h2load and aioapns", .serialized, .timeLimit(.minutes(3)))
struct SimulatorIntegrationTests {
    static let good = String(repeating: "ab", count: 32)
    static let unregistered = String(repeating: "cd", count: 32)
    static let bound = String(repeating: "ef", count: 32)
    static let unregisteredAt: Int64 = 1_767_225_600_123

    static func configure(_ configuration: inout APNsSimulatorConfiguration) {
        configuration.behaviour.unregisteredTokens = [unregistered: unregisteredAt]
        configuration.behaviour.deviceTopics = [bound: "com.example.other"]
    }

    static let nghttp = "/usr/bin/nghttp"
    static let h2load = "/usr/bin/h2load"

    struct Answer: CustomStringConvertible {
        let status: Int?
        let reason: String?
        let body: String
        let raw: String
        var description: String { "\(status.map(String.init) ?? "no status") \(reason ?? "") \(body)" }
    }

    /// One request with nghttp; the status comes from its verbose frame log, the body from its output.
    static func nghttpRequest(
        _ url: String,
        headers: [String: String] = [:],
        extraHeaders: [String] = [],
        payload: String? = #"{"aps":{"alert":"hello"}}"#,
        options: [String] = [],
        directory: String
    ) async throws -> Answer {
        var arguments = ["-v"] + options
        if let payload {
            let file = (directory as NSString).appendingPathComponent("payload-\(UUID().uuidString).json")
            try payload.write(toFile: file, atomically: true, encoding: .utf8)
            arguments += ["-d", file]
        }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { arguments += ["-H", "\(name): \(value)"] }
        for header in extraHeaders { arguments += ["-H", header] }
        arguments.append(url)
        let output = try await ChildProcess.run(nghttp, arguments, timeout: .seconds(20))
        let text = output.text
        var status: Int?
        if let range = text.range(of: #":status: (\d+)"#, options: .regularExpression) {
            status = Int(text[range].split(separator: " ").last ?? "")
        }
        var reason: String?
        if let range = text.range(of: #""reason":"[A-Za-z]+""#, options: .regularExpression) {
            reason = text[range].split(separator: "\"").dropFirst(2).first.map(String.init)
        }
        let body = text.split(separator: "\n").filter { $0.hasPrefix("{") }.joined(separator: "\n")
        return Answer(status: status, reason: reason, body: body, raw: text)
    }

    @Test("nghttp over h2c and TLS: 200, 410 with timestamp, the 400 reasons, 403, 404, 405, 413")
    func nghttpAnswers() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, Self.configure) { simulator in
            let h2c = try #require(simulator.port(.http2Cleartext))
            let tls = try #require(simulator.port(.http2TLS))
            let token = try credentials.token()
            let auth = ["authorization": "bearer \(token)", "apns-topic": "com.example.app"]
            let base = "http://127.0.0.1:\(h2c)/3/device/"
            let directory = credentials.directory

            struct Case {
                let name: String
                let url: String
                var headers: [String: String]
                var extraHeaders: [String] = []
                var payload: String? = #"{"aps":{"alert":"hello"}}"#
                let status: Int
                let reason: String?
            }
            var cases = [
                Case(name: "accepted", url: base + Self.good, headers: auth, status: 200, reason: nil),
                Case(name: "unregistered", url: base + Self.unregistered, headers: auth, status: 410, reason: "Unregistered"),
                Case(name: "bad token", url: base + "0123", headers: auth, status: 400, reason: "BadDeviceToken"),
                Case(name: "missing token", url: base, headers: auth, status: 400, reason: "MissingDeviceToken"),
                Case(name: "bad path", url: "http://127.0.0.1:\(h2c)/3/other/" + Self.good, headers: auth, status: 404, reason: "BadPath"),
                Case(name: "GET", url: base + Self.good, headers: auth, payload: nil, status: 405, reason: "MethodNotAllowed"),
                Case(name: "no topic", url: base + Self.good, headers: ["authorization": "bearer \(token)"], status: 400, reason: "MissingTopic"),
                Case(name: "other topic", url: base + Self.good, headers: auth.merging(["apns-topic": "com.other.app"]) { $1 }, status: 400, reason: "TopicDisallowed"),
                Case(name: "bound token", url: base + Self.bound, headers: auth, status: 400, reason: "DeviceTokenNotForTopic"),
                Case(name: "priority", url: base + Self.good, headers: auth.merging(["apns-priority": "7"]) { $1 }, status: 400, reason: "BadPriority"),
                Case(name: "expiration", url: base + Self.good, headers: auth.merging(["apns-expiration": "tomorrow"]) { $1 }, status: 400, reason: "BadExpirationDate"),
                Case(name: "apns-id", url: base + Self.good, headers: auth.merging(["apns-id": "nope"]) { $1 }, status: 400, reason: "BadMessageId"),
                Case(name: "collapse id", url: base + Self.good, headers: auth.merging(["apns-collapse-id": String(repeating: "x", count: 65)]) { $1 }, status: 400, reason: "BadCollapseId"),
                Case(name: "duplicate", url: base + Self.good, headers: auth, extraHeaders: ["apns-priority: 10", "apns-priority: 5"], status: 400, reason: "DuplicateHeaders"),
                Case(name: "empty payload", url: base + Self.good, headers: auth, payload: "", status: 400, reason: "PayloadEmpty"),
                // Over the SETTINGS_MAX_HEADER_LIST_SIZE (8000) the simulator advertises.
                Case(name: "header list too large", url: base + Self.good, headers: auth, extraHeaders: ["x-padding: " + String(repeating: "p", count: 9000)], status: 431, reason: "RequestHeaderFieldsTooLarge"),
                Case(name: "large payload", url: base + Self.good, headers: auth, payload: "{\"a\":\"" + String(repeating: "x", count: 4100) + "\"}", status: 413, reason: "PayloadTooLarge"),
                Case(name: "no token", url: base + Self.good, headers: ["apns-topic": "com.example.app"], status: 403, reason: "MissingProviderToken"),
                Case(name: "forged", url: base + Self.good, headers: auth.merging(["authorization": "bearer \(try credentials.forgedToken())"]) { $1 }, status: 403, reason: "InvalidProviderToken"),
                Case(
                    name: "expired", url: base + Self.good,
                    headers: auth.merging(["authorization": "bearer \(try credentials.token(issuedAt: Int64(Date().timeIntervalSince1970) - 7200))"]) { $1 },
                    status: 403, reason: "ExpiredProviderToken"
                ),
            ]
            // The same over TLS (ALPN h2).
            let tlsBase = "https://localhost:\(tls)/3/device/"
            cases.append(Case(name: "TLS accepted", url: tlsBase + Self.good, headers: auth, status: 200, reason: nil))
            cases.append(Case(name: "TLS GET", url: tlsBase + Self.good, headers: auth, payload: nil, status: 405, reason: "MethodNotAllowed"))
            cases.append(Case(name: "TLS forged", url: tlsBase + Self.good, headers: auth.merging(["authorization": "bearer \(try credentials.forgedToken())"]) { $1 }, status: 403, reason: "InvalidProviderToken"))
            cases.append(Case(name: "TLS unregistered", url: tlsBase + Self.unregistered, headers: auth, status: 410, reason: "Unregistered"))

            for (index, item) in cases.enumerated() {
                let answer = try await Self.nghttpRequest(item.url, headers: item.headers, extraHeaders: item.extraHeaders, payload: item.payload, directory: directory)
                if index == 0 {
                    // A token-auth connection starts with one stream and gets 1000 once a valid token arrived.
                    #expect(answer.raw.contains("SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1]"), "\(answer.raw)")
                    #expect(answer.raw.contains("SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1000]"), "\(answer.raw)")
                }
                if item.name == "bad token" || item.name == "bad path" {
                    // A valid provider token lifts the one-stream limit, whatever else is wrong.
                    #expect(answer.raw.contains("SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1000]"), "\(item.name): \(answer.raw)")
                }
                #expect(answer.status == item.status, "\(item.name): \(answer)")
                #expect(answer.reason == item.reason, "\(item.name): \(answer)")
                if item.status == 410 {
                    #expect(answer.body.contains("\"timestamp\":\(Self.unregisteredAt)"), "\(item.name): \(answer)")
                }
            }

            let snapshot = simulator.counters.snapshot()
            #expect(snapshot.count(status: 200) == 2)
            #expect(snapshot.count(status: 410) == 2)
            #expect(snapshot.count(reason: "InvalidProviderToken") == 2)
            #expect(snapshot.count(reason: "DuplicateHeaders") == 1)
            #expect(snapshot.totals.requests == cases.count)
            #expect(snapshot.totals.answered == cases.count)
        }
    }

    @Test("with a client certificate, authorization headers are ignored, repeated or not (Table 8-2)")
    func certificateIgnoresAuthorization() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, Self.configure) { simulator in
            let tls = try #require(simulator.port(.http2TLS))
            let answer = try await Self.nghttpRequest(
                "https://localhost:\(tls)/3/device/" + Self.good,
                headers: ["apns-topic": "com.example.app"],
                extraHeaders: ["authorization: bearer one", "authorization: bearer two"],
                options: ["--cert=" + credentials.path(credentials.summary.clientCertificateFile), "--key=" + credentials.path(credentials.summary.clientKeyFile)],
                directory: credentials.directory
            )
            #expect(answer.status == 200, "\(answer)")
            #expect(simulator.counters.snapshot().connections.first?.authentication == "certificate")
        }
    }

    @Test("h2load over h2c and TLS: every request answered 200, the token verified once per connection")
    func h2loadLoad() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        // h2load opens its 50 streams before the server's first SETTINGS can arrive and does not
        // retry refused streams, so the one-stream-until-authenticated rule is off for this load test.
        try await withSimulator(credentials, { $0.authentication.singleStreamUntilAuthenticated = false }) { simulator in
            let token = try credentials.token()
            let payload = credentials.path("payload.json")
            try #"{"aps":{"alert":"load"}}"#.write(toFile: payload, atomically: true, encoding: .utf8)
            let urls = [
                "http://127.0.0.1:\(try #require(simulator.port(.http2Cleartext)))/3/device/\(Self.good)",
                "https://127.0.0.1:\(try #require(simulator.port(.http2TLS)))/3/device/\(Self.good)",
            ]
            for url in urls {
                let output = try await ChildProcess.run(Self.h2load, [
                    "-n", "3000", "-c", "1", "-m", "50", "-d", payload,
                    "-H", "apns-topic: com.example.app", "-H", "authorization: bearer \(token)", url,
                ])
                #expect(output.status == 0, "\(output.text)")
                #expect(output.text.contains("3000 succeeded"), "\(url): \(output.text)")
                #expect(output.text.contains("status codes: 3000 2xx"), "\(url): \(output.text)")
            }
            let snapshot = simulator.counters.snapshot()
            #expect(snapshot.count(status: 200) == 6000)
            #expect(snapshot.totals.answered == 6000)
            #expect(snapshot.totals.streamsReset == 0)
            #expect(snapshot.connections.count == 2)
            for connection in snapshot.connections {
                #expect(connection.counts.tokenVerifications == 1)
                #expect(connection.counts.byStatus["200"] == 3000)
            }
            #expect(snapshot.connections.map(\.transport).sorted() == ["h2", "h2c"])
        }
    }

    @Test("h2load: per-device 429, 500 and 503 rates, exact counts")
    func injectedFailures() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        let token = try credentials.token()
        let payload = credentials.path("payload.json")
        try #"{"aps":{"alert":"x"}}"#.write(toFile: payload, atomically: true, encoding: .utf8)
        try await withSimulator(credentials, {
            $0.behaviour.perDeviceLimit = 7
            $0.behaviour.perDeviceWindow = .seconds(600)
        }) { simulator in
            let url = "http://127.0.0.1:\(try #require(simulator.port(.http2Cleartext)))/3/device/\(Self.good)"
            let output = try await ChildProcess.run(Self.h2load, ["-n", "20", "-c", "1", "-m", "1", "-d", payload, "-H", "apns-topic: com.example.app", "-H", "authorization: bearer \(token)", url])
            #expect(output.text.contains("status codes: 7 2xx, 0 3xx, 13 4xx, 0 5xx"), "\(output.text)")
            #expect(simulator.counters.snapshot().count(reason: "TooManyRequests") == 13)
        }
        try await withSimulator(credentials, {
            $0.behaviour.internalServerErrorRate = 0.5
            $0.behaviour.serviceUnavailableRate = 0.5
        }) { simulator in
            let url = "http://127.0.0.1:\(try #require(simulator.port(.http2Cleartext)))/3/device/\(Self.good)"
            let output = try await ChildProcess.run(Self.h2load, ["-n", "200", "-c", "1", "-m", "1", "-d", payload, "-H", "apns-topic: com.example.app", "-H", "authorization: bearer \(token)", url])
            #expect(output.text.contains("status codes: 0 2xx, 0 3xx, 0 4xx, 200 5xx"), "\(output.text)")
            let snapshot = simulator.counters.snapshot()
            #expect(snapshot.count(reason: "InternalServerError") + snapshot.count(reason: "ServiceUnavailable") == 200)
            #expect(snapshot.count(reason: "InternalServerError") > 50)
            #expect(snapshot.count(reason: "ServiceUnavailable") > 50)
        }
    }

    static let python = "/usr/bin/python3"

    static var aioapnsScript: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/aioapns-check.py").path
    }

    struct AioResult: Decodable {
        let token: String
        let status: Int
        let reason: String?
        let apns_id_matches: Bool
    }

    static func aioapns(_ spec: [String: Any], directory: String) async throws -> [AioResult] {
        let specPath = (directory as NSString).appendingPathComponent("aioapns-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: spec).write(to: URL(fileURLWithPath: specPath))
        let output = try await ChildProcess.run(python, [aioapnsScript, specPath], timeout: .seconds(60))
        guard output.status == 0, let line = output.text.split(separator: "\n").last(where: { $0.hasPrefix("[") }) else {
            Issue.record("aioapns failed (\(output.status)): \(output.text)")
            return []
        }
        return try JSONDecoder().decode([AioResult].self, from: Data(line.utf8))
    }

    @Test("aioapns: token auth over TLS without ALPN, certificate auth with ALPN, forged key")
    func aioapnsClient() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, Self.configure) { simulator in
            let port = try #require(simulator.port(.http2TLS))
            let requests: [[String: Any]] = [
                ["token": Self.good],
                ["token": Self.unregistered],
                ["token": "123"],
                ["token": Self.good, "push_type": "background"],
                ["token": Self.good],
            ]
            let tokenSpec: [String: Any] = [
                "port": port, "ca_file": credentials.path(credentials.summary.caFile), "topic": "com.example.app",
                "key_file": credentials.path(credentials.summary.signingKeyFile),
                "key_id": credentials.summary.keyID, "team_id": credentials.summary.teamID,
                "requests": requests,
            ]
            let results = try await Self.aioapns(tokenSpec, directory: credentials.directory)
            #expect(results.map(\.status) == [200, 410, 400, 400, 200])
            #expect(results.map(\.reason) == [nil, "Unregistered", "BadDeviceToken", "BadPriority", nil])
            #expect(results.allSatisfy { $0.apns_id_matches })

            var certificateSpec = tokenSpec
            certificateSpec["key_file"] = nil
            certificateSpec["client_cert"] = credentials.path(credentials.summary.clientBundleFile)
            certificateSpec["alpn"] = true
            certificateSpec["requests"] = [["token": Self.good], ["token": Self.unregistered]]
            let certificateResults = try await Self.aioapns(certificateSpec, directory: credentials.directory)
            #expect(certificateResults.map(\.status) == [200, 410])

            let forgedKey = credentials.path("forged.p8")
            try P256.Signing.PrivateKey().pemRepresentation.write(toFile: forgedKey, atomically: true, encoding: .utf8)
            var forgedSpec = tokenSpec
            forgedSpec["key_file"] = forgedKey
            forgedSpec["requests"] = [["token": Self.good]]
            let forged = try await Self.aioapns(forgedSpec, directory: credentials.directory)
            #expect(forged.map(\.status) == [403])
            #expect(forged.map(\.reason) == ["InvalidProviderToken"])

            let snapshot = simulator.counters.snapshot()
            let byTransport = Dictionary(grouping: snapshot.connections, by: { "\($0.transport)/\($0.authentication)" }).mapValues(\.count)
            #expect(byTransport["h2-prior-knowledge/token"] == 2, "\(byTransport)")
            #expect(byTransport["h2/certificate"] == 1, "\(byTransport)")
        }
    }

    @Test("admin endpoint: counters while running, GOAWAY on demand; GOAWAY after N streams")
    func adminAndGoAway() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, {
            $0.behaviour.goAwayAfterStreams = 5
            $0.authentication.singleStreamUntilAuthenticated = false
        }) { simulator in
            let token = try credentials.token()
            let payload = credentials.path("payload.json")
            try #"{"aps":{"alert":"x"}}"#.write(toFile: payload, atomically: true, encoding: .utf8)
            let port = try #require(simulator.port(.http2Cleartext))
            // nghttp sends 8 requests (distinct tokens) on one connection; after 5 the server goes away.
            let urls = (0..<8).map { "http://127.0.0.1:\(port)/3/device/" + String(repeating: "a\($0)", count: 32) }
            let output = try await ChildProcess.run(Self.nghttp, ["-v", "-d", payload, "-H", "apns-topic: com.example.app", "-H", "authorization: bearer \(token)"] + urls)
            #expect(output.text.contains("GOAWAY"), "\(output.text)")
            #expect(output.text.contains(#"{"reason":"Shutdown"}"#), "\(output.text)")
            let snapshot = simulator.counters.snapshot()
            #expect(snapshot.totals.goAwaysSent == 1)
            #expect(snapshot.count(status: 200) >= 5)

            let admin = try #require(simulator.port(.admin))
            let fetch = try await ChildProcess.run(Self.python, ["-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:\(admin)/counters').read().decode())"])
            let decoded = try JSONDecoder().decode(SimulatorCountersSnapshot.self, from: Data(fetch.text.utf8))
            #expect(decoded.totals.byStatus["200"] == snapshot.count(status: 200))
        }
    }

    static var goAwayScript: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/h2-wait-goaway.py").path
    }

    struct GoAwaySeen: Decodable {
        let error_code: Int?
        let additional_data: String?
    }

    @Test("python h2 client: GOAWAY IdleTimeout after the idle timeout, GOAWAY on demand from the admin endpoint")
    func idleTimeoutAndOnDemandGoAway() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, { $0.behaviour.idleTimeout = .milliseconds(300) }) { simulator in
            let port = try #require(simulator.port(.http2Cleartext))
            let output = try await ChildProcess.run(Self.python, [Self.goAwayScript, String(port), "", "5"])
            let seen = try JSONDecoder().decode(GoAwaySeen.self, from: Data(output.text.utf8))
            #expect(seen.error_code == 0, "\(output.text)")
            #expect(seen.additional_data == #"{"reason":"IdleTimeout"}"#, "\(output.text)")
        }
        try await withSimulator(credentials) { simulator in
            let port = try #require(simulator.port(.http2Cleartext))
            let admin = try #require(simulator.port(.admin))
            let output = try await ChildProcess.run(Self.python, [Self.goAwayScript, String(port), "http://127.0.0.1:\(admin)/goaway?reason=Maintenance", "5"])
            let seen = try JSONDecoder().decode(GoAwaySeen.self, from: Data(output.text.utf8))
            #expect(seen.additional_data == #"{"reason":"Maintenance"}"#, "\(output.text)")
            #expect(simulator.counters.snapshot().totals.goAwaysSent == 1)
        }
    }

    @Test("latency is scheduled on the event loop: 50 concurrent requests with 200 ms latency finish together")
    func latencyDoesNotBlock() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, {
            $0.behaviour.latency = .milliseconds(200)
            $0.behaviour.latencyJitter = .milliseconds(20)
            $0.authentication.singleStreamUntilAuthenticated = false
        }) { simulator in
            let token = try credentials.token()
            let payload = credentials.path("payload.json")
            try #"{"aps":{"alert":"x"}}"#.write(toFile: payload, atomically: true, encoding: .utf8)
            let url = "http://127.0.0.1:\(try #require(simulator.port(.http2Cleartext)))/3/device/\(Self.good)"
            let started = ContinuousClock.now
            let output = try await ChildProcess.run(Self.h2load, ["-n", "50", "-c", "1", "-m", "50", "-d", payload, "-H", "apns-topic: com.example.app", "-H", "authorization: bearer \(token)", url])
            let elapsed = ContinuousClock.now - started
            #expect(output.text.contains("status codes: 50 2xx"), "\(output.text)")
            // Serialized answers would take 50 × 200 ms = 10 s.
            #expect(elapsed >= .milliseconds(200))
            #expect(elapsed < .seconds(6), "\(elapsed)")
        }
    }
}

/// The admin endpoint has no authentication: it must not take orders from web pages, nor keep
/// connections that outlive the simulator.
@Suite("Simulator admin endpoint", .timeLimit(.minutes(1)))
struct SimulatorAdminEndpointTests {
    /// Sends `request` and reads until the server closes or 5 s pass.
    static func exchange(_ socket: Int32, _ request: String) -> (closed: Bool, text: String) {
        let bytes = Array(request.utf8)
        guard bytes.withUnsafeBytes({ send(socket, $0.baseAddress, $0.count, 0) }) == bytes.count else { return (false, "") }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return (count == 0 || errno == ECONNRESET, String(decoding: received, as: UTF8.self)) }
            received += buffer[0..<count]
        }
    }

    @Test("a web page's request (Origin) is refused, HTTP/1.0 is closed after its answer, and kept-alive connections close when the simulator stops")
    func connectionRules() async throws {
        let credentials = try DevCredentials.generate()
        var configuration = try credentials.simulatorConfiguration()
        configuration.listeners = .init(host: "127.0.0.1", http2CleartextPort: 0, adminPort: 0)
        configuration.dumpSink = { _ in }
        let simulator = try await APNsSimulator.start(configuration)
        let port = try #require(simulator.port(.admin))

        let page = try connectTCP(port: port, receiveTimeoutSeconds: 5)
        defer { close(page) }
        let refused = Self.exchange(page, "POST /faults?error_503_rate=1 HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n")
        #expect(refused.text.hasPrefix("HTTP/1.1 403"), "\(refused.text)")
        #expect(simulator.counters.snapshot().totals.requests == 0)
        let faults = try httpRequest(method: "GET", port: port, path: "/faults")
        #expect(faults.body == "faults: none\n", "the page set faults")

        let old = try connectTCP(port: port, receiveTimeoutSeconds: 5)
        defer { close(old) }
        let answered = Self.exchange(old, "GET /healthz HTTP/1.0\r\n\r\n")
        #expect(answered.closed && answered.text.contains("ok"), "\(answered.text)")

        // A kept-alive connection, answered once, then left open.
        let kept = try connectTCP(port: port, receiveTimeoutSeconds: 5)
        defer { close(kept) }
        let request = Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
        #expect(request.withUnsafeBytes { send(kept, $0.baseAddress, $0.count, 0) } == request.count)
        var buffer = [UInt8](repeating: 0, count: 4096)
        #expect(buffer.withUnsafeMutableBytes { recv(kept, $0.baseAddress, $0.count, 0) } > 0)
        await simulator.stop(gracePeriod: .zero)
        let after = Self.exchange(kept, "POST /goaway HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(after.closed && after.text.isEmpty, "a stopped simulator's admin connection answered: \(after.text)")
    }
}
