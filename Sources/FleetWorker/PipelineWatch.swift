import KafkaTransport

/// What the admin probes learn from the Kafka pipeline.
///
/// A stalled consumer pipeline makes the process not ready, so that a rollout stops there. Once
/// the stall has lasted `unhealthyAfter`, the process is not alive either: the orchestrator
/// restarts it, and its partitions move to workers that make progress. Holding them would stop
/// those partitions for good, since librdkafka 2.0.2 cannot see such a member (docs/kafka.md).
///
/// Not while messages wait in the producer for Kafka's acknowledgement, or a publish has failed
/// and is being retried: then Kafka is what is wrong (brokers gone, or refusing writes), every
/// worker waits alike, and a restart would only send again the notifications whose results wait
/// to be published. librdkafka reports such a failure only after `message.timeout.ms`; the
/// queue shows it at once.
public struct PipelineWatch: Sendable {
    private let consumer: KafkaConsumer
    private let producer: KafkaProducer
    private let publishStalls: PublishStalls
    private let unhealthyAfter: Duration?

    /// `unhealthyAfter` nil: a stall never fails the liveness probe.
    public init(consumer: KafkaConsumer, producer: KafkaProducer, publishStalls: PublishStalls, unhealthyAfter: Duration?) {
        self.consumer = consumer
        self.producer = producer
        self.publishStalls = publishStalls
        self.unhealthyAfter = unhealthyAfter
    }

    /// Why the process is not ready, as far as the pipeline goes; nil when it moves.
    func readinessProblem(now: ContinuousClock.Instant = .now) -> String? {
        consumer.stall(now: now).map { "\($0) (see the log)" }
    }

    /// Why the process should be restarted; nil when it should not.
    func livenessProblem(now: ContinuousClock.Instant = .now) -> String? {
        guard let unhealthyAfter, let stall = consumer.stall(now: now), stall.duration >= unhealthyAfter,
            producer.queuedMessages == 0, publishStalls.problem(longerThan: .zero, now: now) == nil
        else { return nil }
        return "\(stall); restarting moves its partitions to other workers"
    }
}
