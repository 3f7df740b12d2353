import APNsSimulator
import FleetTestSupport
import Foundation
import NIOCore
import NIOPosix
import Testing

/// `apns-fleet validate-job` as a producer runs it: the built binary, its output and exit status.
@Suite("validate-job")
struct ValidateJobCommandTests {
    private static let token = String(repeating: "ab", count: 32)

    /// Runs validate-job with `arguments` in a fresh directory holding `files`; the output
    /// lines (standard output and error) and the exit status.
    private func run(_ arguments: [String], files: [String: String]) async throws -> (lines: [String], status: Int32) {
        let directory = temporaryTestPath("apns-fleet-validate")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for (name, text) in files {
            try text.write(toFile: (directory as NSString).appendingPathComponent(name), atomically: true, encoding: .utf8)
        }
        let command = ChildProcess("/bin/sh", ["-c", #"cd "$1" && shift && exec "$0" validate-job "$@" 2>&1"#, try apnsFleetBinary(), directory] + arguments)
        try command.start()
        command.closeInput()
        let status = try await command.waitForExit(timeout: 30)
        return (command.lines.value, status)
    }

    private static let jobs = """
        {"token":"\(token)","payload":{}}
        {"tokens":["\(token)01","\(token)02","\(token)03"],"payload":{}}
        {"token":"\(String(repeating: "ab", count: 40))","app":"legacy","payload":{}}
        {"token":"zz","payload":{}}
        """

    /// Keys and certificates need not exist to validate jobs: nothing is signed or connected.
    private static let fleet = """
        apps: [example, legacy]
        default-app: example
        worker:
          max-tokens-per-job: 2
        app:
          example:
            key-file: /nonexistent/AuthKey.p8
            key-id: ABC123DEFG
            team-id: DEF123GHIJ
            topic: com.example.app
          legacy:
            auth: certificate
            certificate-file: /nonexistent/client.pem
            private-key-file: /nonexistent/client-key.pem
            protocol: binary
            legacy-gateway: 127.0.0.1:2295
            legacy-tls: false
            topic: com.example.legacy
        """

    @Test("without a configuration: the contract's rules, exit 1 when a job is invalid")
    func contractOnly() async throws {
        let (lines, status) = try await run(["jobs.jsonl"], files: ["jobs.jsonl": Self.jobs])
        #expect(lines == [
            "line 1: valid (1 token, payload 2 bytes)",
            "line 2: valid (3 tokens, payload 2 bytes)",
            "line 3: valid (1 token, app legacy, payload 2 bytes)",
            "line 4: invalid: token: device token is not hex: character 1 is 'z'",
            "3 valid, 1 invalid",
        ])
        #expect(status == 1)
    }

    @Test("with a configuration: the worker's intake, so its token limit and binary-interface limits apply")
    func workerIntake() async throws {
        let (lines, status) = try await run(["--config", "fleet.yaml", "jobs.jsonl"], files: ["jobs.jsonl": Self.jobs, "fleet.yaml": Self.fleet])
        #expect(lines.first == "line 1: valid (1 token, topic com.example.app, app example, payload 2 bytes)", "\(lines)")
        #expect(lines.contains("line 2: invalid: tokens: 3 tokens in one job; at most 2 are allowed"), "\(lines)")
        #expect(lines.contains { $0.hasPrefix("line 3: invalid: token: device token ") && $0.hasSuffix(" is 40 bytes; the legacy binary interface takes 32") }, "\(lines)")
        #expect(lines.last == "1 valid, 3 invalid")
        #expect(status == 1)

        let raised = try await run(["--config", "fleet.yaml", "--max-tokens", "5", "jobs.jsonl"], files: ["jobs.jsonl": Self.jobs, "fleet.yaml": Self.fleet])
        #expect(raised.lines.contains { $0.hasPrefix("line 2: valid (3 tokens") }, "--max-tokens overrides the configuration: \(raised.lines)")
    }

