import APNsCore
import KafkaTransport
import Logging
import Synchronization

/// Publishes a group of messages and waits until Kafka has acknowledged every one, retrying the
/// failed ones with backoff. The workers mark a record finished only after this returns true,
/// which is what makes them at-least-once.
struct ReliablePublisher: Sendable {
    let producer: KafkaProducer
    let logger: Logger
    /// A Kafka outage fails every message: one warning each would flood the log.
    let retryLogs = LogThrottle()
    private let batchTooLargeLogs = LogThrottle()
    /// Publishes still retrying, for readiness: a topic that keeps refusing (missing, or denied
    /// by an ACL) holds its records' slots and partitions' offsets until it is fixed.
    let stalls = PublishStalls()

    init(producer: KafkaProducer, logger: Logger) {
        self.producer = producer
        self.logger = logger
    }

    /// Returns false only when the task is cancelled first: the caller's record then stays
    /// unfinished and is redone after its partition moves (duplicates allowed, losses not).
    ///
    /// `replaceTooLarge` gives what publishes instead a message Kafka refused as too large and
    /// that stands for the same thing (a retry record as records for fewer tokens each, or as
    /// their `failed` results); nil when the message has no such stand-in.
    ///
    /// `since`: when these messages were first handed to the producer, if that was before this
    /// call (a direct delivery's first send, whose report failed).
    func publish(
        _ messages: [KafkaOutgoingMessage],
        since: ContinuousClock.Instant? = nil,
        replacingTooLarge replaceTooLarge: (KafkaOutgoingMessage) -> [KafkaOutgoingMessage]? = { _ in nil }
    ) async -> Bool {
        var pending = messages
        var delayMilliseconds = 100
        // A stall counts from the publish's start: with brokers unreachable, the first delivery
        // report fails only after message.timeout.ms.
        let started = since ?? ContinuousClock.now
        var stall: UInt64?
        defer { if let stall { stalls.end(stall) } }
        while !pending.isEmpty {
            let failed = await sendAll(pending)
            if let (message, error) = failed.first {
                stall = stalls.record(stall, since: started, topic: message.topic, error: error)
            }
            // Whether every message to publish again is a new one standing for a refused one:
            // those go out at once, not after a backoff.
            var onlyReplacements = true
            // Kafka checks a topic's max.message.bytes against a whole batch and refuses every
            // message in it: one refused as too large beside others may fit by itself. Each is
            // sent again alone (waiting for its report before the next) before anything stands
            // in for it; split or failed at once, retry records that fit would end `failed`. A
            // publish of one message too: librdkafka batches it with other publishes' messages.
            // (A message too large by itself costs one more send per round.)
            var refusedAlone: [KafkaOutgoingMessage] = []
            pending = []
            for (message, error) in failed {
                guard error.rdKafkaCode == KafkaError.messageSizeTooLargeCode else {
                    onlyReplacements = false
                    pending.append(message)
                    continue
                }
                if Task.isCancelled { return false }
                guard let (_, again) = await sendAll([message]).first else { continue }
                if again.rdKafkaCode == KafkaError.messageSizeTooLargeCode {
                    refusedAlone.append(message)
                } else {
                    onlyReplacements = false
                    pending.append(message)
                }
            }
            for message in refusedAlone {
                let standIn = self.standIn(forTooLarge: message, replaceTooLarge)
                if !standIn.replaced { onlyReplacements = false }
                pending += standIn.messages
            }
            guard !pending.isEmpty else { break }
            if Task.isCancelled { return false }
            if onlyReplacements { continue }
            try? await Task.sleep(for: .milliseconds(delayMilliseconds))
            delayMilliseconds = min(delayMilliseconds * 2, 5000)
        }
        return true
    }

    /// What to publish instead of a message Kafka refused as too large even by itself: its
    /// stand-in (`replaced`), a copy cut short (`replaced`), or, where nothing may be cut, the
    /// message again after the backoff.
    private func standIn(
        forTooLarge message: KafkaOutgoingMessage, _ replaceTooLarge: (KafkaOutgoingMessage) -> [KafkaOutgoingMessage]?
    ) -> (messages: [KafkaOutgoingMessage], replaced: Bool) {
        // The topic's own max.message.bytes may be below the producer's, which the worker sized
        // its records by.
        if let replacements = replaceTooLarge(message) { return (replacements, true) }
        // Too large is permanent: retried as it is, it would hold its record, and so its
        // partition's offset, forever. Only a DLQ copy of a huge job is that large (in its value
        // or its headers); a small message refused even alone was batched with another
        // publish's messages, in a batch the broker refused whole.
        guard let smaller = shrunk(message) else {
            // One per message and round: throttled, or a refused batch floods the log.
            batchTooLargeLogs.log(.error, "Kafka refused a batch as too large; keep the producer's batch.size below the topic's max.message.bytes", metadata: [
                "kafka.topic": "\(message.topic)",
            ], to: logger)
            return ([message], false)
        }
        return ([smaller], true)
    }

