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
        var waiters: Deque<(count: Int, continuation: CheckedContinuation<Void, Never>)> = []
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
        let wanted = min(max(count, 1), capacity)
        // Below the bound (the steady state) no continuation is made: suspending and resuming
        // the consume loop once per record cost more than the rest of taking a slot.
        if state.withLock({ take(wanted, &$0) }) { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if take(wanted, &state) { return true }
                state.waiters.append((wanted, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
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
        let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.available += wanted
            var ready: [CheckedContinuation<Void, Never>] = []
            while let first = state.waiters.first, max(first.count, wakeBatch) <= state.available {
                state.available -= first.count
                ready.append(first.continuation)
                state.waiters.removeFirst()
            }
            if state.available == capacity, !state.idleWaiters.isEmpty {
                ready += state.idleWaiters.values
                state.idleWaiters.removeAll()
            }
            changed(&state)
            return ready
        }
        for continuation in ready { continuation.resume() }
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
