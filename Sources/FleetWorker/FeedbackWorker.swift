import APNsCore
import Foundation
import KafkaTransport
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// The feedback worker: dead tokens → `apns.token-events`.
///
/// It reads `apns.results` in its own consumer group and turns every 410 Unregistered,
/// BadDeviceToken and DeviceTokenNotForTopic answer into a token event keyed `<topic>/<token>`.
/// It also polls the legacy feedback service of every app that has one, and turns each tuple
/// into an event with `source: feedback-service`.
///
/// At-least-once, like the push worker: a batch of results is marked finished only after its
/// events are acknowledged by Kafka. Duplicate results do not repeat an event: an
/// ``InvalidationLedger`` remembers what was published. A batch of results and a chunk of
/// feedback tuples take turns to admit their events to the ledger and publish them, so that an
/// event taken for a repeat of another has always been acknowledged (or forgotten) first, and
/// events reach the compacted topic in the order the ledger judged them (two events of one key
/// in one turn go out one after the other).
public final class FeedbackWorker: Service, Sendable {
    public struct Configuration: Sendable {
        public var topics: TopicNames
        /// Time between polls of each legacy feedback service.
        public var pollInterval: Duration
        /// How long one poll may take (connect, read to the end). A stop waits for a poll in
        /// progress, so keep it within the drain timeout (the feedback command does).
        public var pollTimeout: Duration
        public var ledgerCapacity: Int
        /// After a failed poll the service is polled again this much later, doubling with each
        /// failure in a row, never later than `pollInterval`: a blip at start must not keep the
        /// worker unready, nor dead tokens unread, for a whole interval.
        public var pollRetryDelay: Duration

        public init(topics: TopicNames, pollInterval: Duration, pollTimeout: Duration = .seconds(60), ledgerCapacity: Int, pollRetryDelay: Duration = .seconds(30)) {
            self.topics = topics
            self.pollInterval = pollInterval
            self.pollTimeout = pollTimeout
            self.ledgerCapacity = ledgerCapacity
            self.pollRetryDelay = pollRetryDelay
        }
    }

    /// One app's legacy feedback service. `fetch` connects, reads every tuple until the service
    /// closes the connection, and hands them to `deliver` in chunks, in order, reading no more
    /// while a chunk is being delivered.
    public struct FeedbackService: Sendable {
        public typealias Fetch = @Sendable (_ timeout: Duration, _ deliver: ([FeedbackTuple]) async -> Void) async throws -> Void
        public var app: String
        /// The apns-topic the app's tokens belong to (the event key's first half).
        public var topic: String
        public var fetch: Fetch

        public init(app: String, topic: String, fetch: @escaping Fetch) {
            self.app = app
            self.topic = topic
            self.fetch = fetch
        }
    }

    private let configuration: Configuration
    private let consumer: KafkaConsumer
    private let publisher: ReliablePublisher
    private let services: [FeedbackService]
    private let logger: Logger
    private let ledger: Mutex<InvalidationLedger>
    private let publishing = TakingTurns()
    private let stopping = Atomic<Bool>(false)
    private let lostEvents = Atomic<Int>(0)
    /// Events from feedback-service tuples handed to Kafka and not yet acknowledged: the
    /// service has forgotten them, so a process that ends now loses them.
    private let feedbackEventsPublishing = Atomic<Int>(0)
    /// Whether the process was asked to stop: its services stop in turn, this one only after the
    /// consumer, and a poll started meanwhile would read tuples (which the service then forgets)
    /// that might never be published.
    private let stopRequested: @Sendable () -> Bool
    /// Per app: whether the last poll of its feedback service succeeded, and the apps whose
    /// service has answered at least once.
    private let polls = Mutex<(last: [String: Bool], answered: Set<String>)>(([:], []))

    private let resultsRead = Counter(label: "apns.feedback.results")
    private let undecodable = Counter(label: "apns.feedback.results.undecodable")
    private let duplicates = Counter(label: "apns.feedback.events.duplicate")

