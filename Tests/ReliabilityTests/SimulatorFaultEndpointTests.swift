import APNsClient
import APNsCore
import APNsSimulator
import FleetTestSupport
import Foundation
import Logging
import Testing

/// The simulator's fault endpoints, checked directly: a reset is a TCP RST (not a FIN, not a
/// GOAWAY), close_notify closes cleanly, and run-time faults start and stop on request.
@Suite("Simulator fault endpoints", .timeLimit(.minutes(2)))
struct SimulatorFaultEndpointTests {
    /// An h2c connection from a plain socket: the preface and an empty SETTINGS register it.
    private static func openH2C(port: Int) throws -> Int32 {
        let fd = try connectTCP(port: port, receiveTimeoutSeconds: 10)
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 0x04, 0, 0, 0, 0, 0]
        _ = preface.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        return fd
    }

    /// Reads until the peer closes: `nil` for an orderly close (FIN), else the errno (ECONNRESET
    /// for a reset). Also returns the HTTP/2 frame types received.
    private static func readUntilClosed(_ fd: Int32) -> (errno: Int32?, frameTypes: [UInt8]) {
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count == 0 { return (nil, frameTypes(received)) }
            if count < 0 { return (errno, frameTypes(received)) }
            received.append(contentsOf: chunk[0..<count])
        }
    }

    /// Reads until the simulator acknowledges the client's SETTINGS, so it has read everything
    /// the client sent: a socket closed with bytes still unread sends a reset, not a FIN.
    private static func readUntilSettingsAcknowledged(_ fd: Int32) -> [UInt8] {
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while !settingsAcknowledged(received) {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            received.append(contentsOf: chunk[0..<count])
        }
        return received
    }

    private static func settingsAcknowledged(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset + 9 <= bytes.count {
            var length = 0
            for byte in bytes[offset..<(offset + 3)] { length = length << 8 + Int(byte) }
            if bytes[offset + 3] == 0x4, bytes[offset + 4] & 0x1 != 0 { return true }
            offset += 9 + length
        }
        return false
    }

    private static func frameTypes(_ bytes: [UInt8]) -> [UInt8] {
        var types: [UInt8] = []
        var offset = 0
        while offset + 9 <= bytes.count {
            var length = 0
            for byte in bytes[offset..<(offset + 3)] { length = length << 8 + Int(byte) }
            types.append(bytes[offset + 3])
            offset += 9 + length
        }
        return types
    }

    private static func startSimulator() async throws -> (APNsSimulator, h2c: Int, admin: Int) {
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners = .init(host: "127.0.0.1", http2CleartextPort: 0, adminPort: 0)
        var logger = Logger(label: "simulator-fault-endpoints")
        logger.logLevel = .critical
        let simulator = try await APNsSimulator.start(configuration, logger: logger)
        guard let h2c = simulator.port(.http2Cleartext), let admin = simulator.port(.admin) else {
            await simulator.stop(gracePeriod: .zero)
            throw TestSetupError("simulator ports")
        }
        return (simulator, h2c, admin)
    }

    @Test("POST /reset: the peer sees a TCP reset, with no GOAWAY first")
    func reset() async throws {
        let (simulator, h2c, admin) = try await Self.startSimulator()
        let fd = try Self.openH2C(port: h2c)
        defer { close(fd) }
        try await waitUntil("the connection to register", timeout: 10) { simulator.counters.snapshot().connections.contains { $0.open } }
        let response = try httpRequest(method: "POST", port: admin, path: "/reset")
        #expect(response.status == 200)
        #expect(response.body.contains("reset 1 connection"))
        let (error, frames) = Self.readUntilClosed(fd)
        #expect(error == ECONNRESET, "errno \(String(describing: error))")
        #expect(!frames.contains(0x7), "no GOAWAY before the reset: \(frames)")
        await simulator.stop(gracePeriod: .zero)
    }

    @Test("POST /close-notify: an orderly close, with no GOAWAY first")
    func closeNotify() async throws {
        let (simulator, h2c, admin) = try await Self.startSimulator()
        let fd = try Self.openH2C(port: h2c)
        defer { close(fd) }
        try await waitUntil("the connection to register", timeout: 10) { simulator.counters.snapshot().connections.contains { $0.open } }
        // Once read on a loaded machine, the preface could still sit unread in the simulator's
        // socket when it closed, which made the kernel reset the connection instead.
        let before = Self.frameTypes(Self.readUntilSettingsAcknowledged(fd))
        #expect(try httpRequest(method: "POST", port: admin, path: "/close-notify").status == 200)
        let (error, frames) = Self.readUntilClosed(fd)
        #expect(error == nil, "an orderly close, not errno \(String(describing: error))")
        #expect(!(before + frames).contains(0x7), "no GOAWAY: \(before + frames)")
        await simulator.stop(gracePeriod: .zero)
    }

    @Test("POST /faults starts 500s, 503s and latency; DELETE /faults stops them; bad values are refused")
    func runtimeFaults() async throws {
        let (simulator, _, admin) = try await Self.startSimulator()
        #expect(try httpRequest(method: "POST", port: admin, path: "/faults?error_500_rate=0.25&error_503_rate=0.5&latency_ms=40&drop_to_one_stream=true").status == 200)
        #expect(simulator.faults.current == RuntimeFaults.Overrides(
            internalServerErrorRate: 0.25, serviceUnavailableRate: 0.5, latency: .milliseconds(40), dropToOneStreamAfterRejection: true
        ))
        #expect(try httpRequest(method: "GET", port: admin, path: "/faults").body.contains("error_500_rate=0.25"))
        #expect(try httpRequest(method: "POST", port: admin, path: "/faults?error_500_rate=0.75&error_503_rate=0.5").status == 400, "rates above 1 in all")
        #expect(try httpRequest(method: "POST", port: admin, path: "/faults?error_503_rate=0.5&shutdown_503_rate=0.6").status == 400, "503 rates above 1 in all")
        #expect(try httpRequest(method: "POST", port: admin, path: "/faults?latency_ms=-1").status == 400)
        #expect(try httpRequest(method: "POST", port: admin, path: "/faults?bogus=1").status == 400)
        #expect(simulator.faults.current.latency == .milliseconds(40), "a refused request changes nothing")
        #expect(try httpRequest(method: "DELETE", port: admin, path: "/faults").status == 200)
        #expect(simulator.faults.current.isEmpty)
        await simulator.stop(gracePeriod: .zero)
    }

    @Test("Through the APNs client: a 500 burst, late answers, a reset and close_notify, then 200s again")
    func throughTheClient() async throws {
        let directory = temporaryTestPath("simulator-fault-endpoints")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        var configuration = try credentials.simulatorConfiguration()
        configuration.listeners = .init(host: "127.0.0.1", http2TLSPort: 0)
        var logger = Logger(label: "simulator-fault-endpoints")
        logger.logLevel = .critical
        let simulator = try await APNsSimulator.start(configuration, logger: logger)
        let port = try #require(simulator.port(.http2TLS))
        var clientConfiguration = APNsClientConfiguration(
            endpoint: .custom(host: "127.0.0.1", port: port, caFile: (directory as NSString).appendingPathComponent(summary.caFile)),
            authentication: try APNsAuthentication.loadToken(
                keyFile: (directory as NSString).appendingPathComponent(summary.signingKeyFile), keyID: summary.keyID, teamID: summary.teamID
            )
        )
        clientConfiguration.connections = 1
        clientConfiguration.reconnectBackoff = .init(base: .milliseconds(20), maximum: .milliseconds(200))
        let pool = try APNsClientPool(configuration: clientConfiguration, logger: logger)
        let notification = APNsNotification(
            deviceToken: String(repeating: "ab", count: 32), topic: "com.example.app", pushType: .alert, priority: .immediate,
            expiration: 0, payload: RawJSON(#"{"aps":{"alert":"hi"}}"#)
        )
        /// Sends until a 200 comes back (a connection lost under the request is not answered).
        @Sendable func deliveredEventually() async -> Bool {
            for _ in 0..<50 {
                if await pool.send(notification, timeout: .seconds(5)).response?.status == 200 { return true }
            }
            return false
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await pool.run() }
            #expect(await pool.send(notification, timeout: .seconds(20)).response?.status == 200)

            try simulator.setFaults(.init(internalServerErrorRate: 1))
            #expect(await pool.send(notification, timeout: .seconds(5)).response?.status == 500)
            try simulator.setFaults(.init(serviceUnavailableRate: 1))
            #expect(await pool.send(notification, timeout: .seconds(5)).response?.status == 503)
            try simulator.setFaults(.init(latency: .seconds(2)))
            if case .notAnswered(let why) = await pool.send(notification, timeout: .milliseconds(300)) {
                #expect(why.kind == .timeout)
            } else {
                Issue.record("an answer later than the deadline is a timeout")
            }
            try simulator.setFaults(.init())
            #expect(await pool.send(notification, timeout: .seconds(5)).response?.status == 200)

            /// Applies `fault`, waits until every connection open before it has closed, and checks
            /// that the pool delivers again, on a new connection.
            @Sendable func survives(_ what: String, _ fault: () -> Void) async throws {
                let before = simulator.counters.snapshot()
                let open = Set(before.connections.filter(\.open).map(\.id))
                #expect(!open.isEmpty)
                fault()
                try await waitUntil("the connections to close after \(what)", timeout: 10) {
                    !simulator.counters.snapshot().connections.contains { $0.open && open.contains($0.id) }
                }
                #expect(await deliveredEventually(), "delivered after \(what)")
                #expect(simulator.counters.snapshot().connectionsOpened > before.connectionsOpened, "a new connection after \(what)")
            }
            try await survives("a TCP reset") { simulator.resetConnections() }
            try await survives("close_notify") { simulator.closeNotifyConnections() }
            pool.shutdown()
            try await group.waitForAll()
        }
        await simulator.stop(gracePeriod: .zero)
    }
}
