import APNsCore
import APNsSimulator
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization
import Testing

/// A raw TCP (optionally TLS) client: writes the given chunks, then collects every byte the
/// server sends until it closes the connection.
private enum RawClient {
    final class Collector: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let received = Mutex<[UInt8]>([])
        /// Whether a TLS handler before this one completed its handshake.
        let handshakeCompleted = Mutex(false)
        let closed: EventLoopPromise<Void>

        init(closed: EventLoopPromise<Void>) {
            self.closed = closed
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
            received.withLock { $0 += bytes }
        }

        func channelInactive(context: ChannelHandlerContext) {
            closed.succeed(())
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent { handshakeCompleted.withLock { $0 = true } }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }

    static func exchange(port: Int, chunks: [[UInt8]], tls: NIOSSLContext? = nil) async throws -> [UInt8] {
        let group = MultiThreadedEventLoopGroup.singleton
        let closed = group.any().makePromise(of: Void.self)
        let collector = Collector(closed: closed)
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: "localhost"))
                    }
                    try channel.pipeline.syncOperations.addHandler(collector)
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        for chunk in chunks {
            try await channel.writeAndFlush(channel.allocator.buffer(bytes: chunk)).get()
        }
        // Feedback closes by itself; a gateway that saw no error stays open, so stop waiting
        // after a moment and close from our side.
        let timeout = channel.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        try await closed.futureResult.get()
        timeout.cancel()
        return collector.received.withLock { $0 }
    }

    /// Connects over plain TCP (or completes a TLS handshake with `tls`) and says nothing; how
    /// long until the server closes, or nil if it has not after `limit`.
    static func silence(port: Int, limit: TimeAmount, tls: NIOSSLContext? = nil) async throws -> Duration? {
        let group = MultiThreadedEventLoopGroup.singleton
        let closed = group.any().makePromise(of: Void.self)
        let collector = Collector(closed: closed)
        let started = ContinuousClock.now
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: "localhost"))
                    }
                    try channel.pipeline.syncOperations.addHandler(collector)
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        let gaveUp = Mutex(false)
        let timeout = channel.eventLoop.scheduleTask(in: limit) {
            gaveUp.withLock { $0 = true }
            channel.close(promise: nil)
        }
        try await closed.futureResult.get()
        timeout.cancel()
        return gaveUp.withLock { $0 } ? nil : started.duration(to: .now)
    }
}

private let token = (0..<32).map { UInt8(($0 * 13 + 5) & 0xFF) }
private let deadToken = (0..<32).map { UInt8(255 - $0) }
private func hex(_ bytes: [UInt8]) -> String { (try? DeviceToken(bytes: bytes).hex) ?? "" }

@Suite("Simulator: legacy binary gateway and feedback service", .timeLimit(.minutes(1)))
struct LegacyServicesTests {
    func start(_ configure: (inout LegacyServicesConfiguration) -> Void = { _ in }) async throws -> LegacyServices {
        var configuration = LegacyServicesConfiguration()
        configuration.gatewayPlainPort = 0
        configuration.feedbackPlainPort = 0
        configuration.unregisteredTokens = [hex(deadToken): 1_767_225_600_000]
        configure(&configuration)
        return try await LegacyServices.start(configuration, output: { _ in })
    }

    @Test("stop() closes the open gateway connections, not only the listening socket")
    func stopClosesConnections() async throws {
        let services = try await start()
        let port = try #require(services.port(.gatewayPlain))
        // Silent connections, which the gateway keeps open; one is closed by stop().
        async let closedAfter = RawClient.silence(port: port, limit: .seconds(20))
        // Accepted by the gateway first (it counts it), so that stop() has an open one to close.
        let deadline = ContinuousClock.now + .seconds(20)
        while services.counts.gatewayConnections == 0, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(services.counts.gatewayConnections == 1)
        let stopping = ContinuousClock.now
        await services.stop()
        let closed = try await closedAfter
        #expect(closed != nil, "the connection stayed open after stop()")
        #expect(stopping.duration(to: .now) < .seconds(10))
    }

