import DequeModule
import Synchronization

/// Bounds the notifications a worker has in flight. `acquire` suspends while the bound is
/// reached, which stops the consume loop from pulling more records: the consumer's bounded
/// buffer then fills and it pauses its partitions (back-pressure all the way to Kafka).
final class InFlightLimiter: Sendable {
    private struct State {
        var available: Int
        var waiters: Deque<(count: Int, continuation: CheckedContinuation<Void, Never>)> = []
    }

    let capacity: Int
    private let state: Mutex<State>

    init(capacity: Int) {
        self.capacity = max(1, capacity)
        self.state = Mutex(State(available: max(1, capacity)))
    }

    /// Takes `count` slots (at most the capacity, so a job larger than the bound still runs alone).
    func acquire(_ count: Int) async {
        let wanted = min(max(count, 1), capacity)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.waiters.isEmpty, state.available >= wanted {
                    state.available -= wanted
                    return true
                }
                state.waiters.append((wanted, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    func release(_ count: Int) {
        let wanted = min(max(count, 1), capacity)
        let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.available += wanted
            var ready: [CheckedContinuation<Void, Never>] = []
            while let first = state.waiters.first, first.count <= state.available {
                state.available -= first.count
                ready.append(first.continuation)
                state.waiters.removeFirst()
            }
            return ready
        }
        for continuation in ready { continuation.resume() }
    }

    var inUse: Int { state.withLock { capacity - $0.available } }
}