    /// How much of a message's value is kept when Kafka refuses it as too large.
    static let shrunkValueBytes = 64 * 1024
    /// How much of a DLQ copy's headers: the first ones (the job's own; the worker's come last
    /// and are kept) go until the rest fit.
    static let shrunkHeaderBytes = 16 * 1024

    /// `message` made smaller by one step, with headers saying what was cut; nil when nothing
    /// may be cut. Any message's value is cut to its first `shrunkValueBytes`. A DLQ copy is
    /// only kept for people to read, so when its topic's max.message.bytes is lower still, each
    /// further round cuts more of it rather than hold its record's partition forever: first the
    /// job's own headers until they fit in `shrunkHeaderBytes`, then half of what is left of the
    /// value, at last every job header. The worker's `dlq-*`/`source-*` headers always stay.
    private func shrunk(_ message: KafkaOutgoingMessage) -> KafkaOutgoingMessage? {
        var copy = message
        let isDeadLetter = message.headers.contains { $0.key == DeadLetterHeaders.reasonKey }
        let jobHeaderBytes = message.jobHeaderBytes
        if message.value.count > Self.shrunkValueBytes {
            copy.cutValue(to: Self.shrunkValueBytes)
        } else if !isDeadLetter {
            return nil
        } else if jobHeaderBytes > Self.shrunkHeaderBytes {
            copy.dropJobHeaders(whileOver: Self.shrunkHeaderBytes)
        } else if !message.value.isEmpty {
            copy.cutValue(to: message.value.count / 2)
        } else if jobHeaderBytes > 0 {
            copy.dropJobHeaders(whileOver: 0)
        } else {
            return nil
        }
        logger.warning("message too large for Kafka; publishing it cut short", metadata: [
            "kafka.topic": "\(message.topic)", "kafka.bytes": "\(message.value.count)", "kafka.kept_bytes": "\(copy.value.count)",
            "kafka.headers": "\(message.headers.count)", "kafka.kept_headers": "\(copy.headers.count)",
        ])
        return copy
    }

    /// Whether a DLQ copy's header is the job's own (not the worker's reason, source or marks).
    fileprivate static func isJobHeader(_ header: RecordHeader) -> Bool {
        !workerHeaderKeys.contains(header.key)
    }

    private static let workerHeaderKeys: Set<String> = [
        DeadLetterHeaders.reasonKey, DeadLetterHeaders.sourceTopicKey, DeadLetterHeaders.sourcePartitionKey,
        DeadLetterHeaders.sourceOffsetKey, truncatedHeader, headersDroppedHeader,
    ]

    /// Besides a header's name and value: their two length fields (varints, at most 5 bytes each).
    static let headerOverheadBytes = 10

    /// Header of a message whose value was cut short: the original length in bytes.
    static let truncatedHeader = "apns-fleet-truncated-from"
    /// Header of a message whose first headers were dropped: how many.
    static let headersDroppedHeader = "apns-fleet-headers-dropped"

    /// Enqueues every message and waits once for all their delivery reports: one suspension per
    /// group rather than a child task per message. Returns the ones that failed, with why.
    private func sendAll(_ messages: [KafkaOutgoingMessage]) async -> [(KafkaOutgoingMessage, KafkaError)] {
        let outcome = GroupDelivery(messages: messages)
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            outcome.start(continuation)
            for index in messages.indices {
                do throws(KafkaError) {
                    try producer.send(messages[index]) { result in outcome.report(index, result) }
                } catch {
                    // Refused locally (a full queue, say): it is retried with the others after the backoff.
                    outcome.report(index, .failure(error))
                }
            }
        }
        let failed = outcome.failures
        for (index, error) in failed {
            retryLogs.log(.warning, "publishing failed; will retry", metadata: ["kafka.topic": "\(messages[index].topic)", "error": "\(error)"], to: logger)
        }
        return failed.map { (messages[$0.index], $0.error) }
    }
}

/// The publishes that keep failing, oldest first: while one has failed for long, the worker is
/// not ready, so an orchestrator sees a stall that otherwise only throttled warnings show.
public final class PublishStalls: Sendable {
    private struct Stall {
        var since: ContinuousClock.Instant
        var topic: String
        var error: KafkaError
    }

