import APNsCore
import CRdKafka
import Dispatch
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// A group consumer with cooperative-sticky assignment and at-least-once offset storing.
///
/// Use:
/// 1. Run it as a `Service` (or call ``run()`` in a task): that starts its polling thread.
/// 2. Iterate ``batches`` from one task: each element is a batch of records, in offset order per
///    partition. Records are copied out of librdkafka, so they can outlive the batch.
/// 3. Call ``markFinished(_:)-(KafkaRecordReceipt)`` once per record when its work is done (any
///    thread, any order). Offsets are stored only up to the lowest unfinished record of each
///    partition, and committed every ``KafkaConsumerConfiguration/commitInterval``.
/// 4. For back-pressure, ``pause(_:)``/``pauseAll()`` and ``resume(_:)``/``resumeAll()``; polling
///    continues, so rebalances are still served.
///
/// On a revocation the consumer stops handing out records of the revoked partitions, calls the
/// `onRevoke` hook (if any) and waits, up to ``KafkaConsumerConfiguration/drainTimeout``, for the
/// hook to return and for every in-flight record of those partitions to be finished; then it
/// stores their offsets and gives them up. When an assignment is lost, in-flight work is
/// abandoned (its completions are ignored; another consumer redoes it), and the `onLoss` hook
/// (if any) hears of it.
///
/// Shutdown (graceful shutdown of the service, cancellation of ``run()``, or ``close()``): the
/// batch sequence ends, the final revocation drains as above, and the consumer leaves the group.
public final class KafkaConsumer: Service, Sendable {
    /// Called when partitions are being revoked (not lost), before their offsets are stored.
    /// Finish or abandon their in-flight work here; the consumer also waits for the records to be
    /// marked finished, up to the drain timeout.
    public typealias RevocationHandler = @Sendable (_ partitions: [TopicPartition]) async -> Void
    /// Called on the polling thread when partitions are gone without a revocation (the session
    /// expired, or a rebalance failed): nothing of theirs will be stored, and another member
    /// redoes their unfinished records, so work not started yet is best dropped. Must not block.
    public typealias LossHandler = @Sendable (_ partitions: [TopicPartition]) -> Void

    private let core: ConsumerCore
    private let handle: RDKafkaHandle
    private let onRevoke: RevocationHandler?

    public init(
        configuration: KafkaConsumerConfiguration,
        logger: Logger,
        onRevoke: RevocationHandler? = nil,
        onLoss: LossHandler? = nil
    ) throws(KafkaError) {
        guard !configuration.topics.isEmpty else {
            throw KafkaError(code: .invalidArgument, message: "a consumer needs at least one topic")
        }
        guard configuration.maxBatchSize > 0, configuration.bufferCapacity > 0, configuration.bufferCapacityBytes > 0 else {
            throw KafkaError(code: .invalidArgument, message: "maxBatchSize, bufferCapacity and bufferCapacityBytes must be positive")
        }
        let core = ConsumerCore(configuration: configuration, logger: logger, hasRevocationHandler: onRevoke != nil, onLoss: onLoss)
        let context = ClientContext(
            logger: logger, clientID: configuration.client.clientID, role: "consumer", metrics: configuration.client.metrics,
            rebalance: { rk, error, list in core.rebalance(rk, error, list) },
            committed: { error, offsets in core.commitCompleted(error, offsets) }
        )
        let handle = try RDKafkaHandle(
            type: RD_KAFKA_CONSUMER,
            properties: configuration.rdKafkaProperties(),
            context: context
        ) { conf in
            rd_kafka_conf_set_rebalance_cb(conf) { rk, error, list, _ in
                guard let rk, let list, let context = ClientContext.from(rk) else { return }
                context.groupSynced.store(true, ordering: .releasing)
                context.rebalance?(rk, error, list)
            }
            // Setting it replaces librdkafka's own COMMITFAIL warning: the core logs instead, and
            // remembers the outcome for the stop's last line.
            rd_kafka_conf_set_offset_commit_cb(conf) { rk, error, offsets, _ in
                ClientContext.from(rk)?.committed?(error, offsets)
            }
        }
        // Serve logs, errors and statistics from the consumer queue, on the polling thread.
        rd_kafka_poll_set_consumer(handle.pointer)
        self.core = core
        self.handle = handle
        self.onRevoke = onRevoke
    }

    /// The records, in batches. Iterate it from one task only. It ends when the consumer closes.
    public var batches: KafkaRecordBatches { KafkaRecordBatches(core: core) }

    /// Marks one record's work finished (successfully or not: finished means its offset may be
    /// stored). Cheap and thread-safe; call it from anywhere.
    public func markFinished(_ receipt: KafkaRecordReceipt) {
        core.markFinished(CollectionOfOne(receipt))
    }

    public func markFinished(_ record: KafkaRecord) {
        core.markFinished(CollectionOfOne(record.receipt))
    }

    /// Marks many records finished under one lock acquisition.
    public func markFinished(_ records: some Sequence<KafkaRecord>) {
        core.markFinished(records.lazy.map(\.receipt))
    }

    /// Stops fetching these partitions (records already buffered are still handed out). Takes
    /// effect within one poll timeout. Partitions not assigned are remembered until they are.
    public func pause(_ partitions: [TopicPartition]) { core.setPaused(partitions, paused: true) }

    /// Resumes fetching these partitions.
    public func resume(_ partitions: [TopicPartition]) { core.setPaused(partitions, paused: false) }

    /// Stops fetching every partition, present and future, until ``resumeAll()``.
    public func pauseAll() { core.setPauseAll(true) }

    /// Undoes ``pauseAll()`` and every ``pause(_:)``.
    public func resumeAll() { core.setPauseAll(false) }

    /// Undoes ``pauseAll()`` alone: partitions paused with ``pause(_:)`` stay paused. For callers
    /// that pause all partitions for one reason and some partitions for another.
    public func endPauseAll() { core.setPauseAll(false, keepingPartitionPauses: true) }

    /// The partitions currently assigned to this consumer.
    public var assignment: [TopicPartition] { core.assignedPartitions() }

    /// Whether `record`'s partition is still this member's under the assignment the record was
    /// fetched in. False once it was revoked or lost (even if assigned again since): its new
    /// owner redoes the record from the stored offset.
    public func isCurrent(_ record: KafkaRecord) -> Bool { core.isCurrent(record) }

    /// Whether `partition` is being revoked: from before the `onRevoke` hook is called until its
    /// drain is over. Work of it that has not started should not start.
    public func isRevoking(_ partition: TopicPartition) -> Bool { core.isRevoking(partition) }

    /// Whether work on `record` may start now: its partition is still this member's under the
    /// assignment the record was fetched in, and not being revoked. When it is being revoked, the
    /// record is left for the partition's next owner: the drain stops waiting for it, and the
    /// offset stored for the partition stays below it. Call it before starting each record of a
    /// batch during which ``rebalances`` changed; never mark a record finished that it refused.
    public func claim(_ record: KafkaRecord) -> Bool { core.claim(record) }

    /// Counts rebalances (partitions assigned, revoked or lost, and revocations starting), each
    /// as it happens. Reading it is one atomic load: a caller that read it *before* taking a batch
    /// and reads the same value later need not ask ``claim(_:)`` about that batch's records.
    public var rebalances: UInt64 { core.rebalances.load(ordering: .acquiring) }

    /// A record the caller holds on purpose (a retry record waiting for its `not-before`): the
    /// stall check does not take it for work in progress. Call ``unpark()`` once for each.
    public func park() { core.parked.add(1, ordering: .relaxed) }

    /// Ends one ``park()``.
    public func unpark() { core.parked.subtract(1, ordering: .relaxed) }

