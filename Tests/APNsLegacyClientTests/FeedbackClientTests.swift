import APNsCore
import APNsLegacyClient
import APNsSimulator
import FleetTestSupport
import NIOCore
import Testing

@Suite("Legacy feedback client", .timeLimit(.minutes(1)))
struct FeedbackClientTests {
    /// Tuples for `count` tokens, oldest first (the simulator sends them in that order).
    static func tuples(_ count: Int) -> [FeedbackTuple] {
        (0..<count).map { FeedbackTuple(timestamp: 1_767_225_600 + UInt32($0), token: Fixture.token($0)) }
    }

    @Test("reads every tuple the simulator's feedback service coalesces into one write", arguments: [false, true])
    func coalesced(tls: Bool) async throws {
        let expected = Self.tuples(40)
        try await withFeedbackService(expected, tls: tls) { client, services in
            let tuples = try await client.fetch(timeout: .seconds(5))
            #expect(tuples == expected)
            #expect(services.counts.feedbackTuplesSent == 40)
            // The service closes after sending; a second poll reads the same list again.
            #expect(try await client.fetch(timeout: .seconds(5)).count == 40)
        }
    }

    /// The simulator's feedback service listing `tuples`, and a client for it.
    private func withFeedbackService(
        _ tuples: [FeedbackTuple], tls: Bool = false, _ body: (LegacyFeedbackClient, LegacyServices) async throws -> Void
    ) async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials) { configuration in
            configuration.unregisteredTokens = Dictionary(uniqueKeysWithValues: tuples.map { (Fixture.hex($0.token), Int64($0.timestamp) * 1000) })
        }
        defer { services.shutdown() }
        let port = try #require(services.port(tls ? .feedbackTLS : .feedbackPlain))
        let client = LegacyFeedbackClient(endpoint: credentials.endpoint(port: port, tls: tls), certificate: tls ? credentials.certificate : nil, logger: Fixture.logger)
        try await body(client, services)
    }

    @Test("a long list is delivered in order, a bounded chunk at a time")
    func chunked() async throws {
        let expected = Self.tuples(40)
        try await withFeedbackService(expected) { client, _ in
            var chunks: [[FeedbackTuple]] = []
            try await client.fetch(timeout: .seconds(5), chunkSize: 7) { chunks.append($0) }
            #expect(chunks.flatMap { $0 } == expected)
            #expect(chunks.allSatisfy { $0.count <= 7 }, "chunk sizes \(chunks.map(\.count))")
            #expect(chunks.count == 6)
        }
    }

    @Test("a chunk that takes longer to deliver than the deadline loses none of what the service already sent")
    func slowDelivery() async throws {
        // 3,000 distinct tokens, about 114 KB: more than one read, so most of it waits unread
        // in the socket while the first chunk is delivered.
        let expected = (0..<3000).map { index in
            FeedbackTuple(timestamp: 1_767_225_600 + UInt32(index), token: (0..<32).map { UInt8(truncatingIfNeeded: index >> (8 * ($0 % 4))) &+ UInt8($0) })
        }
        try await withFeedbackService(expected) { client, _ in
            var received: [FeedbackTuple] = []
            var first = true
            // The reading time stays well inside 2 s even on a loaded host; the delivery does not.
            try await client.fetch(timeout: .seconds(2), chunkSize: 100) { chunk in
                if first {
                    first = false
                    try? await Task.sleep(for: .milliseconds(3500))  // Kafka slow: past the deadline
                }
                received += chunk
            }
            #expect(received.count == expected.count)
            #expect(received == expected.sorted { $0.timestamp < $1.timestamp })
        }
    }

    @Test("a service still sending when the deadline passes is read on (what it sent is forgotten), up to twice the deadline")
    func slowServiceIsReadToTheEnd() async throws {
        // 30 tuples in 50-byte pieces (so most reads end inside a tuple, as a real stream's
        // do), one every 100 ms: 2.3 s of sending against a 2 s deadline, read on up to 4 s.
        let expected = Self.tuples(30)
        let slow = try await ChunkedFeedbackServer.start(bytes: expected.flatMap { $0.encoded() }, chunkSizes: [50], gap: .milliseconds(100))
        let client = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: slow.port, tls: false), certificate: nil, logger: Fixture.logger)
        var tuples: [FeedbackTuple] = []
        try await client.fetch(timeout: .seconds(2)) { tuples += $0 }
        await slow.stop()
        #expect(tuples == expected, "\(tuples.count) of \(expected.count)")

        // One that would send for 40 s is cut at twice a 2 s deadline (checked once a second;
        // a loaded CI host took over 6 s once, so the bound is loose). With a 1 s deadline, a
        // host busy compiling once delayed the first bytes past it: nothing read is an error.
        let endless = try await ChunkedFeedbackServer.start(bytes: Self.tuples(400).flatMap { $0.encoded() }, chunkSizes: [38], gap: .milliseconds(100))
        let endlessClient = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: endless.port, tls: false), certificate: nil, logger: Fixture.logger)
        let start = ContinuousClock.now
        var some: [FeedbackTuple] = []
        try await endlessClient.fetch(timeout: .seconds(2)) { some += $0 }
        await endless.stop()
        let took = ContinuousClock.now - start
        #expect(took >= .seconds(3.9) && took < .seconds(20), "cut after \(took)")
        #expect(some.count > 5 && some.count < 200, "\(some.count) tuples")
    }

    @Test("reads tuples split at every possible place: byte by byte and in odd chunks")
    func split() async throws {
        let expected = Self.tuples(10)
        let bytes = expected.flatMap { $0.encoded() }
        for sizes in [[1], [3, 7, 2, 38, 5, 11, 1], [37, 39]] {
            let server = try await ChunkedFeedbackServer.start(bytes: bytes, chunkSizes: sizes)
            let client = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: server.port, tls: false), certificate: nil, logger: Fixture.logger)
            let tuples = try await client.fetch(timeout: .seconds(5))
            await server.stop()
            #expect(tuples == expected, "chunk sizes \(sizes)")
        }
    }

    @Test("a stream cut inside a tuple keeps the whole tuples before it (the service will not send them again)")
    func cutStream() async throws {
        let expected = Self.tuples(3)
        let bytes = expected.flatMap { $0.encoded() }
        let server = try await ChunkedFeedbackServer.start(bytes: Array(bytes.dropLast(10)), chunkSizes: [16])
        let client = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: server.port, tls: false), certificate: nil, logger: Fixture.logger)
        let tuples = try await client.fetch(timeout: .seconds(5))
        await server.stop()
        #expect(tuples == Array(expected.prefix(2)))
    }

    @Test("a service that sends whole tuples and then holds the connection open is done once it goes quiet, not at the deadline")
    func quietEnd() async throws {
        let expected = Self.tuples(3)
        let bytes = expected.flatMap { $0.encoded() }
        let server = try await ChunkedFeedbackServer.start(bytes: bytes, chunkSizes: [38], holdOpen: true)
        let client = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: server.port, tls: false), certificate: nil, logger: Fixture.logger)
        let start = ContinuousClock.now
        var tuples: [FeedbackTuple] = []
        try await client.fetch(timeout: .seconds(20), quietEnd: .milliseconds(500)) { tuples += $0 }
        #expect(tuples == expected)
        #expect(ContinuousClock.now - start < .seconds(10), "ended once quiet, not at the 20 s deadline")

        // Quiet inside a tuple is not an end: the rest of the tuple may still come. The
        // deadline ends it, and the whole tuples read are kept.
        let cut = try await ChunkedFeedbackServer.start(bytes: Array(bytes.dropLast(10)), chunkSizes: [38], holdOpen: true)
        let cutClient = LegacyFeedbackClient(endpoint: LegacyEndpoint(host: "127.0.0.1", port: cut.port, tls: false), certificate: nil, logger: Fixture.logger)
        let cutStart = ContinuousClock.now
        var partial: [FeedbackTuple] = []
        try await cutClient.fetch(timeout: .seconds(2), quietEnd: .milliseconds(300)) { partial += $0 }
        #expect(partial == Array(expected.prefix(2)))
        #expect(ContinuousClock.now - cutStart >= .milliseconds(1500), "held to the deadline")
        await server.stop()
        await cut.stop()
    }

    @Test("an empty list on a connection the service holds open is an empty answer once quiet, not a failed poll at the deadline", arguments: [false, true])
    func emptyListHeldOpen(tls: Bool) async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let server = try await ChunkedFeedbackServer.start(bytes: [], chunkSizes: [38], holdOpen: true, tls: tls ? credentials : nil)
        let client = LegacyFeedbackClient(endpoint: credentials.endpoint(port: server.port, tls: tls), certificate: tls ? credentials.certificate : nil, logger: Fixture.logger)
        let start = ContinuousClock.now
        var tuples: [FeedbackTuple] = []
        try await client.fetch(timeout: .seconds(20), quietEnd: .milliseconds(500)) { tuples += $0 }
        #expect(tuples.isEmpty)
        // Silence before the first byte counts only after 5 s (a service slow to start sending
        // is not cut off), whatever the shorter quiet end between tuples.
        let waited = ContinuousClock.now - start
        #expect(waited >= .milliseconds(4900) && waited < .seconds(15), "ended once quiet for 5 s, not at the 20 s deadline: \(waited)")
        await server.stop()
    }

    @Test("an empty feedback list is an empty answer")
    func empty() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        let port = try #require(services.port(.feedbackTLS))
        let client = LegacyFeedbackClient(endpoint: credentials.endpoint(port: port, tls: true), certificate: credentials.certificate, logger: Fixture.logger)
        #expect(try await client.fetch(timeout: .seconds(5)).isEmpty)
    }

    @Test("failures name the endpoint and what failed")
    func failures() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        let tlsPort = try #require(services.port(.feedbackTLS))

        // Without a client certificate the TLS service refuses the handshake.
        let anonymous = LegacyFeedbackClient(endpoint: credentials.endpoint(port: tlsPort, tls: true), certificate: nil, logger: Fixture.logger)
        let refused = await #expect(throws: LegacyClientError.self) { try await anonymous.fetch(timeout: .seconds(5)) }
        #expect(refused?.message.contains("127.0.0.1:\(tlsPort)") == true)

        // A missing certificate file is a credentials error naming the file.
        let missing = LegacyFeedbackClient(
            endpoint: credentials.endpoint(port: tlsPort, tls: true),
            certificate: .pem(certificateFile: credentials.path("nope.pem"), privateKeyFile: credentials.path("nope-key.pem"), password: nil),
            logger: Fixture.logger
        )
        let unreadable = await #expect(throws: LegacyClientError.self) { try await missing.fetch(timeout: .seconds(5)) }
        #expect(unreadable?.code == .credentials)
        #expect(unreadable?.message.contains("nope.pem") == true)
        // The same, found without connecting: what the feedback worker checks at start.
        let atStart = #expect(throws: LegacyClientError.self) { try missing.checkCredentials() }
        #expect(atStart?.code == .credentials)
        #expect(atStart?.message.contains("nope.pem") == true)
        try LegacyFeedbackClient(endpoint: credentials.endpoint(port: tlsPort, tls: true), certificate: credentials.certificate, logger: Fixture.logger).checkCredentials()

        await services.stop()
        // Not the stopped service's port: another suite's server can be given it meanwhile.
        let refusing = try RefusingPort()
        let gone = LegacyFeedbackClient(endpoint: credentials.endpoint(port: refusing.port, tls: false), certificate: nil, logger: Fixture.logger)
        let notListening = await #expect(throws: LegacyClientError.self) { try await gone.fetch(timeout: .seconds(5)) }
        #expect(notListening?.code == .connect)
        #expect(notListening?.message.contains("127.0.0.1:\(refusing.port)") == true)
    }
}
