import APNsCore
import FleetTestSupport
import Foundation
import Logging
import NIOCore
import Synchronization
import Testing

@testable import APNsClient
@testable import APNsSimulator

/// Dev credentials in a fresh temporary directory.
struct ClientTestCredentials {
    let directory: String
    let credentials: DevCredentials
    let summary: DevCredentials.Summary

    static func make() throws -> ClientTestCredentials {
        let directory = temporaryTestPath("apns-client-tests")
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        return ClientTestCredentials(directory: directory, credentials: credentials, summary: summary)
    }

    func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

    func tokenAuthentication() throws -> APNsAuthentication {
        try APNsAuthentication.loadToken(keyFile: path(summary.signingKeyFile), keyID: summary.keyID, teamID: summary.teamID)
    }

    func configuration(port: Int, authentication: APNsAuthentication? = nil) throws -> APNsClientConfiguration {
        var configuration = APNsClientConfiguration(
            endpoint: .custom(host: "127.0.0.1", port: port, caFile: path(summary.caFile)),
            authentication: try authentication ?? tokenAuthentication()
        )
        configuration.name = "test"
        configuration.connections = 1
        configuration.reconnectBackoff = .init(base: .milliseconds(20), maximum: .milliseconds(200))
        configuration.drainTimeout = .seconds(1)
        return configuration
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

/// A clock the test moves by hand: `advance` moves time on, `stepWallClock` only the wall
/// clock (an NTP step or a resumed VM).
final class ManualClock: Sendable {
    private let seconds: Mutex<(wall: Int64, elapsed: Int64)>
    init(_ start: Int64) { seconds = Mutex((start, 0)) }
    func advance(bySeconds delta: Int64) { seconds.withLock { $0.wall += delta; $0.elapsed += delta } }
    func stepWallClock(bySeconds delta: Int64) { seconds.withLock { $0.wall += delta } }
    var clock: APNsClock { APNsClock(now: { self.seconds.withLock { $0.wall } }, elapsed: { self.seconds.withLock { $0.elapsed } }) }
}

enum Fixture {
    static let good = String(repeating: "ab", count: 32)
    static let unregistered = String(repeating: "cd", count: 32)
    static let bound = String(repeating: "ef", count: 32)
    static let unregisteredAt: Int64 = 1_767_225_600_123
    static let payload = RawJSON(#"{"aps":{"alert":"hello"}}"#)

    static func notification(token: String = good, topic: String? = "com.example.app") -> APNsNotification {
        APNsNotification(deviceToken: token, topic: topic, pushType: .alert, priority: .immediate, expiration: 0, payload: payload)
    }

    static var logger: Logger {
        var logger = Logger(label: "apns-client-tests")
        logger.logLevel = .warning
        return logger
    }
}

func startSimulator(_ credentials: ClientTestCredentials, port: Int = 0, _ configure: (inout APNsSimulatorConfiguration) -> Void = { _ in }) async throws -> APNsSimulator {
    var configuration = try credentials.credentials.simulatorConfiguration()
    configuration.listeners = .init(host: "127.0.0.1", http2TLSPort: port)
    configuration.behaviour.unregisteredTokens = [Fixture.unregistered: Fixture.unregisteredAt]
    configuration.behaviour.deviceTopics = [Fixture.bound: "com.example.other"]
    configure(&configuration)
    return try await APNsSimulator.start(configuration)
}

/// Runs `body` with a simulator and a running pool, and always stops both.
/// Runs a pool for `body`, then shuts it down and waits for its `run` to return.
func withRunningPool(_ configuration: APNsClientConfiguration, _ body: @Sendable (APNsClientPool) async throws -> Void) async throws {
    let pool = try APNsClientPool(configuration: configuration, logger: Fixture.logger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await pool.run() }
        do {
            try await body(pool)
        } catch {
            pool.shutdown()
            throw error
        }
        pool.shutdown()
        try await group.waitForAll()
    }
}

func withPool(
    simulator configureSimulator: (inout APNsSimulatorConfiguration) -> Void = { _ in },
    client configureClient: (inout APNsClientConfiguration) -> Void = { _ in },
    _ body: @Sendable (APNsClientPool, APNsSimulator, ClientTestCredentials) async throws -> Void
) async throws {
    let credentials = try ClientTestCredentials.make()
    defer { credentials.remove() }
    let simulator = try await startSimulator(credentials, configureSimulator)
    do {
        guard let port = simulator.port(.http2TLS) else { throw APNsClientError(.configuration, "no TLS port") }
        var configuration = try credentials.configuration(port: port)
        configureClient(&configuration)
        try await withRunningPool(configuration) { pool in try await body(pool, simulator, credentials) }
    } catch {
        await simulator.stop(gracePeriod: .milliseconds(100))
        throw error
    }
    await simulator.stop(gracePeriod: .milliseconds(100))
}

extension APNsOutcome {
    var status: Int? { response?.status }
    var reason: APNsReason? { response?.reason }
    var notAnswered: APNsNotAnswered? {
        if case .notAnswered(let why) = self { return why }
        return nil
    }
}
