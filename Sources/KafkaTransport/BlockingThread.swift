import Foundation

/// Dedicated OS threads for librdkafka's blocking calls (poll, flush, close), which must never
/// occupy a thread of Swift's cooperative pool.
enum BlockingThread {
    /// Starts `body` on a new thread and returns at once.
    static func start(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread(block: body)
        thread.name = name
        thread.start()
    }

    /// Runs `body` on a new thread and suspends (without blocking) until it returns.
    static func run<T: Sendable>(name: String, _ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
            start(name: name) { continuation.resume(returning: body()) }
        }
    }
}
