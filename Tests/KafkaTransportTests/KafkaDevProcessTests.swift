import Foundation
import KafkaTransport
import Testing

/// A child process whose stdout is collected line by line on a reader thread.
///
/// `@unchecked Sendable`: `Process` and `FileHandle` are used only through calls that are safe
/// from any thread (run, terminate, write, close); the output lines live in a `Shared`.
final class ChildProcess: @unchecked Sendable {
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    let lines = Shared<[String]>([])
    private let status = Shared<Int32?>(nil)

    init(_ executable: String, _ arguments: [String]) {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
    }

    func start() throws {
        process.terminationHandler = { [status] process in
            status.update { $0 = process.terminationStatus }
        }
        try process.run()
        let reader = output.fileHandleForReading
        let lines = self.lines
        let thread = Thread {
            var pending = Data()
            while true {
                let chunk = reader.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    lines.update { $0.append(line) }
                }
            }
            if !pending.isEmpty {
                let rest = String(decoding: pending, as: UTF8.self)
                lines.update { $0.append(rest) }
            }
        }
        thread.start()
    }

    func write(_ text: String) {
        input.fileHandleForWriting.write(Data(text.utf8))
    }

    func closeInput() {
        try? input.fileHandleForWriting.close()
    }

    /// Waits for the n-th line of output (1-based) and returns it.
    func line(_ number: Int, timeout: Double = 60) async throws -> String {
        try await waitUntil("output line \(number) of \(process.executableURL?.lastPathComponent ?? "child")", timeout: timeout) {
            lines.value.count >= number
        }
        return lines.value[number - 1]
    }

    func waitForExit(timeout: Double = 60) async throws -> Int32 {
        try await waitUntil("\(process.executableURL?.lastPathComponent ?? "child") to exit", timeout: timeout) {
            status.value != nil
        }
        return status.value ?? -1
    }

    /// Best-effort cleanup for `defer`.
    func kill() {
        if process.isRunning { Foundation.kill(process.processIdentifier, SIGKILL) }
    }
}

/// The `apns-fleet` executable built next to the test bundle.
func apnsFleetBinary() throws -> String {
    let candidates = [
        URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent(),
        Bundle.main.bundleURL.deletingLastPathComponent(),
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
    ]
    for directory in candidates {
        let path = directory.appendingPathComponent("apns-fleet").path
        if FileManager.default.isExecutableFile(atPath: path) { return path }
    }
    throw KafkaError(
        code: .invalidArgument,
        message: "apns-fleet is not built next to the tests (looked in \(candidates.map(\.path))); run `swift build` first"
    )
}

@Suite("kafka-dev as a process", .timeLimit(.minutes(3)))
struct KafkaDevProcessTests {
    @Test func kafkaDevServesKcatAndTakesFaultCommands() async throws {
        let binary = try apnsFleetBinary()
        let kcat = "/usr/bin/kcat"
        try #require(FileManager.default.isExecutableFile(atPath: kcat), "kcat is installed (apt-get install kcat)")
        let bootstrapFile = FileManager.default.temporaryDirectory
            .appendingPathComponent("kafka-dev-\(UUID().uuidString).bootstrap").path
        defer { try? FileManager.default.removeItem(atPath: bootstrapFile) }

        let dev = ChildProcess(binary, ["kafka-dev", "--brokers", "2", "--partitions", "3", "--bootstrap-file", bootstrapFile])
        defer { dev.kill() }
        try dev.start()
        let bootstrap = try await dev.line(1)
        #expect(bootstrap.split(separator: ",").count == 2)
        #expect(bootstrap.hasPrefix("127.0.0.1:"))
        let fileContents = try String(contentsOfFile: bootstrapFile, encoding: .utf8)
        #expect(fileContents == bootstrap + "\n")

        dev.write("rtt 1 5\n")
        #expect(try await dev.line(2) == "ok broker 1 rtt 5 ms")
        dev.write("broker-down 7\n")
        #expect(try await dev.line(3) == "error: no broker 7: brokers are 1...2")
        dev.write("request-errors Produce 2 NOT_LEADER_FOR_PARTITION\n")
        #expect(try await dev.line(4) == "ok next 2 Produce request(s) fail with NOT_LEADER_FOR_PARTITION")

        // An outside client produces (through the retriable errors just injected)...
        let producer = ChildProcess(kcat, ["-b", bootstrap, "-P", "-t", "apns.jobs", "-K:"])
        defer { producer.kill() }
        try producer.start()
        producer.write("k1:hello\nk2:world\nk3:third\n")
        producer.closeInput()
        #expect(try await producer.waitForExit() == 0)

        // ...our own producer too...
        var configuration = KafkaProducerConfiguration(client: KafkaClientConfiguration(bootstrapServers: [bootstrap]))
        configuration.client.statisticsInterval = nil
        let swiftProducer = try KafkaProducer(configuration: configuration, logger: testLogger)
        try await swiftProducer.send(KafkaOutgoingMessage(topic: "apns.jobs", key: "swift".bytes, value: "from-swift".bytes))
        await swiftProducer.shutdown(flushTimeout: .seconds(10))

        // ...and an outside client reads everything back.
        let consumer = ChildProcess(kcat, ["-b", bootstrap, "-C", "-t", "apns.jobs", "-o", "beginning", "-e", "-q", "-f", "%k=%s\\n"])
        defer { consumer.kill() }
        try consumer.start()
        consumer.closeInput()
        #expect(try await consumer.waitForExit() == 0)
        #expect(consumer.lines.value.sorted() == ["k1=hello", "k2=world", "k3=third", "swift=from-swift"])

        // SIGTERM stops it cleanly.
        dev.process.terminate()
        #expect(try await dev.waitForExit(timeout: 30) == 0)
    }
}
