import APNsCore
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

@testable import FleetWorker

@Suite("Admin probes watch the Kafka pipeline")
struct PipelineWatchTests {
    @Test("the admin endpoint closes a connection that does not complete a request in time, even one trickling bytes")
    func quietConnectionsAreClosed() async throws {
        var logger = Logger(label: "admin-idle-test")
        logger.logLevel = .critical
        let admin = AdminServer(
            host: "127.0.0.1", port: 0, logger: logger, metrics: { Array("up 1\n".utf8) },
            readiness: { .init(ready: true, detail: "fine") }, idleTimeout: .milliseconds(500)
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await admin.run() }
            try await waitUntil("the admin port") { admin.localPort != nil }
            let port = try #require(admin.localPort)
            try await Self.expectQuietConnectionsClosed(port: port)
            group.cancelAll()
        }
    }

    /// A connection that trickles bytes without completing a request, and one that goes quiet
    /// after its answer, are closed by the server (its request timeout is 500 ms).
    static func expectQuietConnectionsClosed(port: Int) async throws {
        for sendsRequest in [false, true] {
            let socket = try connectTCP(port: port, receiveTimeoutSeconds: 5)
            defer { close(socket) }
            let opened = ContinuousClock.now
            var received: [UInt8] = []
            var closedWhileTrickling = false
            if sendsRequest {
                let request = Array("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
                #expect(request.withUnsafeBytes { send(socket, $0.baseAddress, $0.count, 0) } == request.count)
            } else {
                // A byte every 100 ms or more (at least 4 s in all), never a whole request,
                // until the server closes: a timeout that each byte restarted would not.
                for byte in Array("GET /metrics HTTP/1.1\r\nHost: localhost\r\n".utf8) {
                    // Closed: an end of stream, or a reset (the server closed with bytes of
                    // ours still unread).
                    var peek: UInt8 = 0
                    let peeked = recv(socket, &peek, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
                    if peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                        closedWhileTrickling = true
                        break
                    }
                    _ = withUnsafeBytes(of: byte) { send(socket, $0.baseAddress, 1, Int32(MSG_NOSIGNAL)) }
                    try await Task.sleep(for: .milliseconds(100))
                }
            }
            // Read until the server closes (0, or a reset) or the 5 s receive timeout (EAGAIN).
            var buffer = [UInt8](repeating: 0, count: 4096)
            var last = 1
            var readError: Int32 = 0
            while last > 0 {
                last = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
                if last > 0 { received += buffer[0..<last] } else if last < 0 { readError = errno }
            }
            let waited = ContinuousClock.now - opened
            #expect(last == 0 || readError == ECONNRESET, "closed by the server, not left open until the read timed out")
            #expect(waited >= .milliseconds(400), "\(waited)")
            if sendsRequest {
                #expect(waited < .seconds(4), "\(waited)")
                #expect(String(decoding: received, as: UTF8.self).contains("up 1"), "answered first")
            } else {
                #expect(closedWhileTrickling, "closed while bytes still came, after \(waited)")
            }
        }
    }

    @Test("HTTP/1.0 is closed once answered; past the connection cap the oldest connection gives way, so a probe still gets in")
    func closeAndCap() async throws {
        var logger = Logger(label: "admin-cap-test")
        logger.logLevel = .critical
        // A long request timeout: only the behaviour under test closes connections here.
        let admin = AdminServer(
            host: "127.0.0.1", port: 0, logger: logger, metrics: { [] },
            readiness: { .init(ready: true, detail: "fine") }, idleTimeout: .seconds(30)
        )
        /// Reads until the server closes (true) or `seconds` pass (false).
        func readToClose(_ socket: Int32) -> (closed: Bool, text: String) {
            var buffer = [UInt8](repeating: 0, count: 4096)
            var received: [UInt8] = []
            while true {
                let count = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
                if count > 0 { received += buffer[0..<count] } else { return (count == 0 || errno == ECONNRESET, String(decoding: received, as: UTF8.self)) }
            }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await admin.run() }
            try await waitUntil("the admin port") { admin.localPort != nil }
            let port = try #require(admin.localPort)

            let plain = try connectTCP(port: port, receiveTimeoutSeconds: 10)
            defer { close(plain) }
            let asked = ContinuousClock.now
            let request = Array("GET /healthz HTTP/1.0\r\n\r\n".utf8)
            #expect(request.withUnsafeBytes { send(plain, $0.baseAddress, $0.count, 0) } == request.count)
            let answered = readToClose(plain)
            #expect(answered.closed && ContinuousClock.now - asked < .seconds(5), "closed after the answer, not at the 30 s timeout")
            #expect(answered.text.contains("ok") && answered.text.lowercased().contains("connection: close"), "\(answered.text)")

            // Another method: 405, saying which ones the server takes (RFC 9110).
            let poster = try connectTCP(port: port, receiveTimeoutSeconds: 10)
            defer { close(poster) }
            let post = Array("POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n".utf8)
            #expect(post.withUnsafeBytes { send(poster, $0.baseAddress, $0.count, 0) } == post.count)
            let refused = readToClose(poster).text.lowercased()
            #expect(refused.hasPrefix("http/1.0 405") && refused.contains("allow: get, head"), "\(refused)")

            // Enough silent connections to fill the cap, opened one after another.
            var silent: [Int32] = []
            defer { for socket in silent { close(socket) } }
            for _ in 0..<AdminServer.maximumConnections {
                silent.append(try connectTCP(port: port, receiveTimeoutSeconds: 10))
                try await Task.sleep(for: .milliseconds(5))
            }
            let probe = try connectTCP(port: port, receiveTimeoutSeconds: 10)
            defer { close(probe) }
            let get = Array("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8)
            #expect(get.withUnsafeBytes { send(probe, $0.baseAddress, $0.count, 0) } == get.count)
            let probed = readToClose(probe)
            #expect(probed.text.contains("200 OK"), "the probe was answered: \(probed.text)")
            #expect(readToClose(silent[0]).closed, "the oldest silent connection was closed to make room")
            group.cancelAll()
        }
    }

    @Test("a stalled pipeline fails /readyz at once and /healthz after the liveness limit, but not while publishing to Kafka fails")
    func stallFailsProbes() async throws {
        let (cluster, client, producer, publisher) = try ReliablePublisherTests.publisher(topic: "results", logLevel: .critical)
        try cluster.createTopic("jobs", partitions: 1)
        try await producer.send(KafkaOutgoingMessage(topic: "jobs", value: Array("job".utf8)))
        var logger = Logger(label: "pipeline-watch-test")
        logger.logLevel = .critical
        var configuration = KafkaConsumerConfiguration(client: client, groupID: "watch", topics: ["jobs"])
        configuration.sessionTimeout = .milliseconds(6000)
        configuration.pollTimeout = .milliseconds(50)
        configuration.stallWarning = .seconds(1)
        let consumer = try KafkaConsumer(configuration: configuration, logger: logger)
        let watch = PipelineWatch(consumer: consumer, producer: producer, publishStalls: publisher.stalls, unhealthyAfter: .seconds(6), kafkaWaitLimit: .seconds(600))
        let admin = AdminServer(
            host: "127.0.0.1", port: 0, logger: logger,
            metrics: { [] },
            readiness: { .init(ready: true, detail: "fine") },
            pipeline: watch
        )
        let held = Shared<[KafkaRecord]>([])
        try await withTimeout(90, "the stalled pipeline") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await admin.run() }
                group.addTask { try await consumer.run() }
                group.addTask { for await batch in consumer.batches { held.update { $0 += batch } } }
                try await waitUntil("the admin port") { admin.localPort != nil }
                let port = try #require(admin.localPort)
                try await waitUntil("the record to be taken") { held.value.count == 1 }
                #expect(try httpGet(port: port, path: "/healthz").status == 200)

                // Held unfinished: a stall, reported after a second.
                try await waitUntil("/readyz to report the stall", timeout: 10) {
                    (try? httpGet(port: port, path: "/readyz"))?.status == 503
                }
                let notReady = try httpGet(port: port, path: "/readyz").body
                #expect(notReady.hasPrefix("not ready: consumer pipeline stalled for "), "\(notReady)")
                #expect(try httpGet(port: port, path: "/healthz").status == 200, "not yet at the liveness limit")
                try await waitUntil("/healthz to fail", timeout: 15) {
                    (try? httpGet(port: port, path: "/healthz"))?.status == 503
                }
                let unhealthy = try httpGet(port: port, path: "/healthz").body
                #expect(unhealthy.hasPrefix("unhealthy: consumer pipeline stalled for "), "\(unhealthy)")

                // Results wait in the producer (Kafka refuses writes for now; librdkafka retries
                // and reports nothing until message.timeout.ms): Kafka is what is wrong, and a
                // restart would not help.
                let notEnoughReplicas = try #require(KafkaErrorCodes.code(named: "NOT_ENOUGH_REPLICAS"))
                cluster.pushRequestErrors(api: .produce, errors: Array(repeating: notEnoughReplicas, count: 100_000))
                let waiting = Task { try await producer.send(KafkaOutgoingMessage(topic: "results", value: Array("{}".utf8))) }
                try await waitUntil("the result to wait in the producer") { producer.queuedMessages > 0 }
                #expect(try httpGet(port: port, path: "/healthz").status == 200)
                #expect(publisher.stalls.problem(longerThan: .zero) == nil, "no failure reported yet")
                // Not for ever: past the stall limit plus the Kafka wait limit (10 minutes here), a
                // worker still waiting on Kafka is restarted (its own producer may be what is stuck).
                #expect(watch.livenessProblem(now: .now + .seconds(300)) == nil)
                let overdue = watch.livenessProblem(now: .now + .seconds(620))
                #expect(overdue?.contains("waiting on Kafka for more than 600.0 seconds past the stall limit") == true, "\(overdue ?? "nil")")
                cluster.clearRequestErrors(api: .produce)
                _ = try await waiting.value
                try await waitUntil("/healthz to fail again", timeout: 10) {
                    (try? httpGet(port: port, path: "/healthz"))?.status == 503
                }

                // A publish failed and is being retried: the same.
                let denied = try #require(KafkaErrorCodes.code(named: "TOPIC_AUTHORIZATION_FAILED"))
                cluster.pushRequestErrors(api: .produce, errors: Array(repeating: denied, count: 50))
                let publishing = Task { await publisher.publish([KafkaOutgoingMessage(topic: "results", value: Array("{}".utf8))]) }
                try await waitUntil("the failing publish", timeout: 20) { publisher.stalls.problem(longerThan: .zero) != nil }
                #expect(try httpGet(port: port, path: "/healthz").status == 200)
                #expect(watch.livenessProblem(now: .now + .seconds(620)) != nil, "a publish failing for ever is no excuse for ever")
                #expect(try httpGet(port: port, path: "/readyz").status == 503)
                publishing.cancel()
                _ = await publishing.value
                cluster.clearRequestErrors(api: .produce)
                #expect(try httpGet(port: port, path: "/healthz").status == 503)

                // Finished: the pipeline moves again.
                consumer.markFinished(held.value)
                try await waitUntil("both probes to pass", timeout: 10) {
                    (try? httpGet(port: port, path: "/readyz"))?.status == 200 && (try? httpGet(port: port, path: "/healthz"))?.status == 200
                }
                consumer.close()
                group.cancelAll()
                while let _ = try? await group.next() {}
            }
        }
        await producer.shutdown(flushTimeout: .seconds(2))
    }
}