    public init(
        configuration: Configuration,
        consumer: KafkaConsumer,
        producer: KafkaProducer,
        feedbackServices: [FeedbackService],
        logger: Logger,
        stopRequested: @escaping @Sendable () -> Bool = { false }
    ) {
        self.stopRequested = stopRequested
        self.configuration = configuration
        self.consumer = consumer
        self.publisher = ReliablePublisher(producer: producer, logger: logger)
        self.services = feedbackServices
        self.logger = logger
        self.ledger = Mutex(InvalidationLedger(capacity: configuration.ledgerCapacity))
    }

    /// Publishes to Kafka that keep failing, for readiness.
    public var publishStalls: PublishStalls { publisher.stalls }

    /// Events read from a legacy feedback service and never published: a forced stop cut their
    /// publishing short, and the service has forgotten them. The process reports them on exit.
    public var eventsLost: Int { lostEvents.load(ordering: .relaxed) }

    /// What ending the process now would lose for good: events already lost, and those being
    /// published from a feedback-service poll (the service forgets what it sent). For the
    /// overdue and second-signal exits, which do not wait for the poll to report.
    public var eventsAtRisk: Int { lostEvents.load(ordering: .relaxed) + feedbackEventsPublishing.load(ordering: .relaxed) }

    /// Whether the last poll of each feedback service succeeded (app → success), for readiness.
    public var feedbackServiceHealth: [String: Bool] { polls.withLock { $0.last } }

    /// `/readyz`: partitions assigned, Kafka taking the events, and no legacy feedback service
    /// that has failed every poll so far: a certificate the service refuses shows here, so a
    /// rollout with it stops. Once a service has answered, a later failure (a network blip
    /// before a poll an hour away) shows in `apns_feedback_polls{outcome="error"}` and the log
    /// instead of making every replica unready until the next poll.
    public func readiness(assignedPartitions: Int) -> AdminServer.Readiness {
        if assignedPartitions == 0 { return .init(ready: false, detail: "no partitions assigned") }
        if let problem = publishStalls.problem() { return .init(ready: false, detail: problem) }
        // Polled, and never answered: its last poll failed too.
        let failing = polls.withLock { polls in polls.last.keys.filter { !polls.answered.contains($0) } }.sorted()
        if !failing.isEmpty {
            return .init(ready: false, detail: "every poll of the legacy feedback service has failed so far for \(failing.joined(separator: ", ")) (see the log)")
        }
        return .init(ready: true, detail: "\(assignedPartitions) partitions, \(services.count) feedback services")
    }

    public func run() async throws {
        // The poll loop runs beside the results; a stop waits for a poll in progress (its reading
        // is bounded by twice `pollTimeout`, not counting pauses while Kafka takes what was
        // read), never cutting one short, because the feedback service forgets the tuples it has
        // handed out. A child task, so that cancellation (the stop's time is up)
        // reaches its sleeps and its publishing too.
        await withDiscardingTaskGroup { group in
            group.addTask { await self.pollLoop() }
            for await batch in consumer.batches {
                await handle(batch)
            }
            stopping.store(true, ordering: .relaxed)
        }
        // Stay up until asked to stop, so the service group shuts down in its order.
        try? await gracefulShutdown()
    }

    // MARK: - Results

