import APNsCore
import KafkaTransport
import Synchronization

/// What one load run expects and what came back: every token of every job against its result,
/// with duplicates, mismatches, token events, dead letters and latencies.
///
/// Results may arrive before their job is registered (a malformed job's id is only known from
/// its delivery report), so early results wait in a side table until their expectation arrives.
public final class RunTally: Sendable {
    /// When a first result was sent (the worker's clock) and how long it took.
    public struct ResultTiming: Sendable {
        public var sentAtMs: Int64
        /// Job → result, from `meta.published_at` to `sent_at`; nil when the job has no `published_at`.
        public var latencyMs: Double?
        /// Job → APNs: from `meta.published_at` to the moment the worker handed the notification
        /// to its APNs client (`sent_at` − `latency_ms`), for results APNs answered. What the
        /// worker adds on the way in, Kafka included.
        public var toAPNsMs: Double?
    }

    public struct Snapshot: Sendable {
        public var jobsRegistered = 0
        /// Registered jobs by the generator's kind, when known.
        public var jobsByKind: [JobMix.Kind: Int] = [:]
        public var jobsComplete = 0
        public var notificationsExpected = 0
        public var notificationsSeen = 0
        /// Results for a token that already had one (at-least-once redelivery).
        public var duplicates = 0
        /// For each duplicate, when the token was first answered (the earlier `sent_at` of the
        /// two, the worker's clock): the work that was redone, to be explained by a fault.
        public var duplicatedWorkDoneAtMs: [Int64] = []
        /// Results whose outcome is not the expected one, with a few examples.
        public var mismatches = 0
        public var mismatchExamples: [String] = []
        /// "outcome/status/reason" → count, over first results only.
        public var outcomes: [String: Int] = [:]
        public var tokenEvents = 0
        public var distinctTokenEvents = 0
        /// The tokens that got a token event.
        public var eventTokens: Set<String> = []
        /// Jobs with a DLQ copy: distinct by the copy's source position when it names one, so
        /// that a copy redelivered after a rebalance is not a second unusable job.
        public var deadLetters = 0
        /// Every DLQ copy read, repeats included.
        public var deadLetterCopies = 0
        /// Records the reader never saw: gaps in a partition's offsets. kafka-dev keeps about
        /// 5 MiB per partition, so a reader that falls further behind finds the oldest gone, and
        /// the run can then never complete.
        public var recordsSkipped = 0
        /// Each counted (first) result's timing, in the order they were read.
        public var timings: [ResultTiming] = []

        /// Job → result latencies in milliseconds (from `meta.published_at` to `sent_at`).
        public var latenciesMs: [Double] { timings.compactMap(\.latencyMs) }

        public var isComplete: Bool { jobsComplete == jobsRegistered && notificationsSeen >= notificationsExpected }
    }

    private struct State {
        var snapshot = Snapshot()
        /// Job id → token → expected outcome, for tokens still waiting for a result.
        var pending: [String: [String: String]] = [:]
        /// Job id → tokens already answered → the `sent_at` of their first result.
        var answered: [String: [String: Int64]] = [:]
        var early: [String: [NotificationResult]] = [:]
        var eventKeys: Set<String> = []
        /// The next offset the reader expects, by partition.
        var nextOffsets: [TopicPartition: Int64] = [:]
        var deadLetterSources: Set<String> = []
    }

    private let state = Mutex(State())
    /// Only results whose job id starts with this count (earlier runs share the topics).
    public let idPrefix: String

    public init(idPrefix: String) {
        self.idPrefix = idPrefix
    }

    /// Registers a job under `jobID` (its own id, or the one derived from its offset).
    public func expect(jobID: String, tokens: [(token: String, outcome: String)], kind: JobMix.Kind? = nil) {
        state.withLock { state in
            state.snapshot.jobsRegistered += 1
            if let kind { state.snapshot.jobsByKind[kind, default: 0] += 1 }
            state.snapshot.notificationsExpected += tokens.count
            var waiting: [String: String] = [:]
            for (token, outcome) in tokens { waiting[token] = outcome }
            state.pending[jobID] = waiting
            for result in state.early.removeValue(forKey: jobID) ?? [] {
                Self.apply(result, to: &state)
            }
            if state.pending[jobID]?.isEmpty == true { Self.complete(jobID, &state) }
        }
    }

    /// Counts one result; results of other runs are ignored.
    public func record(_ result: NotificationResult, derivedIDPrefix: String) {
        guard result.jobID.hasPrefix(idPrefix) || result.jobID.hasPrefix(derivedIDPrefix) else { return }
        state.withLock { state in
            guard state.pending[result.jobID] != nil || state.answered[result.jobID] != nil else {
                state.early[result.jobID, default: []].append(result)
                return
            }
            Self.apply(result, to: &state)
        }
    }