    /// A step of work on records handed out ended without finishing one (an attempt that timed
    /// out, say): the stall check counts it as progress. For slow work that is still moving
    /// (a job of thousands of notifications whose requests time out one wave after another).
    public func noteActivity() { core.activity.add(1, ordering: .relaxed) }

    /// The pipeline's stall, if it has one now: records waiting (buffered, or being worked on
    /// and not parked) while none was taken or finished, and no activity noted, for `stallWarning` or longer;
    /// or the polling thread not back from librdkafka for that long and twice `drainTimeout`
    /// (a revocation's drain runs inside librdkafka's poll). Nil while the pipeline moves, and
    /// while the consumer is not running.
    public func stall(now: ContinuousClock.Instant = .now) -> KafkaConsumerStall? { core.stall(now: now) }

    /// Records the drain at close gave up unfinished because it ran out of time: the group
    /// redoes them. A stopping worker reports it. (A rebalance's drain that ran out of time
    /// earlier was logged then; its records do not count here, or a clean stop hours later
    /// would report them again.)
    public var recordsLeftUnfinished: Int { core.recordsLeftUnfinished.load(ordering: .relaxed) }

    /// Why the latest offset commit failed (an error name, and how many partitions), or nil if
    /// it succeeded or none has completed. What finished since the last successful commit is
    /// redone by the group if this member stops or loses its partitions now; a stopping worker
    /// reports it.
    public var lastCommitFailure: String? { core.lastCommitFailure.withLock { $0 } }

    /// The assigned partitions librdkafka is currently not fetching: those paused by the caller,
    /// or all of them while the buffer is full.
    public var pausedPartitions: [TopicPartition] { core.pausedPartitions() }

    /// Records handed out and not yet released by ``markFinished(_:)-(KafkaRecordReceipt)``.
    public var inFlight: Int { core.inFlightCount() }

    /// The offset stored (or about to be) for a partition: one past its finished prefix.
    public func storedOffset(_ partition: TopicPartition) -> Int64? { core.storableOffset(partition) }

    /// Consumer lag per assigned partition: the high watermark (from the latest fetch; asked of
    /// the brokers while paused) minus the offset that would be committed now. Also published
    /// as the gauge `kafka.consumer.lag`.
    public func lag() -> [TopicPartition: Int64] { core.lag(handle.pointer) }

    /// Closes the consumer as at shutdown: ends ``batches``, drains, commits, leaves the group.
    /// ``run()`` returns once that is done.
    public func close() { core.requestClose() }

    /// Joins the group (subscribes), polls until graceful shutdown, cancellation or ``close()``,
    /// then closes the consumer. Call it once. Throws if subscribing fails.
    public func run() async throws {
        guard core.markStarted() else {
            throw KafkaError(code: .invalidArgument, message: "KafkaConsumer.run() was called twice")
        }
        let core = self.core
        let handle = self.handle
        let onRevoke = self.onRevoke
        let failure = Mutex<KafkaError?>(nil)
        await withDiscardingTaskGroup { group in
            if let onRevoke {
                group.addTask {
                    for await request in core.revocationRequests {
                        await onRevoke(request.partitions)
                        core.revocationHandled(request.id)
                    }
                }
            }
            await withGracefulShutdownHandler {
                await withTaskCancellationHandler {
                    let error = await BlockingThread.run(name: "kafka-consumer-poll") {
                        core.pollLoop(handle: handle)
                    }
                    failure.withLock { $0 = error }
                } onCancel: {
                    core.requestClose()
                }
            } onGracefulShutdown: {
                core.requestClose()
            }
            core.finishRevocationRequests()
        }
        if let error = failure.withLock({ $0 }) { throw error }
    }
}

/// A consumer pipeline that stopped moving (``KafkaConsumer/stall(now:)``), for health probes.
public struct KafkaConsumerStall: Sendable, CustomStringConvertible {
    public enum Cause: Sendable, Hashable {
        /// Records are waiting (buffered, or handed out and not finished), and none was taken or
        /// finished.
        case noProgress
        /// The polling thread has not come back from librdkafka.
        case pollingThreadStuck
    }

    public var cause: Cause
    public var duration: Duration

    public var description: String {
        let seconds = duration.components.seconds
        switch cause {
        case .noProgress: return "consumer pipeline stalled for \(seconds) s: records are waiting, none taken or finished"
        case .pollingThreadStuck: return "the Kafka polling thread has not come back from librdkafka for \(seconds) s"
        }
    }
}

/// The records of a ``KafkaConsumer``, in batches of at most
/// ``KafkaConsumerConfiguration/maxBatchSize``.
public struct KafkaRecordBatches: AsyncSequence, Sendable {
    public typealias Element = [KafkaRecord]
    let core: ConsumerCore

    public struct AsyncIterator: AsyncIteratorProtocol {
        let core: ConsumerCore

        public mutating func next() async -> [KafkaRecord]? {
            await core.nextBatch()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> [KafkaRecord]? {
            await core.nextBatch()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(core: core) }
}

struct RevocationRequest: Sendable {
    var id: UInt64
    var partitions: [TopicPartition]
}

/// The consumer's shared state and its polling thread.
///
/// `@unchecked Sendable` is safe: everything under "shared" is read and written only while
/// holding `lock`; everything under "polling thread only" is touched only by the polling thread
/// (the rebalance callback runs on it too, inside `rd_kafka_consumer_poll`/`_close`).
final class ConsumerCore: @unchecked Sendable {
    let configuration: KafkaConsumerConfiguration
    let logger: Logger
    let hasRevocationHandler: Bool
    let onLoss: KafkaConsumer.LossHandler?
    let revocationRequests: AsyncStream<RevocationRequest>
    private let revocationContinuation: AsyncStream<RevocationRequest>.Continuation

    // MARK: shared, under `lock`
    private let lock = NSCondition()
    private var tracker = OffsetTracker()
    private var buffer: [[KafkaRecord]] = []
    /// The bytes of each chunk of `buffer` (values and keys), counted once by the poll loop.
    private var bufferChunkBytes: [Int] = []
    private var bufferHead = 0
    private var bufferedCount = 0
    /// Values and keys of the buffered records, in bytes (see `bufferCapacityBytes`).
    private var bufferedBytes = 0
    private var waiter: UnsafeContinuation<[KafkaRecord]?, Never>?
    private var finished = false
    private var started = false
    private var closeRequested = false
    /// When the close was first asked for: every drain from then on (one already running in a
    /// rebalance, then the close's own) ends by that time plus the drain timeout, so that a
    /// stop stays within the budget the process gives it.
    private var closeRequestedAt: ContinuousClock.Instant?
    private var revoking: Set<TopicPartition> = []
    /// Records skipped because their offset was not past the last one taken under the same
    /// assignment (the partition's log went back), by partition: the lowest offset and a count.
    private var offsetsGoneBack: [TopicPartition: (offset: Int64, count: Int)] = [:]
    private var pendingRevocations: Set<UInt64> = []
    private var assigned: Set<TopicPartition> = []
    private var userPaused: Set<TopicPartition> = []
    private var pauseEverything = false
    private var pauseDirty = false
    private var offsetsDirty = false
    private var pollWaitingForSpace = false
    private var appliedPauses: Set<TopicPartition> = []
    /// High watermarks of paused partitions, asked of the brokers (`refreshPausedHighs`): the
    /// ones librdkafka caches come from fetches, which stop while a partition is paused.
    private var queriedHighs: [TopicPartition: Int64] = [:]
    /// Where each assigned partition's consumption starts: the group's committed offset, read
    /// once per assignment (`readStartingOffsets`). The lag of a partition nothing was taken
    /// from yet (idle, or paused from its assignment on) counts from there; it has no
    /// librdkafka position, and an idle fleet exported no lag at all.
    private var startingOffsets: [TopicPartition: Int64] = [:]
    /// Bumped whenever records are taken or released; the stall check compares it over time
    /// (cheaper than reading the clock per record).
    private var progress: UInt64 = 0
    /// Completions taken from `completions`, being applied to the tracker (kept for its capacity).
    private var applying: [KafkaRecordReceipt] = []

