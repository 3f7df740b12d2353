import APNsCore
import KafkaTransport
import Synchronization

/// Produces jobs to Kafka as fast as the producer takes them, or at a given rate, and tells the
/// tally what each job must produce: as it is handed to the producer, or for a malformed job
/// (whose id comes from its offset) once Kafka has accepted it.
public struct JobPublisher: Sendable {
    public struct Summary: Sendable {
        public var published: Int
        public var failed: Int
        public var firstError: String?
        public var seconds: Double
    }

    public let producer: KafkaProducer
    public let topic: String

    public init(producer: KafkaProducer, topic: String) {
        self.producer = producer
        self.topic = topic
    }

    /// Publishes `count` generated jobs. `rate` (jobs per second) paces them; nil goes flat out.
    /// `progress` is called with the number handed to the producer so far, at most every 100 ms.
    public func publish(
        count: Int,
        generator: inout JobGenerator,
        rate: Double? = nil,
        tally: RunTally?,
        clock: @Sendable () -> Int64,
        progress: (Int) -> Void = { _ in }
    ) async throws -> Summary {
        let outcome = DeliveryCount()
        let started = ContinuousClock.now
        var lastProgress = started
        for index in 0..<count {
            if let rate, rate > 0 {
                // Clamped: a tiny rate and a large index would not fit in Int64 nanoseconds.
                let due = started + .nanoseconds(Int64(min(Double(index) / rate * 1e9, 9e18)))
                if due > .now { try await Task.sleep(until: due) }
            }
            let job = generator.next(now: clock())
            let message = KafkaOutgoingMessage(topic: topic, key: job.key, value: job.value, headers: job.headers)
            if job.kind != .malformed { tally?.expect(jobID: job.id, tokens: job.expected, kind: job.kind) }
            let onDelivery: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void = { result in
                switch result {
                case .success(let report):
                    // A job that is not JSON has no id of its own; the worker derives one from its offset.
                    if job.kind == .malformed {
                        let derived = SourcePosition(topic: report.topic, partition: report.partition, offset: report.offset).derivedJobID
                        tally?.expect(jobID: derived, tokens: job.expected, kind: job.kind)
                    }
                    outcome.delivered()
                case .failure(let error):
                    outcome.failed("\(error)")
                }
            }
            try await send(message, outcome: outcome, onDelivery: onDelivery)
            if ContinuousClock.now - lastProgress > .milliseconds(100) {
                progress(index + 1)
                lastProgress = .now
            }
        }
        progress(count)
        try await producer.flush(timeout: .seconds(120))
        let elapsed = ContinuousClock.now - started
        let counts = outcome.counts
        return Summary(published: counts.delivered, failed: counts.failed, firstError: counts.firstError, seconds: elapsed.seconds)
    }

    /// Publishes prepared records (from a file or flags), in order.
    public func publish(_ messages: [KafkaOutgoingMessage], progress: (Int) -> Void = { _ in }) async throws -> Summary {
        let outcome = DeliveryCount()
        let started = ContinuousClock.now
        for (index, message) in messages.enumerated() {
            try await send(message, outcome: outcome) { result in
                switch result {
                case .success: outcome.delivered()
                case .failure(let error): outcome.failed("\(error)")
                }
            }
            if index % 1000 == 999 { progress(index + 1) }
        }
        progress(messages.count)
        try await producer.flush(timeout: .seconds(120))
        let counts = outcome.counts
        return Summary(published: counts.delivered, failed: counts.failed, firstError: counts.firstError, seconds: (ContinuousClock.now - started).seconds)
    }

    /// Hands one message to the producer. One it refuses at once (larger than
    /// `message.max.bytes`, say) counts as failed and the rest go on: leaving here would skip
    /// the flush, drop what was queued, and say nothing of how many went out.
    private func send(
        _ message: KafkaOutgoingMessage, outcome: DeliveryCount,
        onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void
    ) async throws {
        do {
            try await producer.sendWaitingForSpace(message, onDelivery: onDelivery)
        } catch let error as KafkaError {
            outcome.failed("\(error)")
        }
    }
}

/// Delivery reports, counted from librdkafka's thread.
private final class DeliveryCount: Sendable {
    private let state = Mutex<(delivered: Int, failed: Int, firstError: String?)>((0, 0, nil))

    func delivered() { state.withLock { $0.delivered += 1 } }

    func failed(_ error: String) {
        state.withLock { state in
            state.failed += 1
            if state.firstError == nil { state.firstError = error }
        }
    }

    var counts: (delivered: Int, failed: Int, firstError: String?) { state.withLock { $0 } }
}

extension Duration {
    /// Seconds as a Double, for rates and reports.
    public var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