    @Test("split and coalesced PDUs are all accepted, unregistered tokens included")
    func splitAndCoalesced() async throws {
        let services = try await start()
        defer { services.shutdown() }
        let pdus = (1...5).map { id in
            LegacyNotification(identifier: UInt32(id), expiry: 0, token: id == 3 ? deadToken : token, payload: Array(#"{"aps":{"alert":"n\#(id)"}}"#.utf8)).encoded()
        }
        let stream = pdus.flatMap { $0 }
        // Cut the stream at awkward places: inside a header, inside a token, between PDUs.
        let cuts = [0, 3, 11, 40, pdus[0].count + pdus[1].count, stream.count - 1, stream.count]
        let chunks = zip(cuts, cuts.dropFirst()).map { Array(stream[$0..<$1]) }
        let answer = try await RawClient.exchange(port: try #require(services.port(.gatewayPlain)), chunks: chunks)
        #expect(answer.isEmpty, "no error-response for good notifications")
        let counts = services.counts
        #expect(counts.accepted == 5)
        #expect(counts.acceptedForUnregistered == 1)
        #expect(counts.acceptedIdentifiers == [1, 2, 3, 4, 5])
    }

    @Test("an error in the middle of a batch answers command 8 with its identifier and closes")
    func errorMidBatch() async throws {
        let services = try await start()
        defer { services.shutdown() }
        let good1 = LegacyNotification(identifier: 10, token: token, payload: Array("{}".utf8)).encoded()
        let bad = LegacyNotification(identifier: 11, token: token, payload: Array(repeating: 0x61, count: 300)).encoded()
        let good2 = LegacyNotification(identifier: 12, token: token, payload: Array("{}".utf8)).encoded()
        let answer = try await RawClient.exchange(port: try #require(services.port(.gatewayPlain)), chunks: [good1 + bad + good2])
        #expect(LegacyErrorResponse(bytes: answer) == LegacyErrorResponse(status: .invalidPayloadSize, identifier: 11))
        #expect(services.counts.acceptedIdentifiers == [10])
        #expect(services.counts.errorResponses == ["7": 1])
    }

    @Test("garbage gets a processing error carrying bytes 1-4, like the reference server")
    func garbage() async throws {
        let services = try await start()
        defer { services.shutdown() }
        let answer = try await RawClient.exchange(port: try #require(services.port(.gatewayPlain)), chunks: [Array("GET / HTTP/1.1\r\n\r\n".utf8)])
        #expect(answer == [0x08, 0x01, 0x45, 0x54, 0x20, 0x2F])
    }

    @Test("a token configured as invalid gets status 8")
    func invalidToken() async throws {
        let services = try await start { $0.invalidTokens = [hex(token)] }
        defer { services.shutdown() }
        let pdu = LegacyNotification(identifier: 99, token: token, payload: Array("{}".utf8)).encoded()
        let answer = try await RawClient.exchange(port: try #require(services.port(.gatewayPlain)), chunks: [pdu])
        #expect(LegacyErrorResponse(bytes: answer) == LegacyErrorResponse(status: .invalidToken, identifier: 99))
    }

    @Test("the feedback service streams a tuple per unregistered token, then closes")
    func feedback() async throws {
        let second = Array(token.reversed())
        let services = try await start { $0.unregisteredTokens[hex(second)] = 1_767_225_700_000 }
        defer { services.shutdown() }
        let bytes = try await RawClient.exchange(port: try #require(services.port(.feedbackPlain)), chunks: [])
        var decoder = FeedbackTupleDecoder()
        decoder.append(bytes)
        var tuples: [FeedbackTuple] = []
        while let tuple = decoder.next() { tuples.append(tuple) }
        #expect(tuples == [FeedbackTuple(timestamp: 1_767_225_600, token: deadToken), FeedbackTuple(timestamp: 1_767_225_700, token: second)])
        #expect(decoder.leftoverByteCount == 0)
        #expect(services.counts.feedbackTuplesSent == 2)
    }

    @Test("gateway and feedback over TLS with a client certificate")
    func overTLS() async throws {
        let credentials = try DevCredentials.generate()
        let services = try await start {
            $0.gatewayTLSPort = 0
            $0.feedbackTLSPort = 0
            $0.tls = APNsSimulatorConfiguration.TLS(
                certificateChainPEM: credentials.serverCertificatePEM, privateKeyPEM: credentials.serverKeyPEM,
                clientCAPEM: credentials.caCertificatePEM
            )
        }
        defer { services.shutdown() }
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(credentials.caCertificatePEM.utf8)))
        tls.certificateChain = try NIOSSLCertificate.fromPEMBytes(Array(credentials.clientCertificatePEM.utf8)).map { .certificate($0) }
        tls.privateKey = .privateKey(try NIOSSLPrivateKey(bytes: Array(credentials.clientKeyPEM.utf8), format: .pem))
        let context = try NIOSSLContext(configuration: tls)

        let pdu = LegacyNotification(identifier: 7, token: token, payload: Array("{}".utf8)).encoded()
        let answer = try await RawClient.exchange(port: try #require(services.port(.gatewayTLS)), chunks: [pdu], tls: context)
        #expect(answer.isEmpty)
        #expect(services.counts.acceptedIdentifiers == [7])

        let feedback = try await RawClient.exchange(port: try #require(services.port(.feedbackTLS)), chunks: [], tls: context)
        var decoder = FeedbackTupleDecoder()
        decoder.append(feedback)
        #expect(decoder.next() == FeedbackTuple(timestamp: 1_767_225_600, token: deadToken))
    }

    @Test(
        "a client that connects and never completes the TLS handshake, or never sends the HTTP/2 preface, is closed after 10 s",
        .timeLimit(.minutes(1))
    )
    func silentTLSClientsAreClosed() async throws {
        let credentials = try DevCredentials.generate()
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners.http2TLSPort = 0
        configuration.listeners.http2CleartextPort = 0
        configuration.listeners.legacyGatewayTLSPort = 0
        configuration.listeners.legacyFeedbackTLSPort = 0
        configuration.tls = APNsSimulatorConfiguration.TLS(
            certificateChainPEM: credentials.serverCertificatePEM, privateKeyPEM: credentials.serverKeyPEM, clientCAPEM: credentials.caCertificatePEM
        )
        configuration.dumpSink = { _ in }
        let simulator = try await APNsSimulator.start(configuration)
        let ports = [simulator.port(.http2TLS), simulator.port(.legacyGatewayTLS), simulator.port(.legacyFeedbackTLS), simulator.port(.http2Cleartext)].compactMap { $0 }
        #expect(ports.count == 4)
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(credentials.caCertificatePEM.utf8)))
        let handshaking = try NIOSSLContext(configuration: tls)
        let http2TLS = try #require(simulator.port(.http2TLS))
        // All at once: one wait of the deadline. The last client completes its TLS handshake and
        // then sends no preface.
        let waits = try await withThrowingTaskGroup(of: Duration?.self) { group in
            for port in ports { group.addTask { try await RawClient.silence(port: port, limit: .seconds(20)) } }
            group.addTask { try await RawClient.silence(port: http2TLS, limit: .seconds(20), tls: handshaking) }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(waits.count == 5)
        await simulator.stop()
        for wait in waits {
            let closedAfter = try #require(wait, "still open after 20 s")
            #expect(closedAfter > .seconds(9) && closedAfter < .seconds(15), "closed after \(closedAfter)")
        }
    }

    @Test("a TLS connection accepted before stop() whose handshake completes after it is closed, not served", .timeLimit(.minutes(1)))
    func handshakeAfterStopIsClosed() async throws {
        let credentials = try DevCredentials.generate()
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners.http2TLSPort = 0
        configuration.tls = APNsSimulatorConfiguration.TLS(certificateChainPEM: credentials.serverCertificatePEM, privateKeyPEM: credentials.serverKeyPEM)
        configuration.dumpSink = { _ in }
        let simulator = try await APNsSimulator.start(configuration)
        let port = try #require(simulator.port(.http2TLS))
        let group = MultiThreadedEventLoopGroup.singleton
        let closed = group.any().makePromise(of: Void.self)
        let collector = RawClient.Collector(closed: closed)
        // Accepted now; the handshake starts only once the simulator has stopped.
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(collector) } }
            .connect(host: "127.0.0.1", port: port).get()
        // Taken from the listen queue by the simulator (closing the listener drops what is still
        // queued there).
        try await Task.sleep(for: .milliseconds(300))
        await simulator.stop()
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(credentials.caCertificatePEM.utf8)))
        tls.applicationProtocols = ["h2"]
        let context = try NIOSSLContext(configuration: tls)
        try await channel.eventLoop.submit {
            try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: "localhost"), position: .first)
        }.get()
        // The connection preface and an empty SETTINGS frame: a client that would be served.
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]
        // Fails when the simulator closed the connection first, as it should.
        try? await channel.writeAndFlush(channel.allocator.buffer(bytes: preface))
        let gaveUp = Mutex(false)
        let timeout = channel.eventLoop.scheduleTask(in: .seconds(5)) {
            gaveUp.withLock { $0 = true }
            channel.close(promise: nil)
        }
        try await closed.futureResult.get()
        timeout.cancel()
        // Otherwise the listener's close reset a connection still in its queue, and this test
        // would pass without checking anything.
        #expect(collector.handshakeCompleted.withLock { $0 }, "the simulator did not accept the connection within 300 ms, before stop()")
        #expect(!gaveUp.withLock { $0 }, "still open 5 s after the stopped simulator completed its handshake")
    }

    @Test("the simulator hosts the legacy services beside HTTP/2, sharing its unregistered tokens")
    func hostedBySimulator() async throws {
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners.http2CleartextPort = 0
        configuration.listeners.legacyGatewayPlainPort = 0
        configuration.listeners.legacyFeedbackPlainPort = 0
        configuration.behaviour.unregisteredTokens = [hex(deadToken): 1_767_225_600_000]
        configuration.dumpSink = { _ in }
        let simulator = try await APNsSimulator.start(configuration)
        let feedbackPort = try #require(simulator.port(.legacyFeedbackPlain))
        let gatewayPort = try #require(simulator.port(.legacyGatewayPlain))
        let pdu = LegacyNotification(identifier: 5, token: deadToken, payload: Array("{}".utf8)).encoded()
        let answer = try await RawClient.exchange(port: gatewayPort, chunks: [pdu])
        let feedback = try await RawClient.exchange(port: feedbackPort, chunks: [])
        await simulator.stop()
        #expect(answer.isEmpty)
        #expect(simulator.legacy?.counts.acceptedForUnregistered == 1)
        var decoder = FeedbackTupleDecoder()
        decoder.append(feedback)
        #expect(decoder.next() == FeedbackTuple(timestamp: 1_767_225_600, token: deadToken))
    }
}

