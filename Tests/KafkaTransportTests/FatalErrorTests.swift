import Foundation
import Testing

@testable import KafkaTransport

@Suite("librdkafka's fatal errors")
struct FatalErrorTests {
    @Test("a fatal producer error fails sends at once and ends run() with it, so the process stops instead of retrying forever")
    func fatalProducerError() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "fatal", partitions: 1)
        _ = try await producer.send(KafkaOutgoingMessage(topic: "fatal", value: Array("before".utf8)))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            producer.raiseFatalErrorForTesting("injected by the test")
            do {
                try await group.next()
                Issue.record("run() returned without the fatal error")
            } catch let error as KafkaError {
                #expect(error.code == .fatal && !error.isRetryable)
                #expect(error.description.contains("injected by the test"))
            }
        }
        await #expect(throws: KafkaError.self) {
            _ = try await producer.send(KafkaOutgoingMessage(topic: "fatal", value: Array("after".utf8)))
        }
        withExtendedLifetime(cluster) {}  // the broker stays up until the test ends
    }
}
