import Foundation
import KafkaTransport
import FleetTestSupport
import Testing

@Suite("kafka-dev as a process", .timeLimit(.minutes(3)))
struct KafkaDevProcessTests {
    @Test func kafkaDevServesKcatAndTakesFaultCommands() async throws {
        let binary = try apnsFleetBinary()
        let kcat = "/usr/bin/kcat"
        try #require(FileManager.default.isExecutableFile(atPath: kcat), "kcat is installed (apt-get install kcat)")
        let bootstrapFile = temporaryTestPath("kafka-dev") + ".bootstrap"
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

        // SIGTERM stops it cleanly, and takes its address out of the file: a script waiting for
        // the file must not read ports nobody listens on.
        dev.terminate()
        #expect(try await dev.waitForExit(timeout: 30) == 0)
        #expect(!FileManager.default.fileExists(atPath: bootstrapFile), "the bootstrap file outlived kafka-dev")
    }
}
