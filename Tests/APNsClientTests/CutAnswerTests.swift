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
        "A rejection cut short was not delivered: certainly not processed, left to the caller's backoff, not resent at once",
        arguments: [CuttingServer.Cut.resetStream, .closeConnection]
    )
    func cutRejection(cut: CuttingServer.Cut) async throws {
        let full = #"{"reason":"TooManyRequests"}"#
        try await withCuttingServer([.init(status: 429, body: full, cut: cut), .init(status: 200, body: "", cut: .none)]) { pool, server in
            let outcome = await pool.send(Fixture.notification(), timeout: .seconds(10))
            guard case .notAnswered(let why) = outcome else {
                Issue.record("answered: \(outcome)")
                return
            }
            #expect(why.kind == .cutShort)
            #expect(why.certainlyNotProcessed)
            #expect(why.description.contains("APNs answered 429"), "\(why)")
            #expect(outcome.attemptResult == .notAnswered(why.description), "the worker retries it, even under give-up")
            #expect(server.requestCount == 1, "a cut 429 must not be sent again at once")
        }
    }

    @Test("An interim 1xx before the cut is no answer: possibly delivered, as any unanswered stream")
    func informationalIsNoAnswer() async throws {
        try await withCuttingServer([.init(status: 200, body: "{}", cut: .informationalThenReset)]) { pool, server in
            let outcome = await pool.send(Fixture.notification(), timeout: .seconds(10))
            guard case .notAnswered(let why) = outcome else {
                Issue.record("answered: \(outcome)")
                return
            }
            #expect(why.kind == .connectionFailed)
            #expect(!why.certainlyNotProcessed, "\(why)")
            #expect(server.requestCount == 1)
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
            try await withRunningPool(try credentials.configuration(port: server.port)) { pool in try await body(pool, server) }
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }
}
