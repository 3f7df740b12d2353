/// One partition of one topic.
public struct TopicPartition: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public var description: String { "\(topic)[\(partition)]" }
}

/// Decides which offset may be stored for each partition, so that a crash never skips a record
/// whose work is unfinished (at-least-once).
///
/// Records are *dispatched* in offset order within a partition, and may *finish* in any order.
/// The storable offset of a partition is one past the last record of the longest finished prefix
/// of its dispatched records: a record that finishes early waits for the ones dispatched before it.
/// Offsets need not be contiguous numbers (compaction and transaction markers leave gaps), only
/// increasing; "contiguous" means contiguous in dispatch order.
///
/// Each assignment of a partition gets a new *epoch*. Completions carry the epoch they were
/// dispatched under, so work that finishes after its partition was revoked (or lost) and perhaps
/// assigned again cannot move the new assignment's watermark.
///
/// A pure state machine: no I/O, no locking. The caller serialises access.
public struct OffsetTracker: Sendable {
    /// The outcome of ``finished(_:offset:epoch:)``.
    public enum Completion: Sendable, Hashable {
        /// The storable offset moved up to this value (one past the last finished record).
        case advanced(to: Int64)
        /// Recorded; it waits for an earlier record that is still in flight.
        case waiting
        /// Not in flight under this epoch: revoked, lost, finished twice, or never dispatched.
        case ignored
    }

    struct PartitionState: Sendable {
        var epoch: UInt64
        /// Dispatched offsets not yet released, in dispatch order; `pending[head...]` are live.
        var pending: [Int64] = []
        var head = 0
        /// Offsets in `pending[head...]` that finished before the head did.
        var finishedEarly: Set<Int64> = []
        /// Offsets in `pending[head...]` the worker will not start (their partition is being
        /// revoked): a drain does not wait for them, and they hold the storable offset below them.
        var leftUnstarted: Set<Int64> = []
        /// One past the last released offset; `nil` until something was released this epoch.
        var storable: Int64?
        /// The storable offset last handed out by ``takeStorable()``.
        var lastTaken: Int64?
        var lastDispatched: Int64?

        /// Dispatched and not released.
        var inFlight: Int { pending.count - head }
        /// In flight, less those finished early and those left unstarted.
        var inProgress: Int { inFlight - finishedEarly.count - leftUnstarted.count }
    }

    private var partitions: [TopicPartition: PartitionState] = [:]
    private var nextEpoch: UInt64 = 1

    public init() {}

    /// Starts tracking `partition` under a fresh epoch and returns that epoch. Assigning a partition
    /// that is already assigned replaces its state (its old in-flight work is abandoned).
    @discardableResult
    public mutating func assign(_ partition: TopicPartition) -> UInt64 {
        let epoch = nextEpoch
        nextEpoch &+= 1
        partitions[partition] = PartitionState(epoch: epoch)
        return epoch
    }

    /// Whether `partition` is assigned, and its current epoch.
    public func epoch(of partition: TopicPartition) -> UInt64? {
        partitions[partition]?.epoch
    }

    /// All partitions currently tracked.
    public var assigned: [TopicPartition] { Array(partitions.keys) }

    /// Records that the record at `offset` was handed to the worker under the partition's current
    /// epoch. Returns `false` (and records nothing) when the partition is not assigned, or when
    /// `offset` is not above the last dispatched offset (a redelivery the caller should drop).
    @discardableResult
    public mutating func dispatched(_ partition: TopicPartition, offset: Int64) -> Bool {
        // Mutate through `values[index]` so the state is changed in place, never copied.
        guard let index = partitions.index(forKey: partition) else { return false }
        return Self.dispatch(offset, into: &partitions.values[index])
    }

    /// Like ``dispatched(_:offset:)``, but only when the partition is still assigned under `epoch`
    /// (the epoch the record was fetched under); one lookup instead of two.
    @discardableResult
    public mutating func dispatched(_ partition: TopicPartition, offset: Int64, epoch: UInt64) -> Bool {
        guard let index = partitions.index(forKey: partition), partitions.values[index].epoch == epoch else {
            return false
        }
        return Self.dispatch(offset, into: &partitions.values[index])
    }

    /// Records that the record at `offset`, dispatched under `epoch`, is finished.
    public mutating func finished(_ partition: TopicPartition, offset: Int64, epoch: UInt64) -> Completion {
        guard let index = partitions.index(forKey: partition) else { return .ignored }
        return Self.finish(offset, epoch: epoch, in: &partitions.values[index])
    }

    private static func dispatch(_ offset: Int64, into state: inout PartitionState) -> Bool {
        if let last = state.lastDispatched, offset <= last { return false }
        state.lastDispatched = offset
        state.pending.append(offset)
        return true
    }

    /// Records that the record at `offset`, dispatched under `epoch` and not finished, will not be
    /// started: ``inProgress(_:)`` stops counting it, and the storable offset stays below it, so
    /// the partition's next owner does it. False when there is no such record.
    @discardableResult
    public mutating func leftUnstarted(_ partition: TopicPartition, offset: Int64, epoch: UInt64) -> Bool {
        guard let index = partitions.index(forKey: partition) else { return false }
        return Self.leaveUnstarted(offset, epoch: epoch, in: &partitions.values[index])
    }