    @Test("a configuration that does not load, or a --max-tokens no worker allows, is a usage error naming the problem")
    func badConfiguration() async throws {
        let missing = try await run(["--config", "nothere.yaml", "jobs.jsonl"], files: ["jobs.jsonl": Self.jobs])
        #expect(missing.status == 2)
        #expect(missing.lines.contains { $0.contains("nothere.yaml") }, "\(missing.lines)")

        let broken = try await run(["--config", "fleet.yaml", "jobs.jsonl"], files: ["jobs.jsonl": Self.jobs, "fleet.yaml": "apps: [a]\n"])
        #expect(broken.status == 2)
        #expect(broken.lines.contains { $0.contains("app.a.key-file") }, "\(broken.lines)")

        // A limit no worker can be configured with would pass jobs every worker refuses.
        let unreachable = try await run(["--max-tokens", "10000", "jobs.jsonl"], files: ["jobs.jsonl": Self.jobs])
        #expect(unreachable.status == 2)
        #expect(unreachable.lines.contains { $0.contains("--max-tokens must be 1 to 7500") }, "\(unreachable.lines)")
    }
}

/// `apns-fleet send` checks what it would put into headers and `:path` before connecting.
@Suite("send: input checks")
struct SendCommandInputTests {
    @Test("a topic with CR/LF or a token with a slash is refused, naming the flag, before any connection")
    func headerInjectionRefused() async throws {
        let token = String(repeating: "ab", count: 32)
        let common = ["--host", "127.0.0.1", "--port", "1", "--ca-file", "/nonexistent", "--key-file", "/nonexistent",
                      "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ", "--payload", "{}"]
        for (arguments, expected) in [
            (["--token", token, "--topic", "com.example\r\nX-Injected: 1"], "--topic: topic contains control character U+000D"),
            (["--token", "ab/../cd", "--topic", "com.example.app"], "--token: device token is not hex"),
        ] {
            // Through a shell, for the error on standard error.
            let command = ChildProcess("/bin/sh", ["-c", #"exec "$0" send "$@" 2>&1"#, try apnsFleetBinary()] + arguments + common)
            try command.start()
            command.closeInput()
            let status = try await command.waitForExit(timeout: 30)
            #expect(status != 0)
            #expect(command.lines.value.contains { $0.contains(expected) }, "\(command.lines.value)")
        }
    }
}

extension SendCommandInputTests {
    @Test("a server that never answers the TLS handshake: send says so within --timeout, exit 1")
    func noConnectionWithinTimeout() async throws {
        let directory = temporaryTestPath("apns-fleet-send")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let summary = try DevCredentials.generate(topic: "com.example.app").write(to: directory)
        // Accepts TCP, reads and drops every byte: the handshake neither completes nor fails.
        let silent = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        defer { silent.close(promise: nil) }
        let port = try #require(silent.localAddress?.port)
        let command = ChildProcess("/bin/sh", ["-c", #"cd "$1" && shift && exec "$0" send "$@" 2>&1"#, try apnsFleetBinary(), directory,
            "--host", "127.0.0.1", "--port", "\(port)", "--ca-file", summary.caFile, "--key-file", summary.signingKeyFile,
            "--key-id", summary.keyID, "--team-id", summary.teamID, "--topic", summary.topic,
            "--token", String(repeating: "ab", count: 32), "--payload", "{}", "--timeout", "0.5"])
        try command.start()
        command.closeInput()
        let status = try await command.waitForExit(timeout: 30)
        #expect(status == 1, "\(command.lines.value)")
        #expect(command.lines.value.contains("no connection to 127.0.0.1:\(port) within 0.5 s (--timeout); nothing was sent"), "\(command.lines.value)")
    }
}

/// `apns-fleet publish --file` reads its input as bytes, line by line, before it connects.
@Suite("publish: input checks")
struct PublishCommandInputTests {
    @Test("a file is read line by line (CRLF, a byte order mark) and checked by the worker's rules; invalid UTF-8 is refused, not replaced")
    func crlfAndInvalidUTF8() async throws {
        let token = String(repeating: "ab", count: 32)
        let directory = temporaryTestPath("apns-fleet-publish")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let good = Array(#"{"token":"\#(token)","payload":{}}"#.utf8)
        let cases: [(String, [UInt8], String)] = [
            ("crlf.jsonl", good + Array("\r\n".utf8) + Array(#"{"token":"zz","payload":{}}"#.utf8) + Array("\r\n".utf8), "line 2: "),
            ("latin1.jsonl", Array(#"{"token":"\#(token)","payload":{"alert":"caf"#.utf8) + [0xE9] + Array(#""}}"#.utf8) + [0x0A], "line 1: "),
            // The worker's rules, not only the decoder's: an alert's payload limit is 4096 bytes.
            ("big-alert.jsonl", good + [0x0A] + Array(#"{"token":"\#(token)","payload":{"aps":{"alert":"\#(String(repeating: "x", count: 4500))"}}}"#.utf8), "line 2: "),
            // A byte order mark is not part of the first job.
            ("bom.jsonl", [0xEF, 0xBB, 0xBF] + good + [0x0A] + Array(#"{"token":"zz","payload":{}}"#.utf8), "line 2: "),
        ]
        for (name, bytes, expected) in cases {
            let path = (directory as NSString).appendingPathComponent(name)
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            // Port 1: nothing listens there; the input is refused before any connection.
            let command = ChildProcess("/bin/sh", ["-c", #"exec "$0" publish --brokers 127.0.0.1:1 --file "$1" 2>&1"#, try apnsFleetBinary(), path])
            try command.start()
            command.closeInput()
            let status = try await command.waitForExit(timeout: 30)
            #expect(status != 0)
            #expect(command.lines.value.contains { $0.contains(expected) && $0.contains("nothing was published") }, "\(name): \(command.lines.value)")
        }
    }

    @Test("a line Kafka's producer refuses at once (over message.max.bytes) fails alone: the rest is published and the counts are told")
    func oversizeLineFailsAlone() async throws {
        let binary = try apnsFleetBinary()
        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: 1)
        defer { kafka.process.kill() }
        let path = temporaryTestPath("apns-fleet-publish") + ".jsonl"
        let token = String(repeating: "ab", count: 32)
        let good = #"{"token":"\#(token)","payload":{}}"#
        let huge = #"{"token":"\#(token)","payload":{"x":"\#(String(repeating: "x", count: 2_000_000))"}}"#
        try [good, huge, good].joined(separator: "\n").write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let command = ChildProcess("/bin/sh", ["-c", #"exec "$0" publish --brokers "$1" --no-validate --file "$2" 2>&1"#, binary, kafka.bootstrap, path])
        try command.start()
        command.closeInput()
        let status = try await command.waitForExit(timeout: 60)
        #expect(status == 1, "\(command.lines.value)")
        #expect(command.lines.value.contains { $0.contains("published 2 jobs") }, "\(command.lines.value)")
        #expect(command.lines.value.contains { $0.contains("1 jobs were not accepted by Kafka") }, "\(command.lines.value)")
    }

    @Test("a librdkafka property it refuses is a configuration error: exit 2, naming the property")
    func refusedKafkaProperty() async throws {
        let command = ChildProcess("/bin/sh", [
            "-c", #"echo '{"token":"'"$1"'","payload":{}}' | exec "$0" publish --brokers 127.0.0.1:1 --set "kafka.properties=linger.ms=soon" --file - 2>&1"#,
            try apnsFleetBinary(), String(repeating: "ab", count: 32),
        ])
        try command.start()
        command.closeInput()
        let status = try await command.waitForExit(timeout: 30)
        #expect(status == 2, "\(command.lines.value)")
        #expect(command.lines.value.contains { $0.contains("linger.ms") }, "\(command.lines.value)")
    }

    @Test("a TLS file librdkafka cannot load is a configuration error too: exit 2, naming the settings")
    func unusableCAFile() async throws {
        let path = temporaryTestPath("apns-fleet-not-a-ca") + ".pem"
        try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let command = ChildProcess("/bin/sh", [
            "-c", #"echo '{"token":"'"$1"'","payload":{}}' | exec "$0" publish --brokers 127.0.0.1:1 --set kafka.security-protocol=ssl --set "kafka.ssl.ca-file=$2" --file - 2>&1"#,
            try apnsFleetBinary(), String(repeating: "ab", count: 32), path,
        ])
        try command.start()
        command.closeInput()
        let status = try await command.waitForExit(timeout: 30)
        #expect(status == 2, "\(command.lines.value)")
        #expect(command.lines.value.contains { $0.contains("kafka.ssl.*") && $0.contains("ssl.ca.location") }, "\(command.lines.value)")
    }
}
