import KafkaTransport
import Logging

/// Publishes a group of messages and waits until Kafka has acknowledged every one, retrying the
/// failed ones with backoff. The workers mark a record finished only after this returns true,
/// which is what makes them at-least-once.
struct ReliablePublisher: Sendable {
    let producer: KafkaProducer
    let logger: Logger

    /// Returns false only when the task is cancelled first: the caller's record then stays
    /// unfinished and is redone after its partition moves (duplicates allowed, losses not).
    func publish(_ messages: [KafkaOutgoingMessage]) async -> Bool {
        var pending = messages
        var delayMilliseconds = 100
        while !pending.isEmpty {
            let failed = await withTaskGroup(of: KafkaOutgoingMessage?.self, returning: [KafkaOutgoingMessage].self) { group in
                for message in pending {
                    group.addTask {
                        do {
                            try await producer.send(message)
                            return nil
                        } catch {
                            logger.warning("publishing failed; will retry", metadata: ["kafka.topic": "\(message.topic)", "error": "\(error)"])
                            return message
                        }
                    }
                }
                var failed: [KafkaOutgoingMessage] = []
                for await message in group { if let message { failed.append(message) } }
                return failed
            }
            pending = failed
            guard !pending.isEmpty else { break }
            if Task.isCancelled { return false }
            try? await Task.sleep(for: .milliseconds(delayMilliseconds))
            delayMilliseconds = min(delayMilliseconds * 2, 5000)
        }
        return true
    }
}
