import DequeModule
import Metrics
import Synchronization

/// Bounds the notifications a worker has in flight. `acquire` suspends while the bound is
/// reached, which stops the consume loop from pulling more records; once queued, it waits for
/// `wakeBatch` free slots (or what it asked for, if more), so that the loop is not woken for every
/// slot freed.
///
/// Before that, crossing the high watermark calls `onPressure(.pause)` (the worker pauses its
/// partitions, so the consumer stops fetching rather than filling its buffer), and falling to
/// the low watermark calls `onPressure(.resume)`. The callback runs under the limiter's lock, so
/// transitions reach it in order; it must not call back into the limiter.
final class InFlightLimiter: Sendable {
    typealias PressureHandler = @Sendable (_ action: WatermarkGate.Action, _ inUse: Int) -> Void

    private struct State {
        var available: Int
        var gate: WatermarkGate
        /// Queued acquires; `interruptible` ones end early on `interrupt()`, with false.
        var waiters: Deque<(count: Int, interruptible: Bool, continuation: CheckedContinuation<Bool, Never>)> = []
        var idleWaiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextIdleWaiter: UInt64 = 0
    }

    let capacity: Int
    /// Free slots needed before a queued `acquire` is resumed (or what it asked for, if more).
    /// At the bound, waking the consume loop for every freed slot cost a suspension, a resume
    /// and a thread wake-up per notification; in batches it takes many records per wake-up,
    /// while the bound stays at least 15/16 used.
    let wakeBatch: Int
    private let state: Mutex<State>
    private let onPressure: PressureHandler?
    private let gauge = Gauge(label: "apns.worker.in_flight")

    init(capacity: Int, onPressure: PressureHandler? = nil) {
        self.capacity = max(1, capacity)
        self.wakeBatch = max(1, min(256, max(1, capacity) / 16))
        self.state = Mutex(State(available: max(1, capacity), gate: WatermarkGate(capacity: max(1, capacity))))
        self.onPressure = onPressure
    }

    /// Takes `count` slots (at most the capacity, so a job larger than the bound still runs
    /// alone), waiting for them if need be.
    func acquire(_ count: Int) async {
        _ = await acquire(count, interruptible: false, unless: { false })
    }

    /// Like `acquire(_:)`, but gives up, taking nothing, when `interrupted` is true as it is
    /// about to wait (checked under the limiter's lock) or when `interrupt()` is called while
    /// it waits. Returns whether the slots were taken.
    func acquire(_ count: Int, unless interrupted: () -> Bool) async -> Bool {
        await acquire(count, interruptible: true, unless: interrupted)
    }

    private func acquire(_ count: Int, interruptible: Bool, unless interrupted: () -> Bool) async -> Bool {
        let wanted = min(max(count, 1), capacity)
        // Below the bound (the steady state) no continuation is made: suspending and resuming
        // the consume loop once per record cost more than the rest of taking a slot.
        if state.withLock({ take(wanted, &$0) }) { return true }
        return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let ready = state.withLock { state -> Bool? in
                if take(wanted, &state) { return true }
                if interruptible, interrupted() { return false }
                state.waiters.append((wanted, interruptible, continuation))
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// Ends every interruptible wait, taking nothing: its caller has something to look at
    /// first (the consume loop, a revocation).
    func interrupt() {
        let (ended, served) = state.withLock { state -> ([CheckedContinuation<Bool, Never>], [CheckedContinuation<Bool, Never>]) in
            guard state.waiters.contains(where: \.interruptible) else { return ([], []) }
            let ended = state.waiters.filter(\.interruptible).map(\.continuation)
            state.waiters.removeAll(where: \.interruptible)
            // Those queued behind may now be served.
            let served = serveWaiters(&state)
            changed(&state)
            return (ended, served)
        }
        for continuation in ended { continuation.resume(returning: false) }
        for continuation in served { continuation.resume(returning: true) }
    }

    /// Under the lock: hands free slots to the waiters at the head of the queue, in order.
    private func serveWaiters(_ state: inout State) -> [CheckedContinuation<Bool, Never>] {
        var ready: [CheckedContinuation<Bool, Never>] = []
        while let first = state.waiters.first, max(first.count, wakeBatch) <= state.available {
            state.available -= first.count
            ready.append(first.continuation)
            state.waiters.removeFirst()
        }
        return ready
    }

    /// Under the lock: takes `count` slots if they are free and nobody is queued before.
    private func take(_ count: Int, _ state: inout State) -> Bool {
        guard state.waiters.isEmpty, state.available >= count else { return false }
        state.available -= count
        changed(&state)
        return true
    }

    func release(_ count: Int) {
        let wanted = min(max(count, 1), capacity)
        let (served, idle) = state.withLock { state -> ([CheckedContinuation<Bool, Never>], [CheckedContinuation<Void, Never>]) in
            state.available += wanted
            let served = serveWaiters(&state)
            var idle: [CheckedContinuation<Void, Never>] = []
            if state.available == capacity, !state.idleWaiters.isEmpty {
                idle = Array(state.idleWaiters.values)
                state.idleWaiters.removeAll()
            }
            changed(&state)
            return (served, idle)
        }
        for continuation in served { continuation.resume(returning: true) }
        for continuation in idle { continuation.resume() }
    }

    /// Returns once nothing is in flight, or when the calling task is cancelled: work that
    /// finishes by callback rather than in a task is waited for this way.
    func waitUntilIdle() async {
        let id = state.withLock { state -> UInt64 in
            state.nextIdleWaiter += 1
            return state.nextIdleWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let idle = state.withLock { state -> Bool in
                    if state.available == capacity || Task.isCancelled { return true }
                    state.idleWaiters[id] = continuation
                    return false
                }
                if idle { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.idleWaiters.removeValue(forKey: id) }?.resume()
        }
    }

    var inUse: Int { state.withLock { capacity - $0.available } }

    /// Acquires waiting for slots.
    var queuedAcquires: Int { state.withLock { $0.waiters.count } }

    /// Under the lock: publish the count and run the watermark check.
    private func changed(_ state: inout State) {
        let inUse = capacity - state.available
        gauge.record(inUse)
        if let action = state.gate.update(inUse: inUse) { onPressure?(action, inUse) }
    }
}