    private struct State {
        var nextID: UInt64 = 0
        var open: [UInt64: Stall] = [:]
    }

    private let state = Mutex(State())

    /// Records a failed round of publish `id` (a new entry when nil), keeping its latest error.
    fileprivate func record(_ id: UInt64?, since: ContinuousClock.Instant, topic: String, error: KafkaError) -> UInt64 {
        state.withLock { state in
            let key = id ?? {
                state.nextID &+= 1
                return state.nextID
            }()
            state.open[key] = Stall(since: since, topic: topic, error: error)
            return key
        }
    }

    fileprivate func end(_ id: UInt64) {
        _ = state.withLock { $0.open.removeValue(forKey: id) }
    }

    /// What is wrong when some publish has kept failing for `limit` or longer; nil otherwise.
    public func problem(longerThan limit: Duration = readinessLimit, now: ContinuousClock.Instant = .now) -> String? {
        let oldest = state.withLock { $0.open.values.min { $0.since < $1.since } }
        guard let oldest, now - oldest.since >= limit else { return nil }
        let seconds = (now - oldest.since).components.seconds
        return "publishing to \(oldest.topic) has failed for \(seconds) s (\(oldest.error))"
    }

    /// How long a publish may keep failing before the worker reports itself not ready.
    public static let readinessLimit: Duration = .seconds(60)
}

/// Counts a group's delivery reports down (they arrive on librdkafka's thread) and resumes the
/// waiting publisher when the last one is in.
private final class GroupDelivery: Sendable {
    private struct State {
        var remaining: Int
        var failures: [(index: Int, error: KafkaError)] = []
        var continuation: UnsafeContinuation<Void, Never>?
    }

    private let state: Mutex<State>

    init(messages: [KafkaOutgoingMessage]) {
        state = Mutex(State(remaining: messages.count))
    }

    func start(_ continuation: UnsafeContinuation<Void, Never>) {
        let done = state.withLock { state -> Bool in
            guard state.remaining > 0 else { return true }
            state.continuation = continuation
            return false
        }
        if done { continuation.resume() }
    }

    func report(_ index: Int, _ result: Result<KafkaDeliveryReport, KafkaError>) {
        let continuation = state.withLock { state -> UnsafeContinuation<Void, Never>? in
            if case .failure(let error) = result { state.failures.append((index, error)) }
            state.remaining -= 1
            guard state.remaining == 0 else { return nil }
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume()
    }

    var failures: [(index: Int, error: KafkaError)] { state.withLock { $0.failures } }
}

extension KafkaOutgoingMessage {
    /// A DLQ copy's own job headers, with their length fields, in bytes.
    fileprivate var jobHeaderBytes: Int {
        headers.reduce(0) { ReliablePublisher.isJobHeader($1) ? $0 + $1.byteCount + ReliablePublisher.headerOverheadBytes : $0 }
    }

    /// Keeps the value's first `count` bytes; the truncation header keeps the original size.
    fileprivate mutating func cutValue(to count: Int) {
        let original = headers.first { $0.key == ReliablePublisher.truncatedHeader }?.value.map { String(decoding: $0, as: UTF8.self) }
            ?? String(value.count)
        headers.removeAll { $0.key == ReliablePublisher.truncatedHeader }
        headers.append(RecordHeader(ReliablePublisher.truncatedHeader, original))
        value = Array(value.prefix(count))
    }

    /// Drops job headers, first to last, until theirs and the count's header fit in `budget`
    /// bytes; the count adds up over rounds.
    fileprivate mutating func dropJobHeaders(whileOver budget: Int) {
        var dropped = headers.first { $0.key == ReliablePublisher.headersDroppedHeader }?.value
            .flatMap { Int(String(decoding: $0, as: UTF8.self)) } ?? 0
        headers.removeAll { $0.key == ReliablePublisher.headersDroppedHeader }
        // Room for the count's own header, whatever its digits.
        let markBytes = ReliablePublisher.headersDroppedHeader.utf8.count + 20 + ReliablePublisher.headerOverheadBytes
        var bytes = jobHeaderBytes
        while bytes > 0, bytes + markBytes > budget, let index = headers.firstIndex(where: ReliablePublisher.isJobHeader) {
            bytes -= headers[index].byteCount + ReliablePublisher.headerOverheadBytes
            headers.remove(at: index)
            dropped += 1
        }
        headers.append(RecordHeader(ReliablePublisher.headersDroppedHeader, String(dropped)))
    }
}
