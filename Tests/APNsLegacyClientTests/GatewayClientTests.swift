import APNsClient
import APNsCore
import APNsLegacyClient
import APNsSimulator
import FleetTestSupport
import Synchronization
import Testing

@Suite("Legacy gateway client against the simulator", .timeLimit(.minutes(1)))
struct GatewayClientTests {
    func configuration(_ credentials: LegacyTestCredentials, port: Int, tls: Bool) -> LegacyGatewayConfiguration {
        var configuration = LegacyGatewayConfiguration(endpoint: credentials.endpoint(port: port, tls: tls), certificate: tls ? credentials.certificate : nil)
        configuration.name = "test"
        configuration.quietPeriod = .milliseconds(300)
        configuration.reconnectBackoff = .init(base: .milliseconds(20), maximum: .milliseconds(100))
        configuration.drainTimeout = .seconds(2)
        configuration.sendTimeout = .seconds(10)
        return configuration
    }

    @Test("an invalid token in the middle of a batch: it is rejected, the ones after it are re-sent on a new connection, each gets one verdict", arguments: [false, true])
    func errorMidBatch(tls: Bool) async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let count = 50
        let badIndex = 25
        let invalid: Set<String> = [Fixture.hex(Fixture.token(badIndex))]
        // A port that refuses connections until the services start on it: the client queues all
        // 50 while it cannot connect, so they go out in one batch on the first connection, in
        // order (identifier = index + 1). Held, not merely closed, so no other suite's server
        // is given it meanwhile.
        let reserved = try RefusingPort()
        let port = reserved.port