    private static let rejectedMarker = Array(#""rejected""#.utf8)

    func handle(_ batch: [KafkaRecord]) async {
        var events: [TokenEvent] = []
        for record in batch {
            resultsRead.increment()
            // Only a rejected result can invalidate a token; most results are skipped without
            // decoding them.
            guard Self.contains(record.value, Self.rejectedMarker) else { continue }
            let result: NotificationResult
            do {
                result = try NotificationResult(decoding: record.value)
            } catch {
                undecodable.increment()
                logger.debug("result is not decodable; skipped", metadata: [
                    "kafka.partition": "\(record.partition)", "kafka.offset": "\(record.offset)", "error": "\(error)",
                ])
                continue
            }
            // Without APNs's 410 timestamp, the invalidation dates from APNs's answer, not from now.
            guard let event = TokenEvent(result: result, observedAt: result.sentAt) else {
                // An invalidating answer whose token or topic cannot key an event (not one of
                // the worker's own results) is as unusable as an undecodable one.
                if TokenEvent.invalidates(result) { undecodable.increment() }
                continue
            }
            events.append(event)
        }
        if !events.isEmpty {
            // Cancelled before Kafka took them (or while waiting for the turn: a forced stop
            // need not wait out another round of publishing): left unfinished, redone.
            let complete = await publishing.run { () async -> Bool in
                guard !Task.isCancelled else { return false }
                return await publishNews(events).unpublished == 0
            }
            guard complete else { return }
        }
        consumer.markFinished(batch)
    }

    /// Admits `events` to the ledger and publishes those that are news: how many Kafka
    /// acknowledged, and how many it did not because publishing was cancelled first (those are
    /// forgotten again, so that a redo or a later report of the same token publishes them). Run
    /// in a `publishing` turn.
    private func publishNews(_ events: [TokenEvent]) async -> (published: Int, unpublished: Int) {
        let news = ledger.withLock { ledger in events.filter { ledger.admit($0) } }
        if news.count < events.count { duplicates.increment(by: events.count - news.count) }
        guard !news.isEmpty else { return (0, 0) }
        let rounds = Self.rounds(news)
        var published = 0
        for (index, round) in rounds.enumerated() {
            guard await publisher.publish(round.map(message(for:))) else {
                ledger.withLock { ledger in for event in rounds[index...].joined() { ledger.forget(event) } }
                return (published, news.count - published)
            }
            count(round)
            published += round.count
        }
        return (published, 0)
    }

    /// `events` in rounds that each hold at most one event per key, in order: a key's second
    /// event goes out only once its first is acknowledged. Published together, a resend of the
    /// first (its report failed) could land after the second, and the compacted topic would keep
    /// the older. One round when no key repeats, as is usual.
    static func rounds(_ events: [TokenEvent]) -> [[TokenEvent]] {
        guard events.count > 1 else { return [events] }
        var occurrences: [String: Int] = [:]
        var rounds: [[TokenEvent]] = [[]]
        rounds[0].reserveCapacity(events.count)
        for event in events {
            let index = occurrences[event.key, default: 0]
            occurrences[event.key] = index + 1
            if index == rounds.count { rounds.append([]) }
            rounds[index].append(event)
        }
        return rounds
    }

    private func message(for event: TokenEvent) -> KafkaOutgoingMessage {
        KafkaOutgoingMessage(topic: configuration.topics.tokenEvents, key: Array(event.key.utf8), value: event.encoded())
    }

    private func count(_ events: [TokenEvent]) {
        for event in events {
            // Reasons outside the reference's table (any 410 makes an event) share one label value.
            let reason = TokenEvent.invalidatingReasons.contains(event.reason) ? event.reason : "other"
            Counter(label: "apns.feedback.events", dimensions: [("reason", reason), ("source", event.source.rawValue)]).increment()
        }
    }

    static func contains(_ bytes: [UInt8], _ marker: [UInt8]) -> Bool {
        guard let first = marker.first, bytes.count >= marker.count else { return false }
        var index = 0
        let last = bytes.count - marker.count
        while index <= last {
            if bytes[index] == first, bytes[index..<(index + marker.count)].elementsEqual(marker) { return true }
            index += 1
        }
        return false
    }

    // MARK: - Legacy feedback service

    private func pollLoop() async {
        guard !services.isEmpty else { return }
        func stopped() -> Bool { stopping.load(ordering: .relaxed) || stopRequested() || Task.isCancelled }
        // Per service: when it is due, and how many polls in a row have failed.
        var schedule = services.map { _ in (due: ContinuousClock.now, failures: 0) }
        while !stopped() {
            for index in services.indices where !stopped() && ContinuousClock.now >= schedule[index].due {
                let service = services[index]
                await poll(service)
                let answered = polls.withLock { $0.last[service.app] == true }
                schedule[index].failures = answered ? 0 : schedule[index].failures + 1
                schedule[index].due = ContinuousClock.now + Self.delay(afterFailures: schedule[index].failures, configuration: configuration)
            }
            // Sleep in short steps so that a drain never waits a whole interval.
            let wake = schedule.map(\.due).min() ?? ContinuousClock.now + configuration.pollInterval
            while !stopped(), ContinuousClock.now < wake {
                try? await Task.sleep(for: .milliseconds(250))
            }
        }
    }

    /// Until the next poll of a service whose last `failures` polls failed (0: it answered).
    static func delay(afterFailures failures: Int, configuration: Configuration) -> Duration {
        guard failures > 0 else { return configuration.pollInterval }
        return min(configuration.pollRetryDelay * (1 << min(failures - 1, 20)), configuration.pollInterval)
    }

    /// Polls one service now and publishes its events, a chunk of tuples at a time (the service
    /// forgets what it sent, and a long list must not be held whole); used by the loop and by
    /// tests. Returns how many events were published.
    @discardableResult
    func poll(_ service: FeedbackService) async -> Int {
        var published = 0
        var unpublished = 0
        // One line per poll, not per tuple: a broken service could send thousands.
        var unusable: (count: Int, tokenBytes: Set<Int>) = (0, [])
        do {
            try await service.fetch(configuration.pollTimeout) { tuples in
                var events: [TokenEvent] = []
                let polledAt = UnixMillis(Int64(Date().timeIntervalSince1970 * 1000))
                for tuple in tuples {
                    guard let event = TokenEvent(feedback: tuple, topic: service.topic, app: service.app, polledAt: polledAt) else {
                        unusable.count += 1
                        unusable.tokenBytes.insert(tuple.token.count)
                        continue
                    }
                    events.append(event)
                }
                guard !events.isEmpty else { return }
                guard unpublished == 0 else {
                    // A forced stop cut an earlier chunk short: the rest is counted, not sent.
                    unpublished += events.count
                    lostEvents.add(events.count, ordering: .relaxed)
                    return
                }
                // Cancelled (a forced stop) before Kafka took them all: what it did not take is
                // counted, and not remembered, so that a result reporting the same token is not
                // taken for a repeat of an event that never went out.
                feedbackEventsPublishing.add(events.count, ordering: .relaxed)
                let outcome = await publishing.run { await publishNews(events) }
                // Counted as lost at once: an exit that does not wait for this poll to end
                // (overdue, a second signal) reports them too.
                lostEvents.add(outcome.unpublished, ordering: .relaxed)
                feedbackEventsPublishing.subtract(events.count, ordering: .relaxed)
                published += outcome.published
                unpublished += outcome.unpublished
            }
            polls.withLock { polls in
                polls.last[service.app] = true
                polls.answered.insert(service.app)
            }
            Counter(label: "apns.feedback.polls", dimensions: [("app", service.app), ("outcome", "ok")]).increment()
        } catch {
            polls.withLock { $0.last[service.app] = false }
            Counter(label: "apns.feedback.polls", dimensions: [("app", service.app), ("outcome", "error")]).increment()
            if Task.isCancelled {
                // A forced stop: there is no next interval; what was read is reported below.
                logger.notice("feedback service poll cut short: the worker is stopping", metadata: ["app": "\(service.app)"])
            } else {
                logger.warning("feedback service poll failed; will try again, backing off from \(configuration.pollRetryDelay) to at most the poll interval", metadata: ["app": "\(service.app)", "error": "\(error)"])
            }
        }
        // Also after a failed poll: tuples read before it failed were published, or lost.
        if unusable.count > 0 {
            logger.warning("feedback tuples carry no valid device token; skipped", metadata: [
                "app": "\(service.app)", "feedback.skipped": "\(unusable.count)", "token.bytes": "\(unusable.tokenBytes.sorted())",
            ])
        }
        if published > 0 {
            logger.info("feedback service reported dead tokens", metadata: ["app": "\(service.app)", "events": "\(published)"])
        }
        if unpublished > 0 {
            // Say what was lost rather than hide it.
            logger.error("stopped before the feedback service's events were published", metadata: ["app": "\(service.app)", "events": "\(unpublished)"])
        }
        return published
    }
}