    private static func leaveUnstarted(_ offset: Int64, epoch: UInt64, in state: inout PartitionState) -> Bool {
        guard state.epoch == epoch, !state.finishedEarly.contains(offset), isPending(offset, in: state.pending, from: state.head) else {
            return false
        }
        state.leftUnstarted.insert(offset)
        return true
    }

    private static func finish(_ offset: Int64, epoch: UInt64, in state: inout PartitionState) -> Completion {
        guard state.epoch == epoch, state.head < state.pending.count else { return .ignored }
        // Done after all: it counts as any finished record.
        if !state.leftUnstarted.isEmpty { state.leftUnstarted.remove(offset) }
        if state.pending[state.head] == offset {
            state.head += 1
            var released = offset
            while state.head < state.pending.count, state.finishedEarly.remove(state.pending[state.head]) != nil {
                released = state.pending[state.head]
                state.head += 1
            }
            state.storable = released + 1
            // Compact once the released prefix dominates, so memory stays proportional to the
            // records in flight, at amortised O(1) per record.
            if state.head == state.pending.count {
                state.pending.removeAll(keepingCapacity: true)
                state.head = 0
            } else if state.head >= 1024, state.head * 2 >= state.pending.count {
                state.pending.removeFirst(state.head)
                state.head = 0
            }
            return .advanced(to: released + 1)
        }
        guard offset > state.pending[state.head], let last = state.lastDispatched, offset <= last,
              !state.finishedEarly.contains(offset),
              isPending(offset, in: state.pending, from: state.head)
        else {
            return .ignored
        }
        state.finishedEarly.insert(offset)
        return .waiting
    }

    /// The offset that may be stored for `partition` now: one past its finished prefix, or `nil`
    /// when nothing has finished since it was assigned.
    public func storableOffset(_ partition: TopicPartition) -> Int64? {
        partitions[partition]?.storable
    }

    /// Storable offsets that moved since the previous call, for a periodic batched offset store.
    public mutating func takeStorable() -> [(TopicPartition, Int64)] {
        var out: [(TopicPartition, Int64)] = []
        var index = partitions.startIndex
        while index != partitions.endIndex {
            let state = partitions.values[index]
            if let storable = state.storable, storable != state.lastTaken {
                out.append((partitions.keys[index], storable))
                partitions.values[index].lastTaken = storable
            }
            partitions.formIndex(after: &index)
        }
        return out
    }

    /// The number of records of `partition` dispatched and not yet released (including those
    /// finished out of order that still wait). Zero for a partition that is not assigned.
    public func inFlight(_ partition: TopicPartition) -> Int {
        partitions[partition]?.inFlight ?? 0
    }

    /// The records of `partition` being worked on: in flight, less those finished early (they
    /// wait only for earlier records) and those left unstarted. A revocation's drain waits for
    /// these.
    public func inProgress(_ partition: TopicPartition) -> Int {
        partitions[partition]?.inProgress ?? 0
    }

    /// The number of records in flight over all partitions.
    public var totalInFlight: Int {
        partitions.values.reduce(0) { $0 + $1.inFlight }
    }

    /// ``inProgress(_:)`` over all partitions.
    public var totalInProgress: Int {
        partitions.values.reduce(0) { $0 + $1.inProgress }
    }

    /// The oldest offset dispatched and not finished, if any: where a restart would begin when
    /// nothing finished yet this epoch.
    public func oldestUnfinished(_ partition: TopicPartition) -> Int64? {
        // The head is never finished: it moves on as soon as it is.
        guard let state = partitions[partition], state.head < state.pending.count else { return nil }
        return state.pending[state.head]
    }

    /// The next offset the worker would see for `partition`: one past the last dispatched record.
    public func nextDispatchOffset(_ partition: TopicPartition) -> Int64? {
        partitions[partition]?.lastDispatched.map { $0 + 1 }
    }

    /// Stops tracking a partition that is revoked in an orderly way, and returns the offset to
    /// store for it (one past its finished prefix), or `nil` if nothing finished. Work still in
    /// flight is forgotten: a later completion for it is ignored, and it will be redelivered.
    public mutating func revoke(_ partition: TopicPartition) -> Int64? {
        partitions.removeValue(forKey: partition)?.storable
    }

    /// Stops tracking a partition whose assignment was lost: nothing may be stored for it, since
    /// another consumer may already own it.
    public mutating func lose(_ partition: TopicPartition) {
        partitions.removeValue(forKey: partition)
    }

    private static func isPending(_ offset: Int64, in pending: [Int64], from head: Int) -> Bool {
        // `pending` is sorted: binary search the live part.
        var low = head
        var high = pending.count
        while low < high {
            let mid = (low + high) / 2
            if pending[mid] < offset { low = mid + 1 } else { high = mid }
        }
        return low < pending.count && pending[low] == offset
    }
}
