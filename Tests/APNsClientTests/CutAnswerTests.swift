import APNsCore
import Testing

@testable import APNsClient
@testable import APNsSimulator

/// An answer whose HEADERS arrived but whose body was cut (a reset, a lost connection): the
/// status alone says whether APNs delivered the notification.
@Suite("APNs client: answers cut short after their HEADERS", .serialized, .timeLimit(.minutes(1)))
struct CutAnswerTests {
    @Test(
        "A 200 cut short is delivered, not sent again nor reported as possibly delivered",
        arguments: [CuttingServer.Cut.resetStream, .closeConnection]
    )
    func cutSuccess(cut: CuttingServer.Cut) async throws {
        try await withCuttingServer([.init(status: 200, body: "{}", cut: cut)]) { pool, server in
            let outcome = await pool.send(Fixture.notification(), timeout: .seconds(10))
            #expect(outcome.status == 200, "\(outcome)")
            #expect(outcome.attemptResult == .answered(status: 200, reason: nil))
            #expect(server.requestCount == 1)
        }
    }

    @Test(
        "A 410 cut short was not delivered: sent again, and the full answer's reason reported",
        arguments: [CuttingServer.Cut.resetStream, .closeConnection]
    )
    func cutRejection(cut: CuttingServer.Cut) async throws {
        let full = #"{"reason":"Unregistered","timestamp":1767225600123}"#
        try await withCuttingServer([.init(status: 410, body: full, cut: cut), .init(status: 410, body: full, cut: .none)]) { pool, server in
            let outcome = await pool.send(Fixture.notification(), timeout: .seconds(10))
            #expect(outcome.status == 410, "\(outcome)")
            #expect(outcome.reason == .unregistered)
            #expect(outcome.response?.timestamp == 1_767_225_600_123)
            #expect(server.requestCount == 2)
        }
    }

    @Test("A rejection cut short every time ends certainly not processed, naming the status")
    func cutEveryTime() async throws {
        try await withCuttingServer([.init(status: 503, body: #"{"reason":"ServiceUnavailable"}"#, cut: .resetStream)]) { pool, _ in
            let outcome = await pool.send(Fixture.notification(), timeout: .seconds(10))
            guard case .notAnswered(let why) = outcome else {
                Issue.record("answered: \(outcome)")
                return
            }
            #expect(why.certainlyNotProcessed)
            #expect(why.detail.contains("503 answer was cut short"), "\(why)")
        }
    }

    private func withCuttingServer(
        _ script: [CuttingServer.Answer],
        _ body: @Sendable (APNsClientPool, CuttingServer) async throws -> Void
    ) async throws {
        let credentials = try ClientTestCredentials.make()
        defer { credentials.remove() }
        let tls = try #require(try credentials.credentials.simulatorConfiguration().tls)
        let server = try await CuttingServer.start(tls: tls, script: script)
        do {
            let pool = try APNsClientPool(configuration: try credentials.configuration(port: server.port), logger: Fixture.logger)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await pool.run() }
                do {
                    try await body(pool, server)
                } catch {
                    pool.shutdown()
                    throw error
                }
                pool.shutdown()
                try await group.waitForAll()
            }
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }
}
