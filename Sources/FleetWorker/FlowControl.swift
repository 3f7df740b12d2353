import APNsCore
import KafkaTransport
import Logging
import Metrics
import Synchronization

/// Back-pressure hysteresis: pause consuming when work in flight reaches the high watermark,
/// resume once it has fallen to the low one. Pure, so the decision is tested without Kafka.
struct WatermarkGate: Sendable, Hashable {
    enum Action: Sendable, Hashable {
        case pause
        case resume
    }

    let high: Int
    let low: Int
    private(set) var paused = false

    init(high: Int, low: Int) {
        self.high = max(1, high)
        self.low = max(0, min(low, self.high - 1))
    }

    /// High at 90% of the bound, low at half of it: the gap keeps a busy worker from pausing and
    /// resuming on every completion.
    init(capacity: Int) {
        self.init(high: capacity * 9 / 10, low: capacity / 2)
    }

    /// The action to take now that `inUse` slots are taken, if the state changes.
    mutating func update(inUse: Int) -> Action? {
        if !paused, inUse >= high {
            paused = true
            return .pause
        }
        if paused, inUse <= low {
            paused = false
            return .resume
        }
        return nil
    }
}

/// The worker's pauses of the consumer's partitions, for two reasons:
/// - back-pressure: every partition, while work in flight is above the high watermark;
/// - retry wait: one partition, while as many of its retry records wait for their `not-before`
///   as one partition may hold waiting (``waitingRecordsPerPartition``, or their bytes
///   ``waitingBytesPerPartition``). Below that the partition is read on: a record due sooner,
///   another device's, must not wait behind one that is due later (a 429 delays only that
///   device).
///
/// Both go through here, under one lock, so that the consumer sees the calls in the order the
/// decisions were made (a resume overtaking its pause would leave a partition paused for good).
/// The consumer keeps polling while paused, so rebalances are still served.
final class PartitionPauses: Sendable {
    private struct State {
        var backPressure = false
        var waiting: [TopicPartition: Waiting] = [:]
        /// Partitions paused because they hold as many waiting records as they may.
        var pausedForWaiting = 0
    }

    private struct Waiting {
        var records = 0
        var bytes = 0
        var paused = false

        var isFull: Bool { records >= PartitionPauses.waitingRecordsPerPartition || bytes >= PartitionPauses.waitingBytesPerPartition }
        /// Down to half of both: resuming at the first record below the cap would pause and
        /// resume (and fetch) with every record that stops waiting near it.
        var hasRoom: Bool { records <= PartitionPauses.waitingRecordsPerPartition / 2 && bytes <= PartitionPauses.waitingBytesPerPartition / 2 }
    }

    /// What one partition may hold waiting before it is paused: each waiting record keeps its
    /// bytes and a task, and its partition's offset cannot move past the oldest. It resumes at
    /// half of it.
    static let waitingRecordsPerPartition = 256
    static let waitingBytesPerPartition = 2 << 20

    private let consumer: KafkaConsumer
    private let logger: Logger
    private let state = Mutex(State())
    private let backPressureGauge: Gauge
    private let retryWaitGauge: Gauge

    init(consumer: KafkaConsumer, logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory) {
        self.consumer = consumer
        self.logger = logger
        backPressureGauge = Gauge(label: "apns.worker.partitions.paused", dimensions: [("reason", "back_pressure")], factory: metrics)
        retryWaitGauge = Gauge(label: "apns.worker.partitions.paused", dimensions: [("reason", "retry_wait")], factory: metrics)
        backPressureGauge.record(0)
        retryWaitGauge.record(0)
    }

    /// Brings the back-pressure gauge up to date with the assignment, which a rebalance may have
    /// changed since the pause (it would otherwise show the partitions paused at that moment
    /// until the next resume). Called before metrics are read.
    func refreshGauges() {
        state.withLock { state in
            guard state.backPressure else { return }
            backPressureGauge.record(consumer.assignment.count)
        }
    }

    /// Called by the in-flight limiter under its lock, so transitions arrive in order.
    func backPressure(_ action: WatermarkGate.Action, inUse: Int) {
        state.withLock { state in
            switch action {
            case .pause:
                guard !state.backPressure else { return }
                state.backPressure = true
                consumer.pauseAll()
                backPressureGauge.record(consumer.assignment.count)
                logger.debug("work in flight above the high watermark; partitions paused", metadata: ["worker.in_flight": "\(inUse)"])
            case .resume:
                guard state.backPressure else { return }
                state.backPressure = false
                // Partitions paused for their waiting retry records stay paused.
                consumer.endPauseAll()
                backPressureGauge.record(0)
                logger.debug("work in flight below the low watermark; partitions resumed", metadata: ["worker.in_flight": "\(inUse)"])
            }
        }
    }

    var isBackPressured: Bool { state.withLock { $0.backPressure } }

    /// A record of `partition`, `bytes` large, starts waiting; once the partition holds as many
    /// as it may, it is paused, so that no more pile up behind them.
    func startWaiting(_ partition: TopicPartition, bytes: Int) {
        state.withLock { state in
            var waiting = state.waiting[partition, default: Waiting()]
            waiting.records += 1
            waiting.bytes += bytes
            if !waiting.paused, waiting.isFull {
                waiting.paused = true
                state.pausedForWaiting += 1
                consumer.pause([partition])
                retryWaitGauge.record(state.pausedForWaiting)
            }
            state.waiting[partition] = waiting
        }
    }

