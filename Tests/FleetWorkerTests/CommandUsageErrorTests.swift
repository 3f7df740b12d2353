import FleetTestSupport
import Foundation
import Testing

/// Bad arguments to the built binary: refused before anything starts, with exit status 2 and a
/// message that names the flag.
@Suite("Command usage errors")
struct CommandUsageErrorTests {
    private static let token = String(repeating: "ab", count: 32)

    struct Case: Sendable, CustomTestStringConvertible {
        let arguments: [String]
        let message: String
        var testDescription: String { arguments.joined(separator: " ") }
    }

    static let cases: [Case] = [
        Case(arguments: ["publish", "--brokers", "127.0.0.1:9092", "--generate", "10", "--mix", "good=1,bogus=2"], message: "--mix: job mix:"),
        Case(arguments: ["demo", "--mix", "good=0"], message: "--mix: job mix:"),
        Case(arguments: ["bench", "e2e", "--mix", "bogus=1"], message: "--mix: job mix:"),
        Case(arguments: ["demo", "--brokers", "kafka:abc"], message: "--brokers \"kafka:abc\" has port \"abc\"; it must be 1 to 65535"),
        Case(arguments: ["demo", "--brokers", "ssl://kafka:9093"], message: "--brokers \"ssl://kafka:9093\" says ssl, but kafka.security-protocol is plaintext"),
        Case(arguments: ["demo", "--token", token], message: "--token needs --config"),
        Case(arguments: ["demo", "--metrics-port", "0"], message: "--metrics-port must be 1 to 65534"),
        Case(arguments: ["bench", "e2e", "--apns-latency-ms=-5"], message: "--apns-latency-ms must be 0 to 86400000"),
        Case(arguments: ["bench", "e2e", "--worker-set", "nokey"], message: "--worker-set takes key=value"),
        Case(arguments: ["bench", "client", "--rtt-ms=-1"], message: "--rtt-ms must be 0 to 86400000"),
        Case(arguments: ["bench", "kafka", "--bootstrap", "kafka:abc"], message: "--bootstrap \"kafka:abc\" has port \"abc\""),
        Case(arguments: ["dev-credentials", "--out", "unused", "--topic", "bad topic"], message: "--topic must be a bundle id"),
        Case(arguments: ["dev-credentials", "--out", "unused", "--team-id", "bad id!!!!"], message: "--team-id must be 10 letters or digits (A-Z, a-z, 0-9), \"bad id!!!!\" has other characters"),
        Case(
            arguments: ["send", "--port", "2197", "--token", token, "--key-file", "k.p8", "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ"],
            message: "--port goes with --host"
        ),
        Case(
            arguments: ["send", "--host", "127.0.0.1", "--port", "99999", "--token", token, "--key-file", "k.p8", "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ"],
            message: "--port must be 1 to 65535"
        ),
        Case(arguments: ["validate-job", "--config", "empty.yaml", "jobs.jsonl"], message: "no app is configured in empty.yaml"),
        Case(arguments: ["demo", "--config", "fleet.yaml", "--token", token, "--mix", "good=1,fanout=1"], message: "--mix fanout needs the simulator's dead tokens"),
        Case(arguments: ["kafka-dev", "--topic", "apns.jobs,apns.results"], message: "--topic \"apns.jobs,apns.results\": a Kafka topic name may only use letters, digits, '.', '_' and '-', not ','"),
        Case(arguments: ["kafka-dev", "--topic", "apns.jobs", "--topic", "apns.jobs"], message: "--topic apns.jobs is given twice"),
    ]

    @Test("refused with exit status 2, naming the flag", arguments: cases)
    func refused(_ item: Case) async throws {
        let directory = temporaryTestPath("apns-fleet-usage")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "kafka:\n  group-id: usage\n".write(toFile: (directory as NSString).appendingPathComponent("empty.yaml"), atomically: true, encoding: .utf8)
        try "{\"token\":\"\(Self.token)\",\"payload\":{}}\n".write(toFile: (directory as NSString).appendingPathComponent("jobs.jsonl"), atomically: true, encoding: .utf8)
        let command = ChildProcess("/bin/sh", ["-c", #"cd "$1" && shift && exec "$0" "$@" 2>&1"#, try apnsFleetBinary(), directory] + item.arguments)
        try command.start()
        // One that started its run after all must not outlive the test.
        defer { command.kill() }
        command.closeInput()
        let status = try await command.waitForExit(timeout: 30)
        let output = command.lines.value.joined(separator: "\n")
        #expect(status == 2, "\(output)")
        #expect(output.contains(item.message), "\(output)")
        #expect(!output.contains("Fatal error"), "\(output)")
        // Nothing was started: no directory of a demo or bench run.
        #expect(!FileManager.default.fileExists(atPath: (directory as NSString).appendingPathComponent(".demo")))
        #expect(!FileManager.default.fileExists(atPath: (directory as NSString).appendingPathComponent(".bench")))
    }
}