    // MARK: shared, under its own lock
    /// Completions not yet applied to the tracker. ``markFinished(_:)`` only appends here, under a
    /// lock held for an append, so a completion never waits behind a batch being dispatched under
    /// `lock`. They are applied, in order, before anything reads the tracker
    /// (``applyCompletionsLocked()``); the polling thread does it on every turn.
    private let completions = Mutex<[KafkaRecordReceipt]>([])
    /// Revocations draining: completions then also wake them.
    private let draining = Atomic<Int>(0)
    let recordsLeftUnfinished = Atomic<Int>(0)
    /// See ``KafkaConsumer/lastCommitFailure``. Written on the polling thread.
    let lastCommitFailure = Mutex<String?>(nil)
    private let commitsSucceeded: Counter
    private let commitsFailed: Counter

    // MARK: polling thread only
    private var epochs: [TopicPartition: UInt64] = [:]
    private var rdPaused: Set<TopicPartition> = []
    private var internallyPaused = false
    private var topicNames: [UnsafePointer<CChar>: String] = [:]
    private var lastTopic: (pointer: UnsafePointer<CChar>, name: String)?
    /// The epoch of the partition of the previous record: records come in runs of one partition.
    private var lastEpoch: (topic: String, partition: Int32, epoch: UInt64)?
    private var nextRevocationID: UInt64 = 1
    /// Per-partition gauges, made once: making a metric handle goes through the metrics factory
    /// (name checks, a registry lookup), which showed in profiles when done per poll turn.
    private let metrics: any MetricsFactory
    private var storedOffsetGauges: [TopicPartition: Gauge] = [:]
    private var lagGauges: [TopicPartition: Gauge] = [:]
    /// Made at start, so that the series exists at 0: Prometheus's `increase()` cannot see the
    /// first stall of a series that appears already counting it.
    private let stalls: Counter
    /// Written by the polling thread's housekeeping, read by probes (``stall(now:)``): when it
    /// last turned (nil while not running), and since when the pipeline has been stalled.
    private let watch = Mutex<(lastTurn: ContinuousClock.Instant?, stalledSince: ContinuousClock.Instant?)>((nil, nil))

    init(configuration: KafkaConsumerConfiguration, logger: Logger, hasRevocationHandler: Bool, onLoss: KafkaConsumer.LossHandler?) {
        self.configuration = configuration
        self.metrics = configuration.client.metrics
        self.stalls = Counter(label: "kafka.consumer.stalls", dimensions: [("client", configuration.client.clientID)], factory: configuration.client.metrics)
        self.commitsSucceeded = Counter(label: "kafka.consumer.commits", dimensions: [("client", configuration.client.clientID), ("result", "committed")], factory: configuration.client.metrics)
        self.commitsFailed = Counter(label: "kafka.consumer.commits", dimensions: [("client", configuration.client.clientID), ("result", "failed")], factory: configuration.client.metrics)
        self.logger = logger
        self.hasRevocationHandler = hasRevocationHandler
        self.onLoss = onLoss
        (revocationRequests, revocationContinuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
    }

    @discardableResult
    private func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }

    // MARK: - Caller side

    func markStarted() -> Bool {
        locked {
            defer { started = true }
            return !started
        }
    }

    func requestClose() {
        locked {
            closeRequested = true
            if closeRequestedAt == nil { closeRequestedAt = .now }
            lock.broadcast()
        }
    }

    func finishRevocationRequests() {
        revocationContinuation.finish()
    }

    func revocationHandled(_ id: UInt64) {
        locked {
            pendingRevocations.remove(id)
            lock.broadcast()
        }
    }

    func markFinished(_ receipts: some Sequence<KafkaRecordReceipt>) {
        completions.withLock { $0.append(contentsOf: receipts) }
        // A revocation may be waiting for these (it also re-checks every few milliseconds).
        if draining.load(ordering: .sequentiallyConsistent) > 0 {
            locked {
                applyCompletionsLocked()
                lock.broadcast()
            }
        }
    }

    /// Applies the completions recorded since the last call to the tracker. Call with `lock` held.
    private func applyCompletionsLocked() {
        completions.withLock { pending in
            if !pending.isEmpty { swap(&pending, &applying) }
        }
        guard !applying.isEmpty else { return }
        var advanced = false
        for receipt in applying {
            if case .advanced = tracker.finished(receipt.topicPartition, offset: receipt.offset, epoch: receipt.assignmentEpoch) {
                advanced = true
            }
        }
        applying.removeAll(keepingCapacity: true)
        // Finished, even behind a record that holds its partition's offset (a parked retry): the
        // pipeline moves.
        progress &+= 1
        if advanced { offsetsDirty = true }
        // A revocation may be waiting for these.
        if !revoking.isEmpty { lock.broadcast() }
    }

    func setPaused(_ partitions: [TopicPartition], paused: Bool) {
        locked {
            if paused { userPaused.formUnion(partitions) } else { userPaused.subtract(partitions) }
            pauseDirty = true
        }
    }

    func setPauseAll(_ paused: Bool, keepingPartitionPauses: Bool = false) {
        locked {
            pauseEverything = paused
            if !paused, !keepingPartitionPauses { userPaused.removeAll() }
            pauseDirty = true
        }
    }

    func assignedPartitions() -> [TopicPartition] { locked { Array(assigned) } }
    func isCurrent(_ record: KafkaRecord) -> Bool { locked { tracker.epoch(of: record.topicPartition) == record.assignmentEpoch } }
    func isRevoking(_ partition: TopicPartition) -> Bool { locked { revoking.contains(partition) } }

    func claim(_ record: KafkaRecord) -> Bool {
        locked {
            let partition = record.topicPartition
            guard tracker.epoch(of: partition) == record.assignmentEpoch else { return false }
            guard !revoking.isEmpty, revoking.contains(partition) else { return true }
            // The drain waiting for this partition may now be done.
            if tracker.leftUnstarted(partition, offset: record.offset, epoch: record.assignmentEpoch) { lock.broadcast() }
            return false
        }
    }
    let rebalances = Atomic<UInt64>(0)
    /// Records held on purpose (see `KafkaConsumer.park()`).
    let parked = Atomic<Int>(0)
    /// Steps of work on records the caller reported (see `KafkaConsumer.noteActivity()`).
    let activity = Atomic<UInt64>(0)
    func pausedPartitions() -> [TopicPartition] { locked { Array(appliedPauses) } }
    func inFlightCount() -> Int {
        locked {
            applyCompletionsLocked()
            return tracker.totalInFlight
        }
    }

    func storableOffset(_ partition: TopicPartition) -> Int64? {
        locked {
            applyCompletionsLocked()
            return tracker.storableOffset(partition)
        }
    }

