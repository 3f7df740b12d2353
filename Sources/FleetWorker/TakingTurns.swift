import DequeModule
import Synchronization

/// Lets async sections run one at a time, in the order they asked. Waiting is not cancellable:
/// a section already waiting runs once the one before it ends (the sections here end promptly
/// under cancellation, since publishing gives up when cancelled).
final class TakingTurns: Sendable {
    private struct State {
        var busy = false
        var waiting: Deque<CheckedContinuation<Void, Never>> = []
    }

    private let state = Mutex(State())

    func run<T>(_ section: () async -> T) async -> T {
        await begin()
        defer { end() }
        return await section()
    }

    private func begin() async {
        // Free (the usual case): no continuation is made.
        let took = state.withLock { state in
            if state.busy { return false }
            state.busy = true
            return true
        }
        if took { return }
        await withCheckedContinuation { continuation in
            let free = state.withLock { state in
                if state.busy {
                    state.waiting.append(continuation)
                    return false
                }
                state.busy = true
                return true
            }
            if free { continuation.resume() }
        }
    }

    private func end() {
        // The turn passes straight to the next in line, so `busy` stays set.
        let next = state.withLock { state in
            guard let next = state.waiting.popFirst() else {
                state.busy = false
                return nil as CheckedContinuation<Void, Never>?
            }
            return next
        }
        next?.resume()
    }
}