        try await withGatewayClient(configuration(credentials, port: port, tls: tls)) { client in
            let verdicts = try await withThrowingTaskGroup(of: (Int, LegacyGatewayVerdict).self) { group in
                for index in 0..<count {
                    group.addTask { (index, await client.send(token: Fixture.token(index), payload: Fixture.payload(index))) }
                    try await waitUntil("notification \(index) queued") { client.statistics.pending == index + 1 }
                }
                reserved.release()
                let services = try await startLegacyServices(credentials) { configuration in
                    configuration.gatewayTLSPort = tls ? port : nil
                    configuration.gatewayPlainPort = tls ? nil : port
                    configuration.feedbackTLSPort = nil
                    configuration.feedbackPlainPort = nil
                    configuration.invalidTokens = invalid
                }
                var verdicts: [Int: LegacyGatewayVerdict] = [:]
                for try await (index, verdict) in group {
                    #expect(verdicts[index] == nil, "one verdict per notification")
                    verdicts[index] = verdict
                }
                let counts = services.counts
                await services.stop()
                #expect(counts.errorResponses == ["8": 1])
                #expect(counts.gatewayConnections == 2, "the first connection ended with the error-response; one new connection")
                let expectedIdentifiers = (1...count).map(UInt32.init).filter { $0 != UInt32(badIndex + 1) }
                #expect(counts.acceptedIdentifiers == expectedIdentifiers, "none lost, none duplicated, order kept")
                #expect(counts.accepted == count - 1)
                return verdicts
            }
            #expect(verdicts.count == count)
            #expect(verdicts[badIndex] == .rejected(.invalidToken))
            #expect(verdicts.filter { $0.key != badIndex }.allSatisfy { $0.value == .accepted })
            let statistics = client.statistics
            #expect(statistics.pending == 0 && statistics.unconfirmed == 0)
        }
    }

    @Test("every token invalid (a stale list, or a certificate for the other environment): reconnects after error-responses are paced, not one per notification at once")
    func errorResponsesPaceReconnects() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let count = 12
        let services = try await startLegacyServices(credentials) { configuration in
            configuration.invalidTokens = Set((0..<count).map { Fixture.hex(Fixture.token($0)) })
        }
        defer { services.shutdown() }
        var settings = configuration(credentials, port: try #require(services.port(.gatewayPlain)), tls: false)
        let interval = Duration.milliseconds(250)
        settings.errorReconnects = .init(burst: 2, interval: interval)
        // Long enough that a loaded machine's late error-response is not outwaited (which would
        // count the notification as delivered).
        settings.quietPeriod = .seconds(3)
        try await withGatewayClient(settings) { client in
            #expect(await client.waitUntilConnected())
            let started = ContinuousClock.now
            let verdicts = await withTaskGroup(of: LegacyGatewayVerdict.self) { group in
                for index in 0..<count {
                    // Room for eleven paced reconnects on a loaded machine: a notification must be
                    // written a quiet period (3 s) before its deadline (one cold CI run missed 10 s).
                    group.addTask { await client.send(token: Fixture.token(index), payload: Fixture.payload(index), timeout: .seconds(30)) }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            let elapsed = ContinuousClock.now - started
            #expect(verdicts == Array(repeating: .rejected(.invalidToken), count: count), "each rejected once")
            // Each connection ends with one error-response, so the 12 verdicts take 11 reconnects:
            // two at once, then one per interval, so the last cannot come before 9 intervals.
            #expect(elapsed >= interval * 9 - .milliseconds(50), "11 reconnects in \(elapsed)")
        }
        #expect(services.counts.errorResponses == ["8": count])
    }

    @Test("a connection that closes without an error-response: what had not passed its quiet period is written again (at-least-once)")
    func closeWithoutErrorResponse() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let gateway = try await DroppingGateway.start(dropFirstAfter: 4)
        // The close must be noticed within the quiet period for nothing to be lost (the legacy
        // protocol's limit); 300 ms was too short on a loaded 2-core machine.
        var settings = configuration(credentials, port: gateway.port, tls: false)
        settings.quietPeriod = .milliseconds(1500)
        try await withGatewayClient(settings) { client in
            #expect(await client.waitUntilConnected())
            let verdicts = await withTaskGroup(of: LegacyGatewayVerdict.self) { group in
                for index in 0..<10 {
                    group.addTask { await client.send(token: Fixture.token(index), payload: Fixture.payload(index)) }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            #expect(verdicts == Array(repeating: .accepted, count: 10), "one verdict each")
        }
        // "Accepted" means no error-response came within the quiet period; on a loaded machine the
        // gateway may still be reading the second connection, so wait for it (bounded) first.
        let readDeadline = ContinuousClock.now + .seconds(5)
        while Set(gateway.identifiersByConnection.flatMap { $0 }).count < 10, ContinuousClock.now < readDeadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let seen = gateway.identifiersByConnection
        await gateway.stop()
        #expect(seen.count == 2)
        #expect(seen.first?.count == 4)
        #expect(Set(seen.flatMap { $0 }) == Set(1...10), "none lost")
        #expect(seen.last.map { Set($0) }?.isSuperset(of: seen.first ?? []) == true, "the first connection's notifications were written again")
    }

    @Test("the simple format (command 0) delivers; notifications are accepted after the quiet period")
    func simpleFormat() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        var configuration = configuration(credentials, port: try #require(services.port(.gatewayTLS)), tls: true)
        configuration.format = .simple
        try await withGatewayClient(configuration) { client in
            let verdicts = await withTaskGroup(of: LegacyGatewayVerdict.self) { group in
                for index in 0..<3 {
                    group.addTask { await client.send(token: Fixture.token(index), payload: Fixture.payload(index)) }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            #expect(verdicts == [.accepted, .accepted, .accepted])
        }
        #expect(services.counts.accepted == 3)
        #expect(services.counts.acceptedIdentifiers == [0, 0, 0], "the simple format carries no identifier")
    }

    @Test("an unanswered notification counts as accepted once the quiet period passes, not before")
    func quietPeriod() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        let configuration = configuration(credentials, port: try #require(services.port(.gatewayPlain)), tls: false)
        try await withGatewayClient(configuration) { client in
            #expect(await client.waitUntilConnected())
            let started = ContinuousClock.now
            let verdict = await client.send(token: Fixture.token(1), payload: Fixture.payload(1), expiry: 1_767_225_600)
            let elapsed = ContinuousClock.now - started
            #expect(verdict == .accepted)
            #expect(elapsed >= .milliseconds(300))
            #expect(elapsed < .seconds(10), "\(elapsed)")
        }
        // The bytes reached the socket a quiet period ago; the simulator's event loop, shared
        // with every other test in the process, may still be behind in reading them.
        try await waitUntil("the simulator to count the notification") { services.counts.acceptedIdentifiers == [1] }
    }

    @Test("the frame format (command 2) takes payloads up to its own limit, 2048 bytes")
    func frameFormatPayloadLimit() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        var configuration = configuration(credentials, port: try #require(services.port(.gatewayPlain)), tls: false)
        configuration.format = .frame
        try await withGatewayClient(configuration) { client in
            #expect(await client.send(token: Fixture.token(1), payload: [UInt8](repeating: 0x61, count: 2048)) == .accepted)
            let verdict = await client.send(token: Fixture.token(2), payload: [UInt8](repeating: 0x61, count: 2049))
            #expect(verdict == .refused(.invalidPayloadSize, detail: "the payload is 2049 bytes; the binary interface takes at most 2048"))
        }
        try await waitUntil("the gateway to count the notification") { services.counts.accepted >= 1 }
        #expect(services.counts.errorResponses.isEmpty)
    }

    @Test("payloads over the limit (256 bytes by default, or as configured) are refused before sending")
    func oversize() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        var configuration = configuration(credentials, port: try #require(services.port(.gatewayPlain)), tls: false)
        try await withGatewayClient(configuration) { client in
            let verdict = await client.send(token: Fixture.token(1), payload: [UInt8](repeating: 0x61, count: 257))
            #expect(verdict == .refused(.invalidPayloadSize, detail: "the payload is 257 bytes; the binary interface takes at most 256"))
            #expect(verdict.attemptResult == .answered(status: 413, reason: .payloadTooLarge))
            let wrongToken = await client.send(token: [1, 2, 3], payload: Fixture.payload(1))
            #expect(wrongToken == .refused(.invalidTokenSize, detail: "the device token is 3 bytes; the binary interface takes 32"))
            #expect(await client.send(token: Fixture.token(1), payload: [UInt8](repeating: 0x61, count: 256)) == .accepted)
        }
        configuration.maximumPayloadBytes = 100
        try await withGatewayClient(configuration) { client in
            let verdict = await client.send(token: Fixture.token(1), payload: [UInt8](repeating: 0x61, count: 101))
            #expect(verdict == .refused(.invalidPayloadSize, detail: "the payload is 101 bytes; the binary interface takes at most 100"))
        }
        // The client calls a send accepted after a quiet period; on a busy host the gateway may
        // count it later still.
        try await waitUntil("the gateway to count the one good notification") { services.counts.accepted >= 1 }
        #expect(services.counts.accepted == 1)
        #expect(services.counts.errorResponses.isEmpty, "nothing oversize reached the gateway")
    }

    @Test("with no gateway a send ends at its deadline; after shutdown sends are answered at once")
    func deadlineAndShutdown() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let probe = try await startLegacyServices(credentials)
        let port = try #require(probe.port(.gatewayPlain))
        await probe.stop()
        let client = try LegacyGatewayClient(configuration: configuration(credentials, port: port, tls: false), logger: Fixture.logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await client.run() }
            try await waitUntil { client.isRunning }
            let started = ContinuousClock.now
            let verdict = await client.send(token: Fixture.token(1), payload: Fixture.payload(1), timeout: .milliseconds(200))
            let elapsed = ContinuousClock.now - started
            guard case .notAnswered(let why) = verdict else {
                Issue.record("expected no verdict, got \(verdict)")
                return
            }
            #expect(why.contains("no connection"))
            // Ends at its deadline rather than waiting for a gateway that never comes: the bound
            // only has to tell "bounded" from "waits forever" on a busy CI machine.
            #expect(elapsed < .seconds(10), "\(elapsed)")
            client.shutdown()
            try await group.waitForAll()
        }
        guard case .notAnswered = await client.send(token: Fixture.token(1), payload: Fixture.payload(1)) else {
            Issue.record("a stopped client must not take work")
            return
        }
    }

    @Test("a shutdown ends a connection attempt stuck in its TLS handshake at once, not after the connect timeout")
    func shutdownDuringHandshake() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        // Accepts TCP and never answers the ClientHello.
        let silent = try await ChunkedFeedbackServer.start(bytes: [], chunkSizes: [1], holdOpen: true)
        var configuration = configuration(credentials, port: silent.port, tls: true)
        configuration.connectTimeout = .seconds(40)
        let client = try LegacyGatewayClient(configuration: configuration, logger: Fixture.logger)
        let elapsed = try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await client.run() }
            try await waitUntil { client.isRunning }
            // Long enough for the TCP connect to be done and the handshake under way.
            try await Task.sleep(for: .milliseconds(500))
            let stopping = ContinuousClock.now
            client.shutdown()
            try await group.waitForAll()
            return ContinuousClock.now - stopping
        }
        await silent.stop()
        // Without the shutdown closing it, the attempt lasts the 40 s connect timeout.
        #expect(elapsed < .seconds(10), "run() took \(elapsed) after shutdown()")
    }

    @Test("a client certificate the gateway does not trust is a connect failure, and sends end at their deadline")
    func untrustedCertificate() async throws {
        let credentials = try LegacyTestCredentials.make()
        defer { credentials.remove() }
        let stranger = try LegacyTestCredentials.make()
        defer { stranger.remove() }
        let services = try await startLegacyServices(credentials)
        defer { services.shutdown() }
        var configuration = configuration(credentials, port: try #require(services.port(.gatewayTLS)), tls: true)
        configuration.certificate = stranger.certificate
        try await withGatewayClient(configuration) { client in
            let verdict = await client.send(token: Fixture.token(1), payload: Fixture.payload(1), timeout: .milliseconds(500))
            guard case .notAnswered = verdict else {
                Issue.record("expected no verdict, got \(verdict)")
                return
            }
        }
        #expect(services.counts.accepted == 0)
    }
}