    /// A record of `partition` (`bytes` large, as given to ``startWaiting(_:bytes:)``) stopped
    /// waiting; a partition paused for its waiting records resumes once it is down to half.
    func stopWaiting(_ partition: TopicPartition, bytes: Int) {
        state.withLock { state in
            guard var waiting = state.waiting[partition] else { return }
            waiting.records -= 1
            waiting.bytes -= bytes
            if waiting.paused, waiting.hasRoom {
                waiting.paused = false
                state.pausedForWaiting -= 1
                consumer.resume([partition])
                retryWaitGauge.record(state.pausedForWaiting)
            }
            state.waiting[partition] = waiting.records > 0 ? waiting : nil
        }
    }
}

/// Retry records waiting for their `not-before`, outside the in-flight bound: a record that is
/// not due yet takes no slot, so it cannot hold up the other partitions.
///
/// A waiting record wakes when it is due, or earlier when its partition is being revoked (or the
/// consumer is closing): it is then handed back to the retry topic unchanged, so that the drain
/// is not held up by a wait of up to a minute.
final class RetryWaits: Sendable {
    enum Wake: Sendable, Hashable {
        /// Its time has come: send it.
        case due
        /// Its partition is going away: re-publish it unchanged, then finish it.
        case handBack
        /// The task was cancelled, or the partition lost: leave the record unfinished; it is
        /// redelivered.
        case dropped
    }

    private struct Entry {
        var partition: TopicPartition
        var continuation: CheckedContinuation<Wake, Never>?
        var wake: Wake?
    }

    private struct State {
        var nextID: UInt64 = 0
        var entries: [UInt64: Entry] = [:]
    }

    private let state = Mutex(State())

    /// Waits `milliseconds` unless woken earlier by ``handBack(_:)`` or cancellation.
    /// `moved` is asked once the wait is registered, for a wake the partition's owner already
    /// decided: a revocation whose ``handBack(_:)`` ran before that would otherwise leave this
    /// wait to hold up its drain, and a partition lost meanwhile would stay paused for it.
    func wait(partition: TopicPartition, milliseconds: Int64, moved: () -> Wake?) async -> Wake {
        let id = state.withLock { state -> UInt64 in
            state.nextID &+= 1
            state.entries[state.nextID] = Entry(partition: partition)
            return state.nextID
        }
        if let early = moved() { wake(id, early) }
        return await withTaskGroup(of: Void.self, returning: Wake.self) { group in
            group.addTask {
                do {
                    try await Task.sleep(for: .milliseconds(milliseconds))
                    self.wake(id, .due)
                } catch {
                    // Cancelled by the group below once woken otherwise, or by the worker's own
                    // cancellation: the first wake wins, so the former is harmless.
                    self.wake(id, .dropped)
                }
            }
            let wake = await withCheckedContinuation { (continuation: CheckedContinuation<Wake, Never>) in
                let ready = state.withLock { state -> Wake? in
                    if let wake = state.entries[id]?.wake {
                        state.entries.removeValue(forKey: id)
                        return wake
                    }
                    state.entries[id]?.continuation = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
            group.cancelAll()
            return wake
        }
    }

    /// Wakes the records of `partitions` with ``Wake/handBack``.
    func handBack(_ partitions: [TopicPartition]) {
        wake(partitions, .handBack)
    }

    /// Wakes the records of `partitions` with ``Wake/dropped``.
    func drop(_ partitions: [TopicPartition]) {
        wake(partitions, .dropped)
    }

    private func wake(_ partitions: [TopicPartition], _ wake: Wake) {
        let set = Set(partitions)
        let ids = state.withLock { state in state.entries.filter { set.contains($0.value.partition) }.map(\.key) }
        for id in ids { self.wake(id, wake) }
    }

    var count: Int { state.withLock { $0.entries.count } }

    private func wake(_ id: UInt64, _ wake: Wake) {
        let continuation = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            guard var entry = state.entries[id], entry.wake == nil else { return nil }
            guard let continuation = entry.continuation else {
                entry.wake = wake
                state.entries[id] = entry
                return nil
            }
            state.entries.removeValue(forKey: id)
            return continuation
        }
        continuation?.resume(returning: wake)
    }
}

/// Carries a consumer's revocations and losses to the push worker built after it (the worker needs the
/// consumer, and the consumer takes its revocation handler when it is made):
///
/// ```swift
/// let revocations = RevocationForwarder()
/// let consumer = try KafkaConsumer(configuration: …, logger: logger, onRevoke: revocations.handler, onLoss: revocations.lossHandler)
/// let worker = PushWorker(configuration: …, consumer: consumer, …, revocations: revocations)
/// ```
public final class RevocationForwarder: Sendable {
    private struct Target {
        weak var worker: PushWorker?
    }

    private let target = Mutex(Target())

    public init() {}

    public var handler: KafkaConsumer.RevocationHandler {
        { partitions in
            let worker = self.target.withLock { $0.worker }
            await worker?.partitionsRevoked(partitions)
        }
    }

    public var lossHandler: KafkaConsumer.LossHandler {
        { partitions in
            let worker = self.target.withLock { $0.worker }
            worker?.partitionsLost(partitions)
        }
    }

    func attach(_ worker: PushWorker) {
        target.withLock { $0.worker = worker }
    }
}
