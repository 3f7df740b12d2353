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
/// queue shows it at once. That excuse lasts `kafkaWaitLimit` beyond `unhealthyAfter`, not for
/// ever: a worker whose own producer is stuck (a broker only its node cannot reach) would
/// otherwise keep its partitions, unready, until someone deleted it. After a fleet-wide outage
/// that long, a restart costs duplicates only, and restarted workers wait without partitions.
public struct PipelineWatch: Sendable {
    private let consumer: KafkaConsumer
    private let producer: KafkaProducer
    private let publishStalls: PublishStalls
    private let unhealthyAfter: Duration?
    private let kafkaWaitLimit: Duration

    /// `unhealthyAfter` nil: a stall never fails the liveness probe.
    public init(consumer: KafkaConsumer, producer: KafkaProducer, publishStalls: PublishStalls, unhealthyAfter: Duration?, kafkaWaitLimit: Duration = .seconds(900)) {
        self.consumer = consumer
        self.producer = producer
        self.publishStalls = publishStalls
        self.unhealthyAfter = unhealthyAfter
        self.kafkaWaitLimit = kafkaWaitLimit
    }

    /// Why the process is not ready, as far as the pipeline goes; nil when it moves.
    func readinessProblem(now: ContinuousClock.Instant = .now) -> String? {
        consumer.stall(now: now).map { "\($0) (see the log)" }
    }

    /// Why the process should be restarted; nil when it should not.
    func livenessProblem(now: ContinuousClock.Instant = .now) -> String? {
        guard let unhealthyAfter, let stall = consumer.stall(now: now), stall.duration >= unhealthyAfter else { return nil }
        let waitingOnKafka = producer.queuedMessages > 0 || publishStalls.problem(longerThan: .zero, now: now) != nil
        guard waitingOnKafka else { return "\(stall); restarting moves its partitions to other workers" }
        guard stall.duration >= unhealthyAfter + kafkaWaitLimit else { return nil }
        return "\(stall), and waiting on Kafka for more than \(kafkaWaitLimit) past the stall limit; restarting moves its partitions to other workers"
    }
}