@Suite("Simulator listeners")
struct SimulatorListenerTests {
    @Test("a port already taken is a configuration error naming the listener and the port, for HTTP/2 and legacy listeners alike")
    func portTaken() async throws {
        // Whichever listener is first to find its port taken: every one names itself.
        let holder = try await APNsSimulator.start({
            var configuration = APNsSimulatorConfiguration()
            configuration.listeners.http2CleartextPort = 0
            return configuration
        }())
        let taken = try #require(holder.port(.http2Cleartext))
        for (listener, set) in [
            ("HTTP/2 cleartext listener", { (c: inout APNsSimulatorConfiguration) in c.listeners.http2CleartextPort = taken }),
            ("legacy gateway listener", { (c: inout APNsSimulatorConfiguration) in c.listeners.legacyGatewayPlainPort = taken }),
        ] {
            var configuration = APNsSimulatorConfiguration()
            configuration.listeners.http2CleartextPort = nil
            configuration.listeners.adminPort = nil
            set(&configuration)
            do {
                let simulator = try await APNsSimulator.start(configuration)
                await simulator.stop()
                Issue.record("\(listener): started on a taken port")
            } catch let error as SimulatorConfigurationError {
                #expect(error.description.contains(listener) && error.description.contains(":\(taken)"), "\(error)")
            }
        }
        await holder.stop()
    }
}