    public func record(tokenEvent: TokenEvent) {
        state.withLock { state in
            state.snapshot.tokenEvents += 1
            if state.eventKeys.insert(tokenEvent.key).inserted { state.snapshot.distinctTokenEvents += 1 }
            state.snapshot.eventTokens.insert(tokenEvent.token)
        }
    }

    /// Notes where the reader is in each partition of `topic` in `batch` (records in offset order
    /// per partition, as the consumer hands them out); a jump forward counts as skipped records.
    /// Only meaningful against kafka-dev: a real broker's compaction and retention leave gaps too.
    public func noteRead(_ batch: [KafkaRecord], topic: String) {
        state.withLock { state in
            for record in batch where record.topic == topic {
                let partition = record.topicPartition
                if let next = state.nextOffsets[partition], record.offset > next {
                    state.snapshot.recordsSkipped += Int(record.offset - next)
                }
                state.nextOffsets[partition] = record.offset + 1
            }
        }
    }

    /// Why a run cannot complete once records were skipped, for the user.
    public static func skippedRecordsMessage(_ count: Int) -> String {
        "the result reader fell behind and \(count) records were gone before it read them (kafka-dev keeps about 5 MiB per partition and drops the oldest): lower --jobs or --rate"
    }

    /// One DLQ copy; `source` is its job's source position (nil when it names none).
    public func recordDeadLetter(source: String? = nil) {
        state.withLock { state in
            state.snapshot.deadLetterCopies += 1
            if let source, !state.deadLetterSources.insert(source).inserted { return }
            state.snapshot.deadLetters += 1
        }
    }

    public var snapshot: Snapshot { state.withLock { $0.snapshot } }

    /// "delivered", or "rejected/410/Unregistered", as the generator writes expectations.
    public static func describe(_ result: NotificationResult) -> String {
        switch result.outcome {
        case .delivered, .invalid: result.outcome.rawValue
        case .rejected, .expired, .failed:
            [result.outcome.rawValue, result.status.map(String.init), result.reason.map { String($0.prefix { $0.isLetter }) }]
                .compactMap { $0 }.joined(separator: "/")
        }
    }

    private static func apply(_ result: NotificationResult, to state: inout State) {
        let jobID = result.jobID
        guard let expected = state.pending[jobID]?.removeValue(forKey: result.token) else {
            if let first = state.answered[jobID]?[result.token] {
                state.snapshot.duplicates += 1
                state.snapshot.duplicatedWorkDoneAtMs.append(min(first, result.sentAt.value))
            } else {
                state.snapshot.mismatches += 1
                note("job \(jobID): a result for a token it does not have (\(result.token.prefix(12)))", &state)
            }
            return
        }
        state.answered[jobID, default: [:]][result.token] = result.sentAt.value
        state.snapshot.notificationsSeen += 1
        let actual = describe(result)
        state.snapshot.outcomes[actual, default: 0] += 1
        if actual != expected {
            state.snapshot.mismatches += 1
            note("job \(jobID): expected \(expected), got \(actual)\(result.outcome == .invalid ? " (\(result.reason ?? ""))" : "")", &state)
        }
        var timing = ResultTiming(sentAtMs: result.sentAt.value)
        if let published = publishedAt(result.meta) {
            timing.latencyMs = Double(result.sentAt.value - published)
            if result.status != nil {
                timing.toAPNsMs = max(0, Double(result.sentAt.value - published) - result.latencyMs)
            }
        }
        state.snapshot.timings.append(timing)
        if state.pending[jobID]?.isEmpty == true { complete(jobID, &state) }
    }

    private static func complete(_ jobID: String, _ state: inout State) {
        state.pending[jobID] = nil
        state.snapshot.jobsComplete += 1
    }

    private static func note(_ text: String, _ state: inout State) {
        if state.snapshot.mismatchExamples.count < 10 { state.snapshot.mismatchExamples.append(text) }
    }

    /// `published_at` from the job's `meta`, which the worker copies into every result.
    static func publishedAt(_ meta: RawJSON?) -> Int64? {
        guard let meta, let parsed = try? JSONParser.parse(Array(meta.bytes)) else { return nil }
        return parsed["published_at"]?.int64
    }
}

/// Percentiles of a sample, nearest-rank.
public enum Percentiles {
    public static func value(_ fraction: Double, of sorted: [Double]) -> Double? {
        guard !sorted.isEmpty else { return nil }
        let rank = Int((fraction * Double(sorted.count)).rounded(.up)) - 1
        return sorted[min(max(rank, 0), sorted.count - 1)]
    }
}