    func nextBatch() async -> [KafkaRecord]? {
        // Fast path: a batch is ready.
        if let batch = locked({ takeBatchLocked() }) { return batch }
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<[KafkaRecord]?, Never>) in
                lock.lock()
                if let batch = takeBatchLocked() {
                    lock.unlock()
                    continuation.resume(returning: batch)
                } else if finished || Task.isCancelled {
                    lock.unlock()
                    continuation.resume(returning: nil)
                } else {
                    waiter = continuation
                    lock.unlock()
                }
            }
        } onCancel: {
            let waiting: UnsafeContinuation<[KafkaRecord]?, Never>? = locked {
                defer { waiter = nil }
                return waiter
            }
            waiting?.resume(returning: nil)
        }
    }

    /// Takes the next non-empty batch of dispatchable records, registering them with the tracker.
    private func takeBatchLocked() -> [KafkaRecord]? {
        while bufferHead < buffer.count {
            let chunk = buffer[bufferHead]
            buffer[bufferHead] = []
            bufferedBytes -= bufferChunkBytes[bufferHead]
            bufferHead += 1
            if bufferHead == buffer.count {
                buffer.removeAll(keepingCapacity: true)
                bufferChunkBytes.removeAll(keepingCapacity: true)
                bufferHead = 0
            }
            bufferedCount -= chunk.count
            if pollWaitingForSpace, hasRoomLocked { lock.broadcast() }
            // Records of partitions being revoked, or fetched under an older assignment, are
            // dropped: they were never dispatched, so they will be fetched again. Usually none is,
            // and the chunk is handed over as is, without copying records.
            var rejected: [Int] = []
            // Read the fields in place: copying each record would retain and release its buffers.
            chunk.withUnsafeBufferPointer { records in
                for index in records.indices {
                    let partition = records[index].topicPartition
                    if !revoking.isEmpty && revoking.contains(partition) {
                        rejected.append(index)
                    } else if !tracker.dispatched(partition, offset: records[index].offset, epoch: records[index].assignmentEpoch) {
                        rejected.append(index)
                        if tracker.epoch(of: partition) == records[index].assignmentEpoch {
                            let offset = records[index].offset
                            let seen = offsetsGoneBack[partition]
                            offsetsGoneBack[partition] = (min(seen?.offset ?? offset, offset), (seen?.count ?? 0) + 1)
                        }
                    }
                }
            }
            var out = chunk
            if !rejected.isEmpty {
                out = chunk.indices.filter { !rejected.contains($0) }.map { chunk[$0] }
            }
            if !out.isEmpty {
                progress &+= 1
                return out
            }
        }
        return nil
    }

    func lag(_ rk: OpaquePointer) -> [TopicPartition: Int64] {
        // Counted from the finished prefix; before anything finished this assignment, from the
        // oldest record still in flight (a first record stuck shows its whole backlog); with
        // nothing in flight from librdkafka's position; before any record was taken, from the
        // group's committed offset.
        let snapshot: [(TopicPartition, Int64?, Int64, Int64?)] = locked {
            applyCompletionsLocked()
            return assigned.map { ($0, tracker.storableOffset($0) ?? tracker.oldestUnfinished($0), queriedHighs[$0] ?? -1, startingOffsets[$0]) }
        }
        guard !snapshot.isEmpty else { return [:] }
        let list = TopicPartitionList(snapshot.map(\.0))
        rd_kafka_position(rk, list.pointer)
        let positions = TopicPartitionList.read(list.pointer)
        var out: [TopicPartition: Int64] = [:]
        for (index, (partition, storable, queried, starting)) in snapshot.enumerated() {
            var low: Int64 = -1
            var high: Int64 = -1
            let error = rd_kafka_get_watermark_offsets(rk, partition.topic, partition.partition, &low, &high)
            if error != RD_KAFKA_RESP_ERR_NO_ERROR { high = -1 }
            high = max(high, queried)
            guard high >= 0 else { continue }
            let position = positions[index].1
            guard let consumed = storable ?? (position >= 0 ? position : nil) ?? starting.map({ $0 == Self.fromLatest ? high : $0 }) else { continue }
            out[partition] = max(0, high - consumed)
        }
        return out
    }

    // MARK: - Polling thread

    /// Subscribes, then polls until asked to close. Returns the error if subscribing failed.
    func pollLoop(handle: RDKafkaHandle) -> KafkaError? {
        let rk = handle.pointer
        // Subscribing here, not in init, so that a consumer joins its group only once something
        // polls it: a member that does not poll would hold up every rebalance of the group.
        let topics = TopicPartitionList(capacity: configuration.topics.count)
        for topic in configuration.topics {
            topics.add(TopicPartition(topic: topic, partition: RD_KAFKA_PARTITION_UA))
        }
        let subscribeError = rd_kafka_subscribe(rk, topics.pointer)
        // Before the handle can be destroyed: the polling thread holds it until it returns.
        if subscribeError == RD_KAFKA_RESP_ERR_NO_ERROR { handle.context.subscribed.store(true, ordering: .releasing) }
        guard subscribeError == RD_KAFKA_RESP_ERR_NO_ERROR else {
            let waiting: UnsafeContinuation<[KafkaRecord]?, Never>? = locked {
                finished = true
                defer { waiter = nil }
                return waiter
            }
            waiting?.resume(returning: nil)
            return KafkaError(
                code: .subscription,
                message: "could not subscribe to \(configuration.topics.joined(separator: ", "))",
                rdKafka: subscribeError
            )
        }
        let batchBytesLimit = max(1, configuration.bufferCapacityBytes / 4)
        let pollMilliseconds = Int32(clamping: max(1, configuration.pollTimeout.milliseconds))
        var batch: [KafkaRecord] = []
        batch.reserveCapacity(configuration.maxBatchSize)
        var nextHousekeeping = ContinuousClock.now
        var nextPausedQuery = ContinuousClock.now
        var lastProgress = (count: UInt64(0), at: ContinuousClock.now)
        watch.withLock { $0 = (lastProgress.at, nil) }

        while true {
            // A fatal error makes the client unusable: close (what finished is still stored) and
            // report it, so that the process stops rather than hold its partitions doing nothing.
            if handle.context.fatalError.withLock({ $0 }) != nil { break }
            lock.lock()
            if closeRequested {
                lock.unlock()
                break
            }
            var full = isFullLocked
            if full {
                // Give the caller a moment to take records before pausing the partitions.
                pollWaitingForSpace = true
                _ = lock.wait(until: Date(timeIntervalSinceNow: 0.05))
                pollWaitingForSpace = false
                full = isFullLocked
            }
            let resumeInternal = internallyPaused && hasRoomLocked
            let applyPauses = pauseDirty || resumeInternal || (full && !internallyPaused)
            pauseDirty = false
            applyCompletionsLocked()
            let toStore = offsetsDirty ? tracker.takeStorable() : []
            offsetsDirty = false
            lock.unlock()

            if full { internallyPaused = true } else if resumeInternal { internallyPaused = false }
            if applyPauses { self.applyPauses(rk) }
            if !toStore.isEmpty { storeOffsets(rk, toStore) }

            // While paused for back-pressure, poll briefly: only to serve rebalances and events.
            var timeout = internallyPaused ? Int32(10) : pollMilliseconds
            var polledAt: UInt64 = 0
            var batchBytes = 0
            while batch.count < configuration.maxBatchSize, batchBytes < batchBytesLimit {
                guard let message = rd_kafka_consumer_poll(rk, timeout) else { break }
                // One clock read per burst: the rest of it comes back within microseconds.
                if timeout != 0 { polledAt = DispatchTime.now().uptimeNanoseconds }
                timeout = 0
                if message.pointee.err == RD_KAFKA_RESP_ERR_NO_ERROR {
                    batch.append(record(from: message, polledAt: polledAt))
                    batchBytes += message.pointee.len + message.pointee.key_len
                } else {
                    consumerError(message.pointee, rk: rk)
                }
                rd_kafka_message_destroy(message)
            }
            if !batch.isEmpty {
                handle.context.consumed.increment(by: Int64(batch.count))
                deliver(batch, bytes: batchBytes)
                batch = []
                batch.reserveCapacity(configuration.maxBatchSize)
            }

            let now = ContinuousClock.now
            if now >= nextHousekeeping {
                nextHousekeeping = now + .seconds(1)
                if !rdPaused.isEmpty, now >= nextPausedQuery {
                    nextPausedQuery = now + Self.pausedHighsInterval
                    refreshPausedHighs(rk)
                }
                readStartingOffsets(rk)
                publishLag(rk)
                reportOffsetsGoneBack()
                let stalledSince = checkStall(now: now, last: &lastProgress)
                watch.withLock { $0 = (now, stalledSince) }
            }
        }
        // Stopping: the close's drain below must not look like a stall, nor the loop's last turn
        // like a polling thread gone quiet.
        watch.withLock { $0 = (nil, nil) }

        // Closing: hand out nothing more; what was buffered was never dispatched and is refetched
        // by whoever owns the partition next.
        let waiting: UnsafeContinuation<[KafkaRecord]?, Never>? = locked {
            finished = true
            buffer.removeAll()
            bufferChunkBytes.removeAll()
            bufferHead = 0
            bufferedCount = 0
            bufferedBytes = 0
            defer { waiter = nil }
            return waiter
        }
        waiting?.resume(returning: nil)
        // Store what finished since the last loop, then close: that serves the final revocation
        // (draining, storing) and commits.
        let toStore = locked {
            applyCompletionsLocked()
            return tracker.takeStorable()
        }
        if !toStore.isEmpty { storeOffsets(rk, toStore) }
        recordsLeftUnfinished.store(0, ordering: .relaxed)
        leaveBeforeClosing(rk)
        let error = rd_kafka_consumer_close(rk)
        if error != RD_KAFKA_RESP_ERR_NO_ERROR {
            logger.warning("consumer close reported an error", metadata: ["kafka.error": "\(KafkaError.errorName(error))"])
        }
        logger.debug("consumer closed")
        return handle.context.fatalError.withLock { $0 }
    }

    /// An offset commit completed (an automatic one, or the revocation's at close). Only the
    /// first failure in a row is a warning: with the coordinator away, commits fail every
    /// `commitInterval` until it is back, and one line says so.
    func commitCompleted(_ error: rd_kafka_resp_err_t, _ offsets: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?) {
        // Nothing stored since the last commit: no request was sent.
        if error == RD_KAFKA_RESP_ERR__NO_OFFSET { return }
        var total = 0
        var failed: [(partition: String, error: rd_kafka_resp_err_t)] = []
        if let offsets, let elements = offsets.pointee.elems {
            for element in UnsafeBufferPointer(start: elements, count: Int(offsets.pointee.cnt)) where element.offset >= 0 {
                total += 1
                let partitionError = element.err != RD_KAFKA_RESP_ERR_NO_ERROR ? element.err : error
                guard partitionError != RD_KAFKA_RESP_ERR_NO_ERROR else { continue }
                let topic = element.topic.map { String(cString: $0) } ?? "?"
                failed.append(("\(topic)[\(element.partition)]", partitionError))
            }
        }
        if failed.isEmpty, error != RD_KAFKA_RESP_ERR_NO_ERROR {
            failed.append(("all", error))
        }
        guard let first = failed.first else {
            commitsSucceeded.increment()
            let recovered = lastCommitFailure.withLock { failure in
                defer { failure = nil }
                return failure != nil
            }
            if recovered { logger.info("offset commits succeed again") }
            return
        }
        commitsFailed.increment()
        let name = KafkaError.errorName(first.error)
        let description = total > 0 ? "\(name) for \(failed.count) of \(total) partitions" : name
        let firstInARow = lastCommitFailure.withLock { failure in
            defer { failure = description }
            return failure == nil
        }
        let metadata: Logger.Metadata = [
            "kafka.error": "\(description)",
            "kafka.partitions": "\(failed.prefix(8).map(\.partition).joined(separator: ","))",
        ]
        if firstInARow {
            logger.warning("committing offsets failed; until a commit succeeds, a stop or a rebalance hands out again what finished since the last one", metadata: metadata)
        } else {
            logger.debug("committing offsets failed again", metadata: metadata)
        }
    }

    /// librdkafka 2.0.2 (fixed in 2.4.0) turns any assignment the application makes once close
    /// has begun into a full unassign. A cooperative rebalance's assign callback still queued
    /// when the consumer stops would then drop every partition before the final revocation could
    /// store its offsets (the work finished during the drain is redone by the next owner), and a
    /// member that owned nothing would never finish closing. Unsubscribing first leaves through
    /// an ordinary revocation, served here like any other; close then has nothing to revoke.
    /// Done once the queue has been idle for a poll with nothing assigned and the group left
    /// (the member id is cleared as the LeaveGroup goes out, which happens only once the
    /// revocation's commits are done: closing before that would skip the LeaveGroup, and the
    /// partitions would wait for the session timeout); bounded by the drain timeout plus 5 s.
    ///
    /// Not for a static member (`group.instance.id`): unsubscribing would send the LeaveGroup
    /// that a static member's close leaves out, so that a restart within the session timeout
    /// gets its partitions back without a rebalance.
    private func leaveBeforeClosing(_ rk: OpaquePointer) {
        if let instance = configuration.client.properties["group.instance.id"], !instance.isEmpty { return }
        let error = rd_kafka_unsubscribe(rk)
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
            logger.warning("unsubscribing before close failed", metadata: ["kafka.error": "\(KafkaError.errorName(error))"])
            return
        }
        let giveUpAt = ContinuousClock.now + configuration.drainTimeout + .seconds(5)
        while ContinuousClock.now < giveUpAt {
            // Records still fetched for partitions being revoked are dropped: never started,
            // their offsets are not stored, and the next owner takes them.
            guard let message = rd_kafka_consumer_poll(rk, 100) else {
                if Self.assignmentIsEmpty(rk), Self.hasLeftGroup(rk) { return }
                continue
            }
            if message.pointee.err != RD_KAFKA_RESP_ERR_NO_ERROR { consumerError(message.pointee, rk: rk) }
            rd_kafka_message_destroy(message)
        }
        logger.warning("the revocation or the LeaveGroup did not complete within the drain timeout after unsubscribing; closing anyway")
    }

    /// No member id: the LeaveGroup went out (or could not, with no coordinator), or the member
    /// never joined or lost its membership.
    private static func hasLeftGroup(_ rk: OpaquePointer) -> Bool {
        guard let memberID = rd_kafka_memberid(rk) else { return true }
        defer { rd_kafka_mem_free(rk, memberID) }
        return memberID.pointee == 0
    }

    private static func assignmentIsEmpty(_ rk: OpaquePointer) -> Bool {
        var list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
        guard rd_kafka_assignment(rk, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return true }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        return list.pointee.cnt == 0
    }

    /// The buffer is full by records or by bytes; the poll loop waits, then pauses fetching.
    private var isFullLocked: Bool {
        bufferedCount >= configuration.bufferCapacity || bufferedBytes >= configuration.bufferCapacityBytes
    }

    /// Down to half of both bounds: fetching may go on.
    private var hasRoomLocked: Bool {
        bufferedCount <= configuration.bufferCapacity / 2 && bufferedBytes <= configuration.bufferCapacityBytes / 2
    }

    /// Buffers `batch`, whose values and keys are `bytes` long.
    private func deliver(_ batch: [KafkaRecord], bytes: Int) {
        lock.lock()
        guard !finished else {
            lock.unlock()
            return
        }
        buffer.append(batch)
        bufferChunkBytes.append(bytes)
        bufferedCount += batch.count
        bufferedBytes += bytes
        var resumption: (UnsafeContinuation<[KafkaRecord]?, Never>, [KafkaRecord])?
        if let waiting = waiter, let ready = takeBatchLocked() {
            waiter = nil
            resumption = (waiting, ready)
        }
        lock.unlock()
        if let (continuation, ready) = resumption { continuation.resume(returning: ready) }
    }

    private func record(from message: UnsafeMutablePointer<rd_kafka_message_t>, polledAt: UInt64) -> KafkaRecord {
        let m = message.pointee
        let topic = topicName(m.rkt)
        let epoch: UInt64
        if let last = lastEpoch, last.partition == m.partition, last.topic == topic {
            epoch = last.epoch
        } else {
            epoch = epochs[TopicPartition(topic: topic, partition: m.partition)] ?? 0
            lastEpoch = (topic, m.partition, epoch)
        }
        let key = m.key.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: m.key_len)) }
        let value = m.payload.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: m.len)) } ?? []
        var headers: [RecordHeader] = []
        var list: OpaquePointer?
        if rd_kafka_message_headers(message, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list {
            var index = 0
            var name: UnsafePointer<CChar>?
            var headerValue: UnsafeRawPointer?
            var size = 0
            while rd_kafka_header_get_all(list, index, &name, &headerValue, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
                let bytes = headerValue.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: size)) }
                headers.append(RecordHeader(key: name.map { String(cString: $0) } ?? "", value: bytes))
                index += 1
            }
        }
        var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let timestamp = rd_kafka_message_timestamp(message, &timestampType)
        return KafkaRecord(
            topic: topic,
            partition: m.partition,
            offset: m.offset,
            key: key,
            value: value,
            headers: headers,
            timestamp: timestamp >= 0 ? timestamp : nil,
            assignmentEpoch: epoch,
            polledAtUptimeNanoseconds: polledAt
        )
    }

    /// Topic names, cached by librdkafka's name pointer (stable while the topic object lives; the
    /// cached text is compared, so a reused address cannot yield a wrong name).
    private func topicName(_ rkt: OpaquePointer?) -> String {
        guard let rkt, let name = rd_kafka_topic_name(rkt) else { return "" }
        // Records come in runs of one topic: try the previous record's name first.
        if let last = lastTopic, last.pointer == name, last.name.withCString({ strcmp($0, name) == 0 }) {
            return last.name
        }
        let text: String
        if let cached = topicNames[name], cached.withCString({ strcmp($0, name) == 0 }) {
            text = cached
        } else {
            text = String(cString: name)
            topicNames[name] = text
        }
        lastTopic = (name, text)
        return text
    }

    private func consumerError(_ message: rd_kafka_message_t, rk: OpaquePointer) {
        if message.err == RD_KAFKA_RESP_ERR__FATAL { ClientContext.from(rk)?.recordFatal(RDKafkaHandle.fatalError(of: rk)) }
        let name = KafkaError.errorName(message.err)
        Counter(label: "kafka.consumer.errors", dimensions: [("client", configuration.client.clientID), ("code", name)], factory: metrics).increment()
        let text = message.payload.map {
            String(decoding: UnsafeRawBufferPointer(start: $0, count: message.len), as: UTF8.self)
        } ?? KafkaError.errorText(message.err)
        logger.warning("consumer error", metadata: ["kafka.error": "\(name)", "kafka.reason": "\(text)"])
    }

    private func applyPauses(_ rk: OpaquePointer) {
        let desired: Set<TopicPartition> = locked {
            internallyPaused || pauseEverything ? assigned : assigned.intersection(userPaused)
        }
        let toPause = desired.subtracting(rdPaused)
        let toResume = rdPaused.subtracting(desired)
        if !toPause.isEmpty {
            let list = TopicPartitionList(toPause)
            rd_kafka_pause_partitions(rk, list.pointer)
            logger.debug("paused partitions", metadata: ["kafka.partitions": "\(toPause.map(\.description).sorted())"])
        }
        if !toResume.isEmpty {
            let list = TopicPartitionList(toResume)
            rd_kafka_resume_partitions(rk, list.pointer)
            wakeFetchers(rk, resumed: toResume)
            logger.debug("resumed partitions", metadata: ["kafka.partitions": "\(toResume.map(\.description).sorted())"])
        }
        rdPaused = desired
        locked {
            appliedPauses = desired
            // Fetches give the high watermark again; a figure asked while paused must not
            // outlive that (a topic recreated meanwhile would report a lag too high for good).
            for partition in toResume { queriedHighs.removeValue(forKey: partition) }
        }
    }

    /// Makes the broker threads of resumed partitions fetch now rather than in up to a second.
    ///
    /// librdkafka 2.0.2 serves pause and resume on its main thread, without waking the broker
    /// thread. A broker thread whose partitions were all paused sleeps up to 1 s before it looks
    /// again, so every resume left the worker without records for about half a second (the
    /// benchmark's worker idled half of the time at its in-flight bound). A request to a broker
    /// wakes its thread: `rd_kafka_offsets_for_times` sends one ListOffsets per partition leader
    /// (the leader's thread is the one that fetches, as no rack-aware follower fetching is set up).
    /// Its answer is not needed: the call waits 1 ms at most, and librdkafka drops later answers.
    private func wakeFetchers(_ rk: OpaquePointer, resumed: Set<TopicPartition>) {
        let list = TopicPartitionList(capacity: resumed.count)
        for partition in resumed { list.add(partition, offset: -1) }  // -1: the latest offset
        let error = rd_kafka_offsets_for_times(rk, list.pointer, 1)
        if error != RD_KAFKA_RESP_ERR_NO_ERROR, error != RD_KAFKA_RESP_ERR__TIMED_OUT {
            logger.debug("could not wake the fetchers after a resume", metadata: ["kafka.error": "\(KafkaError.errorName(error))"])
        }
    }

    /// How often paused partitions' high watermarks are asked of the brokers.
    static let pausedHighsInterval: Duration = .seconds(2)

    /// Asks the brokers for the high watermarks of the paused partitions, so that their lag keeps
    /// growing with the backlog while nothing is fetched (an APNs outage holding every slot is
    /// when the lag matters most). One ListOffsets per leader ("latest", timestamp -1); it waits
    /// at most 50 ms (the poll thread serves rebalances and resumes meanwhile; a broker answers
    /// within a millisecond or two), and a partition without an answer keeps its previous figure.
    private func refreshPausedHighs(_ rk: OpaquePointer) {
        let list = TopicPartitionList(capacity: rdPaused.count)
        for partition in rdPaused { list.add(partition, offset: -1) }
        let error = rd_kafka_offsets_for_times(rk, list.pointer, 50)
        if error != RD_KAFKA_RESP_ERR_NO_ERROR, error != RD_KAFKA_RESP_ERR__TIMED_OUT {
            logger.debug("could not read the high watermarks of paused partitions", metadata: ["kafka.error": "\(KafkaError.errorName(error))"])
        }
        let answers = TopicPartitionList.read(list.pointer).filter { $0.2 == RD_KAFKA_RESP_ERR_NO_ERROR && $0.1 >= 0 }
        guard !answers.isEmpty else { return }
        locked {
            for (partition, high, _) in answers where assigned.contains(partition) {
                queriedHighs[partition] = max(queriedHighs[partition] ?? -1, high)
            }
        }
    }

    /// Stands for "the high watermark" in `startingOffsets`: no offset committed, and
    /// `auto.offset.reset` starts such a partition at its end.
    private static let fromLatest: Int64 = -1

    /// Reads the committed offsets of assigned partitions whose start is not known yet: one
    /// OffsetFetch per assignment, waiting 50 ms at most (the poll thread serves rebalances);
    /// what is not answered by then is asked again a second later. Without a commit, a
    /// partition starts where `auto.offset.reset` says: the log's start, taken as its low
    /// watermark (0 before librdkafka knows one), or its end.
    private func readStartingOffsets(_ rk: OpaquePointer) {
        let unknown = locked { assigned.filter { startingOffsets[$0] == nil } }
        guard !unknown.isEmpty else { return }
        let list = TopicPartitionList(capacity: unknown.count)
        for partition in unknown { list.add(partition, offset: Int64(RD_KAFKA_OFFSET_INVALID)) }
        let error = rd_kafka_committed(rk, list.pointer, 50)
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
            if error != RD_KAFKA_RESP_ERR__TIMED_OUT {
                logger.debug("could not read the committed offsets of new partitions", metadata: ["kafka.error": "\(KafkaError.errorName(error))"])
            }
            return
        }
        let fromEarliest = ["earliest", "smallest", "beginning"].contains(configuration.autoOffsetReset)
        var starts: [TopicPartition: Int64] = [:]
        for (partition, offset, partitionError) in TopicPartitionList.read(list.pointer) where partitionError == RD_KAFKA_RESP_ERR_NO_ERROR {
            if offset >= 0 {
                starts[partition] = offset
            } else if fromEarliest {
                var low: Int64 = -1
                var high: Int64 = -1
                _ = rd_kafka_get_watermark_offsets(rk, partition.topic, partition.partition, &low, &high)
                starts[partition] = max(0, low)
            } else {
                starts[partition] = Self.fromLatest
            }
        }
        locked {
            for (partition, start) in starts where assigned.contains(partition) { startingOffsets[partition] = start }
        }
    }

    private func storeOffsets(_ rk: OpaquePointer, _ offsets: [(TopicPartition, Int64)]) {
        let list = TopicPartitionList(capacity: offsets.count)
        for (partition, offset) in offsets { list.add(partition, offset: offset) }
        let error = rd_kafka_offsets_store(rk, list.pointer)
        let stored = TopicPartitionList.read(list.pointer)
        for (partition, offset, partitionError) in stored where partitionError == RD_KAFKA_RESP_ERR_NO_ERROR {
            partitionGauge(&storedOffsetGauges, partition) { Gauge(label: "kafka.consumer.offset.stored", dimensions: $0, factory: metrics) }.record(offset)
        }
        // Per-partition errors (e.g. _STATE for a partition no longer assigned) are in the list;
        // librdkafka 2.0.2 returns no error overall when any partition succeeded.
        let failed = stored.filter { $0.2 != RD_KAFKA_RESP_ERR_NO_ERROR }
        if error != RD_KAFKA_RESP_ERR_NO_ERROR || !failed.isEmpty {
            logger.warning(
                "storing offsets failed",
                metadata: [
                    "kafka.error": "\(KafkaError.errorName(error))",
                    "kafka.partitions": "\(failed.map { "\($0.0)@\($0.1): \(KafkaError.errorName($0.2))" })",
                ]
            )
        }
    }

    /// Records at offsets this assignment had already taken are skipped: nothing tells them from
    /// a redelivery. After a log truncation (an unclean leader election) they may be new jobs,
    /// which then get no result, so every such skip is reported, once per second at most.
    private func reportOffsetsGoneBack() {
        let skipped: [TopicPartition: (offset: Int64, count: Int)] = locked {
            defer { offsetsGoneBack.removeAll() }
            return offsetsGoneBack
        }
        for (partition, skip) in skipped.sorted(by: { $0.key.description < $1.key.description }) {
            Counter(label: "kafka.consumer.records.skipped", dimensions: [("topic", partition.topic), ("partition", "\(partition.partition)")], factory: metrics)
                .increment(by: skip.count)
            logger.warning(
                "records at offsets already taken were skipped: the partition's log went back (an offset reset, or truncation after an unclean leader election)",
                metadata: ["kafka.partition": "\(partition)", "kafka.offset": "\(skip.offset)", "kafka.skipped": "\(skip.count)"]
            )
        }
    }

    private func publishLag(_ rk: OpaquePointer) {
        for (partition, lag) in lag(rk) {
            partitionGauge(&lagGauges, partition) { Gauge(label: "kafka.consumer.lag", dimensions: $0, factory: metrics) }.record(lag)
        }
    }

    /// The partition's gauge from `gauges`, made by `make` (given the partition's dimensions) the
    /// first time.
    private func partitionGauge(
        _ gauges: inout [TopicPartition: Gauge],
        _ partition: TopicPartition,
        make: ([(String, String)]) -> Gauge
    ) -> Gauge {
        if let gauge = gauges[partition] { return gauge }
        let gauge = make([("client", configuration.client.clientID), ("topic", partition.topic), ("partition", "\(partition.partition)")])
        gauges[partition] = gauge
        return gauge
    }

    /// librdkafka 2.0.2 resets max.poll.interval.ms on every poll, so it cannot see a worker
    /// that stopped taking or finishing records: report that here (once per stall). Returns since
    /// when the pipeline has been stalled, once that is `stallWarning` or longer.
    private func checkStall(now: ContinuousClock.Instant, last: inout (count: UInt64, at: ContinuousClock.Instant)) -> ContinuousClock.Instant? {
        let (busy, count) = locked {
            applyCompletionsLocked()
            // Records finished early wait only for earlier ones of their partition (a parked
            // retry record, say): not work in progress.
            return (bufferedCount > 0 || tracker.totalInProgress > parked.load(ordering: .relaxed), progress &+ activity.load(ordering: .relaxed))
        }
        if count != last.count || !busy { last = (count, now) }
        let since = last.at
        guard busy, now - since > configuration.stallWarning else { return nil }
        let alreadyReported = watch.withLock { $0.stalledSince } == since
        if !alreadyReported {
            stalls.increment()
            logger.error(
                "consumer pipeline stalled: records are waiting but none was taken or finished",
                metadata: ["kafka.stalled_for": "\(now - since)"]
            )
        }
        return since
    }

    func stall(now: ContinuousClock.Instant) -> KafkaConsumerStall? {
        let (lastTurn, stalledSince) = watch.withLock { $0 }
        guard let lastTurn else { return nil }
        // Housekeeping comes about once a second; a revocation's drain holds the thread inside
        // librdkafka's poll for up to `drainTimeout` (twice, when one poll serves two).
        let quiet = now - lastTurn
        if quiet > max(configuration.stallWarning, configuration.drainTimeout * 2 + .seconds(5)) {
            // Stalled before the thread went quiet, perhaps: the longer of the two.
            return KafkaConsumerStall(cause: .pollingThreadStuck, duration: max(quiet, stalledSince.map { now - $0 } ?? .zero))
        }
        return stalledSince.map { KafkaConsumerStall(cause: .noProgress, duration: now - $0) }
    }

    // MARK: - Rebalance (polling thread, inside rd_kafka_consumer_poll / _close)

    func rebalance(
        _ rk: OpaquePointer,
        _ event: rd_kafka_resp_err_t,
        _ list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>
    ) {
        let partitions = TopicPartitionList.read(list).map(\.0)
        lastEpoch = nil
        let cooperative = rd_kafka_rebalance_protocol(rk).map { String(cString: $0) } == "COOPERATIVE"
        switch event {
        case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
            locked {
                applyCompletionsLocked()
                countRebalanceLocked()
                for partition in partitions {
                    epochs[partition] = tracker.assign(partition)
                    assigned.insert(partition)
                }
            }
            if cooperative {
                if let error = rd_kafka_incremental_assign(rk, list) {
                    stopAfterFailedRebalanceCall(rk, KafkaError(code: .rebalance, message: "incremental assign failed", consuming: error))
                }
            } else {
                let error = rd_kafka_assign(rk, list)
                if error != RD_KAFKA_RESP_ERR_NO_ERROR {
                    logger.error("\(KafkaError(code: .rebalance, message: "assign failed", rdKafka: error))")
                }
            }
            // librdkafka keeps an application pause on a partition across unassign and assign: a
            // partition paused when its assignment was lost (or revoked) would come back paused
            // while `rdPaused` says it is not, and never be fetched again. Start every assigned
            // partition resumed; `applyPauses` then pauses what should be.
            if !partitions.isEmpty { rd_kafka_resume_partitions(rk, list) }
            logger.info("partitions assigned", metadata: ["kafka.partitions": "\(partitions.map(\.description).sorted())"])
            applyPauses(rk)

        case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
            if rd_kafka_assignment_lost(rk) != 0 {
                abandon(partitions)
                logger.warning(
                    "partition assignment lost; abandoning in-flight work",
                    metadata: ["kafka.partitions": "\(partitions.map(\.description).sorted())"]
                )
            } else {
                drain(partitions)
                let offsets: [(TopicPartition, Int64)] = locked {
                    applyCompletionsLocked()
                    defer {
                        revoking.subtract(partitions)
                        for partition in partitions { assigned.remove(partition) }
                    }
                    countRebalanceLocked()
                    return partitions.compactMap { partition in tracker.revoke(partition).map { (partition, $0) } }
                }
                // Must happen before unassigning: librdkafka refuses offsets of unassigned partitions.
                if !offsets.isEmpty { storeOffsets(rk, offsets) }
                logger.info(
                    "partitions revoked",
                    metadata: ["kafka.partitions": "\(partitions.map(\.description).sorted())", "kafka.stored": "\(offsets.map { "\($0.0)@\($0.1)" })"]
                )
            }
            forget(partitions)
            if cooperative {
                if let error = rd_kafka_incremental_unassign(rk, list) {
                    stopAfterFailedRebalanceCall(rk, KafkaError(code: .rebalance, message: "incremental unassign failed", consuming: error))
                }
            } else {
                _ = rd_kafka_assign(rk, nil)
            }

        default:
            logger.error("rebalance error", metadata: ["kafka.error": "\(KafkaError.errorName(event))"])
            // Defensive: librdkafka 2.0.2 raises rebalances only with assign or revoke (every
            // rd_kafka_rebalance_op call in rdkafka_cgrp.c). Under the cooperative protocol it
            // refuses a plain assign, so both sides keep the assignment as it is.
            if !cooperative {
                // Everything is unassigned: as when an assignment is lost, in-flight work is
                // abandoned (the group redoes it) and the partitions stop being reported.
                let dropped: [TopicPartition] = locked { Array(assigned) }
                abandon(dropped)
                forget(dropped)
                if !dropped.isEmpty {
                    logger.warning(
                        "partitions unassigned after a rebalance error; abandoning in-flight work",
                        metadata: ["kafka.partitions": "\(dropped.map(\.description).sorted())"]
                    )
                }
                _ = rd_kafka_assign(rk, nil)
            }
        }
    }

    /// librdkafka 2.0.2 pauses every assigned partition before it hands a cooperative rebalance
    /// to the application, and resumes them only when the incremental assign or unassign
    /// succeeds; after a failure the group waits for a call that will not come. The member
    /// would sit on its partitions fetching nothing, ready by every measure, until the next
    /// rebalance: stop instead (as on a fatal error), so the group hands them to others.
    private func stopAfterFailedRebalanceCall(_ rk: OpaquePointer, _ error: KafkaError) {
        guard let context = ClientContext.from(rk) else {
            logger.error("\(error)")
            return
        }
        context.recordFatal(error, cause: "a rebalance left this consumer unable to fetch")
    }

    /// Gives up `partitions` without storing anything for them: their unfinished records are
    /// the group's to redo (an assignment lost, or everything unassigned after an error).
    private func abandon(_ partitions: [TopicPartition]) {
        locked {
            applyCompletionsLocked()
            countRebalanceLocked()
            for partition in partitions {
                tracker.lose(partition)
                assigned.remove(partition)
            }
        }
        if !partitions.isEmpty { onLoss?(partitions) }
    }

    /// Counts a rebalance in the critical section that changes the partitions' epochs (or starts
    /// a revocation), before it does: a batch is checked against the epochs and the revoking
    /// partitions under the same lock, so a reader that read the count before taking a batch,
    /// and reads it unchanged afterwards, holds no record a rebalance made stale or revoking.
    private func countRebalanceLocked() {
        rebalances.add(1, ordering: .releasing)
    }

    /// What the polling thread keeps per partition, dropped once the partition is no longer
    /// this member's.
    private func forget(_ partitions: [TopicPartition]) {
        for partition in partitions {
            epochs.removeValue(forKey: partition)
            rdPaused.remove(partition)
            // No longer this member's to report: a gauge left behind kept exporting its last
            // value, so a sum over the group counted a partition's lag twice after a rebalance.
            storedOffsetGauges.removeValue(forKey: partition)?.destroy()
            lagGauges.removeValue(forKey: partition)?.destroy()
        }
        locked {
            appliedPauses.subtract(partitions)
            for partition in partitions {
                queriedHighs.removeValue(forKey: partition)
                startingOffsets.removeValue(forKey: partition)
            }
        }
    }

    /// Stops dispatching `partitions`, asks the revocation hook to finish their work, and waits
    /// (up to the drain timeout) for the hook and for their in-flight records.
    private func drain(_ partitions: [TopicPartition]) {
        let id = nextRevocationID
        nextRevocationID += 1
        var hookPending = false
        locked {
            revoking.formUnion(partitions)
            // A caller holding records of these partitions sees the count move, and asks
            // `claim` before starting each: what has not started is left to the next owner.
            countRebalanceLocked()
        }
        if hasRevocationHandler {
            locked { pendingRevocations.insert(id) }
            if case .enqueued = revocationContinuation.yield(RevocationRequest(id: id, partitions: partitions)) {
                hookPending = true
            } else {
                locked { _ = pendingRevocations.remove(id) }
            }
        }
        // On the monotonic clock: a wall-clock step (NTP) must not cut a drain short or stretch it.
        let deadline = ContinuousClock.now + configuration.drainTimeout
        draining.add(1, ordering: .sequentiallyConsistent)
        defer { draining.subtract(1, ordering: .sequentiallyConsistent) }
        lock.lock()
        var timedOut = false
        applyCompletionsLocked()
        while (hookPending && pendingRevocations.contains(id)) || partitions.contains(where: { tracker.inProgress($0) > 0 }) {
            let stopBy = closeRequestedAt.map { min(deadline, $0 + configuration.drainTimeout) } ?? deadline
            let now = ContinuousClock.now
            if now >= stopBy {
                timedOut = true
                break
            }
            // Wake up now and then regardless: a completion may have been recorded without
            // seeing `draining` yet. (The condition takes a wall-clock date; only this short
            // nap is expressed in it.)
            let nap = min(stopBy - now, .milliseconds(5))
            _ = lock.wait(until: Date(timeIntervalSinceNow: Double(nap.components.seconds) + Double(nap.components.attoseconds) / 1e18))
            applyCompletionsLocked()
        }
        // Everything still pending is redelivered: what was in progress, what finished behind it,
        // what was left unstarted.
        let remaining = partitions.reduce(0) { $0 + tracker.inFlight($1) }
        pendingRevocations.remove(id)
        lock.unlock()
        if timedOut {
            recordsLeftUnfinished.add(remaining, ordering: .relaxed)
            logger.warning(
                "revocation drain timed out; unfinished records will be redelivered",
                metadata: ["kafka.in_flight": "\(remaining)", "kafka.partitions": "\(partitions.map(\.description).sorted())"]
            )
        }
    }
}
