import APNsCore
import Foundation
import KafkaTransport
import Logging
import Metrics
import NIOCore
import ServiceLifecycle
import Synchronization

/// The push worker's pipeline: jobs from Kafka → APNs → one result per notification.
///
/// A one-token job for an HTTP/2 app (most jobs) is a ``DirectDelivery``: sent with the client's
/// `submit`, its result published from the client's callback, the record finished from the
/// producer's. No task waits for it. Any other record — fan-out, rejected, for a binary app —
/// is processed in a child task. Both are bounded by the in-flight limiter.
/// A record is marked finished — which lets the consumer store its offset once every earlier
/// record of its partition is finished too — only after all of its results (and its DLQ or
/// retry record) have been acknowledged by the Kafka producer. That is the at-least-once rule.
///
/// Back-pressure: above the high watermark of the in-flight bound the worker pauses the
/// consumer's partitions (it keeps polling) and resumes them below the low watermark. A retry
/// record whose `not-before` is still ahead waits outside the bound; its partition is read on
/// (another device's retry may be due sooner) until it holds a few hundred waiting records.
public final class PushWorker: Service, Sendable {
    public struct Configuration: Sendable {
        public var fleet: FleetConfiguration
        public var workerID: String
        /// Notifications in flight; the limiter's capacity.
        public var maxInFlight: Int

        public init(fleet: FleetConfiguration, workerID: String, maxInFlight: Int) {
            self.fleet = fleet
            self.workerID = workerID
            self.maxInFlight = maxInFlight
        }
    }

    private let configuration: Configuration
    let consumer: KafkaConsumer
    let publisher: ReliablePublisher
    let sender: any NotificationSender
    private let intake: JobIntake
    private let policy: DeliveryPolicy
    let limiter: InFlightLimiter
    /// `apns-id`s for jobs that name none (the same one for every attempt of a notification) and
    /// retry jitter: seeded once from the system's random source, so ids differ between workers,
    /// rather than a `getrandom` call per notification.
    private let random = Mutex(SplitMix64(seed: UInt64.random(in: .min ... .max)))
    private let pauses: PartitionPauses
    private let retryWaits = RetryWaits()
    let logger: Logger
    private let now: @Sendable () -> UnixMillis
    private let outcomeCounters: OutcomeCounters
    /// From taking a one-token job's record from librdkafka to its request's HEADERS going to the
    /// HTTP/2 session, first attempts only: the latency the worker itself adds (docs/design.md's
    /// "job in Kafka → request on the wire", without the time in Kafka).
    let addedLatency = Timer(label: "apns.worker.added_latency")
    /// Warnings that come one per job or per notification, throttled apart (see `LogThrottle`):
    /// a broken producer or an APNs outage must not bury everything else in the log.
    private let invalidJobLogs = LogThrottle()
    private let failedLogs = LogThrottle()
    private let expiredLogs = LogThrottle()
    /// Steps of direct deliveries that must wait (an in-process retry's delay, publishing again
    /// after Kafka refused): run as tasks under `run()`, so that a shutdown cancels them as it
    /// cancels the task path.
    private let waitingSteps: AsyncStream<@Sendable () async -> Void>
    private let waitingStepsInput: AsyncStream<@Sendable () async -> Void>.Continuation

    public init(
        configuration: Configuration,
        consumer: KafkaConsumer,
        producer: KafkaProducer,
        sender: any NotificationSender,
        logger: Logger,
        revocations: RevocationForwarder? = nil,
        now: @escaping @Sendable () -> UnixMillis = { UnixMillis(Int64(Date().timeIntervalSince1970 * 1000)) }
    ) {
        self.configuration = configuration
        self.consumer = consumer
        self.publisher = ReliablePublisher(producer: producer, logger: logger)
        self.sender = sender
        self.intake = JobIntake(configuration: configuration.fleet, workerID: configuration.workerID)
        self.policy = DeliveryPolicy(retry: configuration.fleet.retry)
        self.outcomeCounters = OutcomeCounters(apps: configuration.fleet.apps.map(\.name))
        let pauses = PartitionPauses(consumer: consumer, logger: logger)
        self.pauses = pauses
        self.limiter = InFlightLimiter(capacity: configuration.maxInFlight) { action, inUse in
            pauses.backPressure(action, inUse: inUse)
        }
        self.logger = logger
        self.now = now
        (waitingSteps, waitingStepsInput) = AsyncStream.makeStream()
        revocations?.attach(self)
        // Series that exist from the start at 0: Prometheus's `increase()` cannot see the first
        // increment of a series that appears already counting it (the first bad job, say).
        for topic in [configuration.fleet.topics.jobs, configuration.fleet.topics.retry] {
            _ = Counter(label: "apns.worker.dlq", dimensions: [("topic", topic)])
        }
    }

    /// Notifications currently in flight.
    public var inFlight: Int { limiter.inUse }

    /// Whether the partitions are paused because work in flight is above the high watermark.
    public var isBackPressured: Bool { pauses.isBackPressured }

    /// Retry records waiting for their `not-before`.
    public var waitingRetries: Int { retryWaits.count }

    /// Brings gauges that depend on the consumer's assignment up to date; call before reading
    /// the metrics (the admin server's `/metrics`).
    public func refreshGauges() { pauses.refreshGauges() }

    /// Publishes to Kafka that keep failing, for readiness.
    public var publishStalls: PublishStalls { publisher.stalls }

    /// Partitions are being revoked (or the consumer is closing): retry records of theirs still
    /// waiting for `not-before` are handed back to the retry topic now instead of holding up the
    /// drain, and the records of theirs the consume loop has not reached are left to the next
    /// owner even while the loop waits for slots. Pass ``RevocationForwarder/handler`` as the
    /// consumer's `onRevoke` to get this.
    public func partitionsRevoked(_ partitions: [TopicPartition]) async {
        retryWaits.handBack(partitions)
        // The consume loop, if it waits for slots, looks through its batch for records of these.
        limiter.interrupt()
    }

    /// Partitions were lost (the session expired, or a rebalance failed): their new owner redoes
    /// every unfinished record from the last stored offset, so retry records of theirs still
    /// waiting for `not-before` are dropped; sent when due, they would reach the device twice.
    /// ``RevocationForwarder/lossHandler`` passes this to the consumer's `onLoss`.
    public func partitionsLost(_ partitions: [TopicPartition]) {
        retryWaits.drop(partitions)
    }

    public func run() async throws {
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await self.runWaitingSteps() }
            // Direct deliveries are not tasks of the group: they are done when the limiter is
            // empty (or the wait is cancelled); then the waiting steps' runner may end too.
            defer { waitingStepsInput.finish() }
            do {
                try await consume(into: &group)
            } catch {
                await limiter.waitUntilIdle()
                throw error
            }
            // The batch sequence ends when the consumer stops; the group then waits for the
            // work in flight, which the consumer's drain timeout bounds.
            await limiter.waitUntilIdle()
        }
        // Stay up until asked to stop, so the service group shuts down in its order (consumer,
        // then this, then the APNs pools and the producer) instead of taking an early return for
        // a failure.
        try? await gracefulShutdown()
    }

    /// Hands every consumed record to a direct delivery or a task of `group`.
    private func consume(into group: inout ThrowingDiscardingTaskGroup<any Error>) async throws {
        var batches = consumer.batches.makeAsyncIterator()
        while true {
            // While the loop works through a batch (and waits for slots), a partition of it may
            // move on, or start being revoked; only if a rebalance happened meanwhile (one atomic
            // load per record) is each record checked. Read before the batch is taken: the
            // consumer counts a rebalance as it starts, under the lock the batch is checked
            // under, so one that comes after the batch was checked always shows here.
            let rebalances = consumer.rebalances
            guard let batch = await batches.next() else { break }
            var mayBeStale = false
            // The rebalance count when the loop last looked through the rest of the batch.
            var sweptAt = rebalances
            for (index, record) in batch.enumerated() {
                // The record's partition may have moved on (revoked, or lost): the new owner
                // sends it, so sending it here too would only reach the device twice. Or it is
                // being revoked: its drain should not wait for work that has not started (under
                // back-pressure, a batch's worth of it; a retry record not due yet). Either way
                // it is left to the next owner.
                if !mayBeStale, consumer.rebalances != rebalances { mayBeStale = true }
                if mayBeStale, !consumer.claim(record) { continue }
                // A retry record that is not due yet waits without a slot: it must not hold up
                // other work, of its partition or others.
                if let wait = notDueFor(record) {
                    group.addTask { await self.processWhenDue(record, waitMilliseconds: wait) }
                    continue
                }
                // Decoded before it takes its slots, so that a job counts by its real tokens.
                let admission = admit(record)
                let weight = admission.weight
                // A revocation starting while the loop waits for slots wakes it
                // (`partitionsRevoked`): the batch's records of the revoking partitions that the
                // loop has not reached are left to the next owner at once. Otherwise the drain
                // waits for them while slots free up, by `wakeBatch` at a time, behind work of
                // partitions that stay.
                var claimed = true
                while !(await limiter.acquire(weight, unless: { consumer.rebalances != sweptAt })) {
                    sweptAt = consumer.rebalances
                    mayBeStale = true
                    for later in batch[(index + 1)...] { _ = consumer.claim(later) }
                    if !consumer.claim(record) {
                        claimed = false
                        break
                    }
                }
                guard claimed else { continue }
                // Again: waiting for slots under back-pressure can take long.
                if !mayBeStale, consumer.rebalances != rebalances { mayBeStale = true }
                if mayBeStale, !consumer.claim(record) {
                    limiter.release(weight)
                    continue
                }
                if case .accepted(let job) = admission, job.tokens.count == 1, sender.canSubmit(app: job.appName) {
                    DirectDelivery(worker: self, job: job, record: record, weight: weight).start()
                    continue
                }
                group.addTask {
                    await self.complete(admission, record: record)
                    self.limiter.release(weight)
                }
            }
        }
    }

    private func runWaitingSteps() async {
        await withDiscardingTaskGroup { steps in
            for await step in waitingSteps {
                steps.addTask { await step() }
            }
        }
    }

    /// Runs `step` as a task under `run()`; once `run()` is over, calls `stopped` instead.
    func continueLater(_ step: @escaping @Sendable () async -> Void, ifStopped stopped: () -> Void) {
        if case .terminated = waitingStepsInput.yield(step) { stopped() }
    }

    private static let tokensMarker = Array(#""tokens""#.utf8)

    /// How many notifications a record will become, for the in-flight bound, before it is
    /// decoded (a retry record waiting for its time). Estimated cheaply from the raw bytes: a
    /// fan-out job counts by its tokens.
    static func weight(of record: KafkaRecord) -> Int {
        if record.headers.contains(where: { $0.key == JobDecoder.tokenHeader }) { return 1 }
        // A retry record stands for the tokens it names, a part of the job's when it was split.
        if let list = record.headers.first(where: { $0.key == JobIntake.retryTokensKey })?.value {
            return list.reduce(1) { $1 == UInt8(ascii: ",") ? $0 + 1 : $0 }
        }
        var quotes = 0
        var inTokens = false
        let marker = Self.tokensMarker
        var index = 0
        let bytes = record.value
        // Count strings inside the tokens array; stop at its closing bracket.
        while index < bytes.count {
            if !inTokens {
                if bytes[index] == marker[0], index + marker.count <= bytes.count, bytes[index..<(index + marker.count)].elementsEqual(marker) {
                    inTokens = true
                    index += marker.count
                    continue
                }
            } else {
                if bytes[index] == UInt8(ascii: "]") { break }
                if bytes[index] == UInt8(ascii: "\"") { quotes += 1 }
            }
            index += 1
        }
        return max(1, quotes / 2)
    }

    // MARK: - Retry records not due yet

    /// How long a record must wait for its `not-before`, if it has one in the future. Cheap:
    /// only headers are read, and first records of `apns.jobs` have no `attempt` header.
    private func notDueFor(_ record: KafkaRecord) -> Int64? {
        // Only the retry topic's records are the worker's: a job topic's `attempt` header is the
        // producer's own (see `JobIntake.accept`).
        guard record.headers.contains(where: { $0.key == RetryHeaders.attemptKey }),
            record.topic == configuration.fleet.topics.retry,
            let retry = try? RetryHeaders(headers: record.headers)
        else { return nil }
        // A retry record waits at most the longest retry delay (plus a minute for clocks and
        // queues): a not-before further out came from elsewhere, and would pin its partition.
        let longest = Int64(configuration.fleet.retry.maxDelayMilliseconds) + 60_000
        let wait = min(retry.notBefore.value - now().value, longest)
        return wait > 0 ? wait : nil
    }

    private func processWhenDue(_ record: KafkaRecord, waitMilliseconds: Int64) async {
        // A loss reported before this wait began (the record was still in a batch) did not drop
        // it: check here, and again when it is due.
        guard consumer.isCurrent(record) else { return }
        let partition = record.topicPartition
        let bytes = record.value.count + (record.key?.count ?? 0)
        pauses.startWaiting(partition, bytes: bytes)
        // Held on purpose: a quiet worker waiting only for this is not a stalled pipeline.
        consumer.park()
        let wake = await retryWaits.wait(partition: partition, milliseconds: waitMilliseconds) {
            if consumer.isRevoking(partition) { return .handBack }
            // Lost (or its revocation drain ended) just before the wait began.
            return consumer.isCurrent(record) ? nil : .dropped
        }
        consumer.unpark()
        pauses.stopWaiting(partition, bytes: bytes)
        switch wake {
        case .due:
            // Its partition moved on meanwhile: the new owner sends it.
            guard consumer.isCurrent(record) else { return }
            let weight = Self.weight(of: record)
            // Waiting for slots can take long under back-pressure, and the record counts as in
            // progress meanwhile: a revocation of its partition (which interrupts the wait)
            // hands it back at once, rather than its drain waiting for slots to free up.
            while !(await limiter.acquire(weight, unless: { consumer.isRevoking(partition) || !consumer.isCurrent(record) })) {
                if !consumer.isCurrent(record) { return }
                if consumer.isRevoking(partition) { return await handBack(record) }
                // Another partition's revocation: wait again.
            }
            // The partition may also have gone, or started going, just as the slots came.
            if !consumer.isCurrent(record) {
                limiter.release(weight)
            } else if consumer.isRevoking(partition) {
                limiter.release(weight)
                await handBack(record)
            } else {
                await process(record)
                limiter.release(weight)
            }
        case .handBack:
            await handBack(record)
        case .dropped:
            // Left unfinished: the record is redelivered to whoever owns the partition next.
            return
        }
    }

    /// Publishes a waiting retry record again, unchanged, headers included: whoever consumes the
    /// copy waits out the rest of the delay. The original is finished only once the copy is
    /// acknowledged.
    private func handBack(_ record: KafkaRecord) async {
        logger.debug("retry record handed back to the retry topic", metadata: [
            "kafka.topic": "\(record.topic)", "kafka.partition": "\(record.partition)", "kafka.offset": "\(record.offset)",
        ])
        let copy = KafkaOutgoingMessage(topic: configuration.fleet.topics.retry, key: record.key, value: record.value, headers: record.headers)
        guard await publish([copy], for: record) else { return }
        consumer.markFinished(record)
    }

    // MARK: - One record

    func process(_ record: KafkaRecord) async {
        await complete(admit(record), record: record)
    }

    /// Sends an admitted record's notifications (or publishes its rejection), then finishes it.
    private func complete(_ admission: Admission, record: KafkaRecord) async {
        switch admission {
        case .rejected(let rejected):
            // Logged and counted only now: a record the loop decoded and then left to the next
            // owner (its partition being revoked) is that owner's to report.
            guard await publish(rejectionMessages(rejected, record: record), for: record) else { return }
        case .accepted(let job):
            // False when cancelled before Kafka took the results: left unfinished, redone.
            guard await deliver(job, record: record) else { return }
        }
        consumer.markFinished(record)
    }

    private enum Admission: Sendable {
        /// Unusable: its results and DLQ copy are made when it is published.
        case rejected(RejectedJob)
        case accepted(JobInFlight)

        /// Its share of the in-flight bound: one per notification.
        var weight: Int {
            if case .accepted(let job) = self { return max(1, job.tokens.count) }
            return 1
        }
    }

    // Synchronous work of the async functions on the send path lives in functions of its own
    // (kept out of line): an async function keeps every temporary of its body in its frame, which
    // lives on the heap for as long as the request is in flight. Measured: with the work inline,
    // frames were about 17 KB per notification in flight.

    @inline(never)
    private func admit(_ record: KafkaRecord) -> Admission {
        let source = SourcePosition(topic: record.topic, partition: record.partition, offset: record.offset)
        switch intake.accept(value: record.value, headers: record.headers, source: source, now: now()) {
        case .rejected(let rejected): return .rejected(rejected)
        // Boxed: the calls below keep only a reference in their frames, not a copy of the job.
        case .accepted(let job): return .accepted(JobInFlight(job))
        }
    }

    /// The results and the DLQ copy of a job that can never be sent; logs why.
    @inline(never)
    private func rejectionMessages(_ rejected: RejectedJob, record: KafkaRecord) -> [KafkaOutgoingMessage] {
        // A producer sends jobs that can never be sent: worth a warning, without tokens in full.
        // A retry record refused now was sent before: its results are `failed`, not `invalid`.
        let wasSent = rejected.results.first?.outcome == .failed
        invalidJobLogs.log(.warning, wasSent ? "retry record can no longer be sent; failed, sent to the DLQ" : "job is invalid; sent to the DLQ", metadata: [
            "job.id": "\(rejected.results.first?.jobID ?? "")",
            "apns.token": "\(Self.shortToken(rejected.results.first?.token ?? ""))",
            "job.tokens": "\(rejected.results.count)",
            "kafka.topic": "\(record.topic)", "kafka.partition": "\(record.partition)", "kafka.offset": "\(record.offset)",
            "job.reason": "\(rejected.results.first?.reason ?? "")",
        ], to: logger)
        Counter(label: "apns.worker.dlq", dimensions: [("topic", record.topic)]).increment()
        var messages = rejected.results.map { resultMessage($0) }
        messages.append(KafkaOutgoingMessage(
            topic: configuration.fleet.topics.deadLetter, key: record.key,
            value: rejected.deadLetterValue, headers: rejected.deadLetterHeaders
        ))
        return messages
    }

    /// Sends the job's notifications and publishes their results (and retry record); true once
    /// Kafka has acknowledged them all.
    private func deliver(_ job: JobInFlight, record: KafkaRecord) async -> Bool {
        // A retry record's `not-before` was waited for before it took its slot (`processWhenDue`).
        let outcomes: [TokenOutcome?]
        if job.tokens.count == 1, let token = job.tokens.first {
            // Most jobs have one token: no task group (and its allocations) for them.
            outcomes = [await deliver(token: token, of: job, record: record)]
        } else {
            outcomes = await withTaskGroup(of: TokenOutcome?.self, returning: [TokenOutcome?].self) { group in
                for token in job.tokens {
                    group.addTask { await self.deliver(token: token, of: job, record: record) }
                }
                var outcomes: [TokenOutcome?] = []
                outcomes.reserveCapacity(job.tokens.count)
                for await outcome in group { outcomes.append(outcome) }
                return outcomes
            }
        }

        // A token cancelled during its backoff, or whose partition moved on meanwhile, has no
        // outcome: the record is left unfinished.
        let settled = outcomes.compactMap { $0 }
        guard settled.count == outcomes.count else { return false }
        return await publish(outcomeMessages(settled, of: job, record: record), for: record, progress: Self.progressOfLater(settled))
    }

    /// The result messages of a job's finished tokens, plus the retry records for the tokens that
    /// retry later.
    @inline(never)
    func outcomeMessages(_ outcomes: [TokenOutcome], of job: JobInFlight, record: KafkaRecord) -> [KafkaOutgoingMessage] {
        var messages: [KafkaOutgoingMessage] = []
        var later: [LaterAttempt] = []
        for outcome in outcomes {
            switch outcome {
            case .finished(let result): messages.append(resultMessage(result))
            case .later(let attempt): later.append(attempt)
            }
        }
        messages += retryMessages(later, of: job, record: record)
        return messages
    }

    /// The one message of a one-token job's outcome (a direct delivery's): what
    /// ``outcomeMessages(_:of:record:)`` gives for `[outcome]`, without its arrays when the
    /// notification is finished (the usual case).
    func outcomeMessage(_ outcome: TokenOutcome, of job: JobInFlight, record: KafkaRecord) -> KafkaOutgoingMessage {
        switch outcome {
        case .finished(let result): resultMessage(result)
        case .later(let attempt):
            // One token makes one message: its retry record, or its `failed` result.
            retryMessages([attempt], of: job, record: record)[0]
        }
    }

    /// What librdkafka counts against `message.max.bytes` besides the value, key and headers:
    /// the record's own fields (at most 36 bytes in librdkafka 2.0.2), with room to spare.
    static let recordOverheadBytes = 64

    /// The job again, for `apns.jobs.retry`: the tokens still to send and when. A record's
    /// headers speak for every token it names, so tokens whose attempts or APNs answers differ
    /// (a 429 for one device, a 503 for another) go in separate records; a result that reads
    /// them later (`expired`, `failed`) then gives each token its own answer. Unanswered
    /// attempts share a record per kind (certainly not taken, or possibly taken): their reasons
    /// name streams, and a record per token would copy a large fan-out job once per token. None
    /// when `later` is empty.
    private func retryMessages(_ later: [LaterAttempt], of job: JobInFlight, record: KafkaRecord) -> [KafkaOutgoingMessage] {
        // Unanswered attempts by kind only: APNs certainly did not take them, or it may have.
        let key = { (attempt: LaterAttempt) -> (Int, Int?, String?) in
            switch attempt.last.attempt {
            case .answered(let status, let reason): (attempt.headers.attempt, status, reason?.rawValue)
            case .notAnswered: (attempt.headers.attempt, nil, "not answered")
            case .unconfirmed: (attempt.headers.attempt, nil, "unconfirmed")
            }
        }
        // Usually one group: one token, or tokens that all got the same answer.
        var groups: [[LaterAttempt]] = []
        for attempt in later {
            if let index = groups.firstIndex(where: { key($0[0]) == key(attempt) }) {
                groups[index].append(attempt)
            } else {
                groups.append([attempt])
            }
        }
        return groups.flatMap { retryMessages(alike: $0, of: job, record: record) }
    }

    /// The retry records of tokens that share their attempt count and APNs's answer (or, for
    /// unanswered ones, the kind of non-answer: then the headers' reason and not-before are
    /// those of the token due last), split over as many records as it takes to keep each within the producer's
    /// `message.max.bytes` (a fan-out job's `retry-tokens` can run to megabytes). A token that
    /// fits no record (the job itself is near the limit) gets a `failed` result instead: refused
    /// as too large, its record would be published again forever and hold its partition's offset
    /// back. The records carry the latest not-before of their tokens.
    private func retryMessages(alike later: [LaterAttempt], of job: JobInFlight, record: KafkaRecord) -> [KafkaOutgoingMessage] {
        guard let retry = later.max(by: { $0.headers.notBefore < $1.headers.notBefore })?.headers else { return [] }
        var headers = retry.applied(to: record.headers.filter {
            $0.key != RetryHeaders.jobIDKey && $0.key != JobIntake.retryTokensKey
        })
        headers.append(RecordHeader(RetryHeaders.jobIDKey, job.jobID))
        let maximumBytes = configuration.fleet.kafka.producerMessageMaxBytes
        // The list's own header counts here without its value, which is what the budget is for.
        let fixedBytes = Self.recordOverheadBytes + record.value.count + (record.key?.count ?? 0)
            + headers.reduce(0) { $0 + $1.byteCount + ReliablePublisher.headerOverheadBytes } + JobIntake.retryTokensKey.utf8.count + ReliablePublisher.headerOverheadBytes
        let listBudget = maximumBytes - fixedBytes
        var messages: [KafkaOutgoingMessage] = []
        var list: [UInt8] = []
        var listed = 0
        func publishList() {
            messages.append(KafkaOutgoingMessage(
                topic: configuration.fleet.topics.retry, key: record.key, value: record.value,
                headers: headers + [RecordHeader(key: JobIntake.retryTokensKey, value: list)]
            ))
            Counter(label: "apns.worker.retries.scheduled", dimensions: [("app", job.appName)]).increment(by: listed)
            list.removeAll(keepingCapacity: true)
            listed = 0
        }
        for attempt in later {
            let hex = attempt.token.hex.utf8
            guard hex.count <= listBudget else {
                messages.append(resultMessage(noRetry(attempt, of: job, recordBytes: fixedBytes + hex.count, limit: maximumBytes)))
                continue
            }
            if listed > 0, list.count + 1 + hex.count > listBudget { publishList() }
            if listed > 0 { list.append(UInt8(ascii: ",")) }
            list.append(contentsOf: hex)
            listed += 1
        }
        if listed > 0 { publishList() }
        return messages
    }

    /// A retry record Kafka refused as too large (its topic's `max.message.bytes` below the
    /// producer's, which `retryMessages` sized it by), as two records for half its tokens each;
    /// nil for any other message, one naming a single token, and one whose token list is under
    /// half the rest of it: every part carries the whole job, so halving such a list could not
    /// bring the record much below the limit, only multiply refused copies of a large job.
    static func halves(of message: KafkaOutgoingMessage, retryTopic: String) -> [KafkaOutgoingMessage]? {
        guard message.topic == retryTopic,
            let index = message.headers.firstIndex(where: { $0.key == JobIntake.retryTokensKey }),
            let list = message.headers[index].value
        else { return nil }
        let rest = message.contentBytes - list.count
        // Each round halves the list, so this bounds the parts to about 4 × list / rest and the
        // bytes sent to a few times the record's. A JSON fan-out job names each token in its
        // value too, so its list is never larger than the rest: halving it once or twice is what
        // brings it under a limit that only the list had pushed it over.
        guard list.count * 2 >= rest else { return nil }
        let tokens = list.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: true)
        guard tokens.count > 1 else { return nil }
        let middle = tokens.count / 2
        return [tokens[..<middle], tokens[middle...]].map { part in
            var half = message
            half.headers[index] = RecordHeader(key: JobIntake.retryTokensKey, value: Array(part.joined(separator: [UInt8(ascii: ",")])))
            return half
        }
    }

    /// The `failed` result of a token that was to retry later but whose retry record cannot fit
    /// in Kafka: its last attempt's answer, and why it goes no further.
    private func noRetry(_ attempt: LaterAttempt, of job: JobInFlight, recordBytes: Int, limit: Int) -> NotificationResult {
        noRetry(
            token: attempt.token, of: job, progress: attempt.progress,
            reason: "\(attempt.headers.lastReason); no retry: the job's retry record would be \(recordBytes) bytes, above the producer's message.max.bytes (\(limit))"
        )
    }

    private func noRetry(token: DeviceToken, of job: JobInFlight, progress: SendProgress, reason: String) -> NotificationResult {
        let status = progress.last?.attempt.status
        logFinished(job, token: token, outcome: .failed, status: status, reason: reason, attempts: progress.attempts)
        return result(
            job, token: token, outcome: .failed, status: status, reason: reason,
            attempts: progress.attempts, latency: progress.totalLatency, send: progress.last
        )
    }

    /// A token to send again later, through the retry topic, with its last attempt.
    struct LaterAttempt: Sendable {
        var token: DeviceToken
        var headers: RetryHeaders
        var last: SendResult
        /// Every attempt's latency so far, added up.
        var latency: Double

        var progress: SendProgress {
            SendProgress(attempts: headers.attempt, totalLatency: latency, last: last)
        }
    }

    /// Not `indirect`: a boxed result was copied into its box and out again, a retain and a
    /// release for each of its strings both times, on every notification.
    enum TokenOutcome: Sendable {
        case finished(NotificationResult)
        case later(LaterAttempt)
    }

    /// Sends one notification, retrying in process as the policy says.
    /// Nil when cancelled while waiting to try again: not sent without its backoff.
    private func deliver(token: DeviceToken, of job: JobInFlight, record: KafkaRecord) async -> TokenOutcome? {
        let notification = makeNotification(token: token, of: job)
        var progress = SendProgress(attempts: job.previousAttempts)
        while true {
            if let finished = finishedBeforeSending(job, token: token, progress: progress) { return finished }
            progress.attempts += 1
            let sent = await sender.send(notification)
            switch afterSending(sent, job: job, token: token, sendBy: notification.sendBy, progress: &progress) {
            case .done(let outcome):
                return outcome
            case .retryInProcess(let delay):
                // Only this device waits; the job's other tokens carry on.
                do { try await Task.sleep(for: .milliseconds(delay)) } catch { return nil }
                // The partition may have moved on during the backoff (lost, or revoked past its
                // drain): its new owner redoes the job, so sending here too reaches the device twice.
                guard consumer.isCurrent(record) else { return nil }
            }
        }
    }

    /// What one notification's attempts have come to so far.
    struct SendProgress {
        var attempts: Int
        var totalLatency = 0.0
        var last: SendResult?
    }

    enum NextStep {
        case done(TokenOutcome)
        case retryInProcess(milliseconds: Int64)
    }

    @inline(never)
    func makeNotification(token: DeviceToken, of job: JobInFlight) -> OutgoingNotification {
        // The same apns-id for every in-process attempt.
        let apnsID = job.accepted.job.job.apnsID ?? random.withLock { UUIDText.random(using: &$0) }
        // The wall clock is read only for jobs that have a cutoff.
        let cutoff = DeliveryPolicy.cutoff(deadline: job.deadline, expiration: job.expiration)
        let sendBy = cutoff.map { NIODeadline.sendBy(cutoff: $0, now: now()) } ?? .distantFuture
        return OutgoingNotification(token: token, of: job, apnsID: apnsID, sendBy: sendBy)
    }

    /// The outcome when the job's deadline or expiration has already passed; nil to send.
    @inline(never)
    func finishedBeforeSending(_ job: JobInFlight, token: DeviceToken, progress: SendProgress) -> TokenOutcome? {
        guard case .finish(let outcome, var status, var reason)? = policy.beforeSending(
            now: now(), deadline: job.deadline, expiration: job.expiration, attemptsMade: progress.attempts
        ) else { return nil }
        // The last word APNs had on it, its status and reason both: the answer before an
        // in-process backoff that outlasted the cutoff (as `policy.after` reports an expiry), or,
        // for a retry record finished before its first attempt here, the answer that sent it to
        // the retry topic.
        if let last = progress.last {
            reason = reason.map { "\(last.attempt.lastReason); \($0)" }
            status = status ?? last.attempt.status
        } else {
            if let previous = job.accepted.previousReason { reason = reason.map { "\(previous); \($0)" } }
            status = status ?? job.accepted.previousStatus
        }
        logFinished(job, token: token, outcome: outcome, status: status, reason: reason, attempts: progress.attempts)
        return .finished(result(
            job, token: token, outcome: outcome, status: status, reason: reason,
            attempts: progress.attempts, latency: progress.totalLatency, send: progress.last
        ))
    }

    /// What to do after an attempt: finish with a result, retry later through the retry topic,
    /// or wait and retry in process.
    @inline(never)
    func afterSending(_ answer: SendResult, job: JobInFlight, token: DeviceToken, sendBy: NIODeadline, progress: inout SendProgress) -> NextStep {
        // Every in-process attempt carries the same apns-id: one never written after one APNs may
        // have taken keeps that one's id for the result. (Answers carry their own: no copy.)
        let sent = answer.apnsID == nil ? answer.withAPNsID(progress.last?.apnsID) : answer
        // An attempt that did not deliver (slow: a timeout, say) keeps the pipeline from looking
        // stalled while a large job's notifications time out wave after wave.
        if case .answered(status: 200, _) = sent.attempt {} else { consumer.noteActivity() }
        progress.last = sent
        progress.totalLatency += sent.latencyMs
        let attempt = progress.attempts
        // One clock reading for the decision and the result's `sent_at`.
        let decidedAt = now()
        let decision = policy.after(
            attempt: attempt, result: sent.attempt, now: decidedAt,
            deadline: job.deadline, expiration: job.expiration,
            cutoffPassed: sent.attempt.isNotAnswered && sendBy <= .now(),
            sharesSlots: job.tokens.count > 1,
            jitter: random.withLock { $0.nextUnit() }
        )
        switch decision {
        case .finish(let outcome, let status, let reason):
            // Counted apart: how often `give-up` trades a possible duplicate for a `failed`.
            if outcome == .failed, policy.givesUp(after: sent.attempt) {
                Counter(label: "apns.worker.possibly_delivered_given_up", dimensions: [("app", job.appName)]).increment()
            }
            logFinished(job, token: token, outcome: outcome, status: status, reason: reason, attempts: attempt)
            return .done(.finished(result(
                job, token: token, outcome: outcome, status: status, reason: reason,
                attempts: attempt, latency: progress.totalLatency, send: sent, at: decidedAt
            )))
        case .retryInProcess(let delay, let lastReason):
            Counter(label: "apns.worker.retries.in_process", dimensions: [("app", job.appName)]).increment()
            logger.debug("retrying in process", metadata: [
                "job.id": "\(job.jobID)", "apns.token": "\(Self.shortToken(token.hex))", "apns.app": "\(job.appName)",
                "apns.attempt": "\(attempt)", "apns.last_reason": "\(lastReason)", "apns.delay_ms": "\(delay)",
            ])
            return .retryInProcess(milliseconds: Int64(delay))
        case .retryLater(let notBefore, let lastReason):
            logger.debug("retrying through the retry topic", metadata: [
                "job.id": "\(job.jobID)", "apns.token": "\(Self.shortToken(token.hex))", "apns.app": "\(job.appName)",
                "apns.attempt": "\(attempt)", "apns.last_reason": "\(lastReason)", "apns.not_before": "\(notBefore.value)",
            ])
            let headers = RetryHeaders(attempt: attempt, notBefore: notBefore, lastReason: lastReason, lastStatus: sent.attempt.status)
            return .done(.later(LaterAttempt(token: token, headers: headers, last: sent, latency: progress.totalLatency)))
        }
    }

    /// One line per finished notification: debug when APNs settled it, warning when the worker
    /// gave up (retries exhausted, or past the deadline). Never the full token.
    private func logFinished(_ job: JobInFlight, token: DeviceToken, outcome: Outcome, status: Int?, reason: String?, attempts: Int) {
        func fields() -> Logger.Metadata {
            [
                "job.id": "\(job.jobID)", "apns.token": "\(Self.shortToken(token.hex))", "apns.app": "\(job.appName)",
                "apns.status": "\(status.map(String.init) ?? "none")", "apns.reason": "\(reason ?? "none")", "apns.attempts": "\(attempts)",
            ]
        }
        switch outcome {
        case .failed: failedLogs.log(.warning, "notification failed", metadata: fields(), to: logger)
        case .expired: expiredLogs.log(.warning, "notification expired", metadata: fields(), to: logger)
        default: logger.debug("notification \(outcome.rawValue)", metadata: fields())
        }
    }

    /// A token for logs: the first 8 hex digits, enough to correlate and not enough to target a device.
    static func shortToken(_ hex: String) -> String {
        hex.isEmpty ? "" : hex.prefix(8) + "…"
    }

    private func result(
        _ job: JobInFlight, token: DeviceToken, outcome: Outcome, status: Int?, reason: String?,
        attempts: Int, latency: Double, send: SendResult?, at sentAt: UnixMillis? = nil
    ) -> NotificationResult {
        NotificationResult(
            jobID: job.jobID, token: token.hex, topic: job.job.topic, app: job.appName,
            outcome: outcome, status: status, reason: reason,
            apnsID: send?.apnsID, apnsUniqueID: send?.apnsUniqueID,
            unregisteredAt: outcome == .rejected ? send?.unregisteredAt : nil,
            attempts: attempts, latencyMs: latency, sentAt: sentAt ?? now(), worker: configuration.workerID,
            meta: job.job.job.meta, source: job.source
        )
    }

    /// A result for `apns.results`, counted as it is made.
    private func resultMessage(_ result: NotificationResult) -> KafkaOutgoingMessage {
        outcomeCounters.counter(for: result).increment()
        return KafkaOutgoingMessage(topic: configuration.fleet.topics.results, key: Array(result.token.utf8), value: result.encoded())
    }

    /// Publishes `record`'s outcome messages and waits for every acknowledgement; false only
    /// when cancelled first (see ``ReliablePublisher``): the record then stays unfinished and is
    /// redone elsewhere. `progress` holds the attempts of the tokens its retry records name.
    func publish(
        _ messages: [KafkaOutgoingMessage], for record: KafkaRecord, progress: [DeviceToken: SendProgress] = [:],
        since: ContinuousClock.Instant? = nil
    ) async -> Bool {
        await publisher.publish(messages, since: since) { replaceTooLarge($0, for: record, progress: progress) }
    }

    /// The attempts so far of the tokens that retry later; empty (no allocation) when none does.
    private static func progressOfLater(_ outcomes: [TokenOutcome]) -> [DeviceToken: SendProgress] {
        var progress: [DeviceToken: SendProgress] = [:]
        for case .later(let attempt) in outcomes {
            progress[attempt.token] = attempt.progress
        }
        return progress
    }

    /// What stands for a retry record the retry topic refused as too large (its
    /// `max.message.bytes` below the producer's, which `retryMessages` sized it by): two records
    /// for half its tokens each, or, where halving cannot help, a `failed` result per token with
    /// its last attempt's answer from `progress`. Published again as it is, it would be refused
    /// forever and hold `record`'s partition.
    func replaceTooLarge(_ message: KafkaOutgoingMessage, for record: KafkaRecord, progress: [DeviceToken: SendProgress]) -> [KafkaOutgoingMessage]? {
        guard message.topic == configuration.fleet.topics.retry else { return nil }
        if let halves = Self.halves(of: message, retryTopic: configuration.fleet.topics.retry) { return halves }
        // Read back as the next consumer would: the job and the tokens the record names.
        let source = SourcePosition(topic: record.topic, partition: record.partition, offset: record.offset)
        let job: JobInFlight
        switch intake.accept(value: message.value, headers: message.headers, source: source, now: now(), isRetryRecord: true) {
        case .accepted(let accepted): job = JobInFlight(accepted)
        // What its consumer would make of it (only a record handed back unread can be unusable).
        case .rejected(let rejected): return rejectionMessages(rejected, record: record)
        }
        // Each token's own last answer where this worker made it (a fan-out job's tokens end on
        // different answers); the record's, which names one of them, otherwise.
        let recordReason = message.headers.text(RetryHeaders.lastReasonKey) ?? "none"
        let why = "no retry: the retry topic refused the job's retry record (\(message.contentBytes) bytes) as too large for its max.message.bytes"
        Counter(label: "apns.worker.retries.refused", dimensions: [("app", job.appName)]).increment(by: job.tokens.count)
        return job.tokens.map { token in
            let tokenProgress = progress[token] ?? SendProgress(attempts: job.previousAttempts)
            let lastReason = tokenProgress.last?.attempt.lastReason ?? recordReason
            return resultMessage(noRetry(token: token, of: job, progress: tokenProgress, reason: "\(lastReason); \(why)"))
        }
    }
}

/// The `apns.worker.notifications` counters, one per outcome, status, reason and app, made once
/// and reused: results are counted per notification, on the hot path.
///
/// The reason label is APNs's reason when it is one of Table 8-6, "unknown" for another reason
/// APNs gave, and "none" otherwise. The worker's own reasons (why a job is invalid, expired or
/// failed) are free text with tokens and numbers in them, and would explode label cardinality.
final class OutcomeCounters: Sendable {
    private struct Key: Hashable {
        var outcome: Outcome
        var status: Int?
        var reason: String
        var app: String?
    }

    private let counters = Mutex<[Key: Counter]>([:])
    /// The configured apps: an invalid job names any app it likes, and a label per made-up
    /// name would grow /metrics (and this table) without end.
    private let apps: Set<String>

    init(apps: [String]) {
        self.apps = Set(apps)
    }

    func counter(for result: NotificationResult) -> Counter {
        var reason = "none"
        if result.status != nil, let text = result.reason {
            // A failed or expired result says more after APNs's reason ("… (gave up after 8 attempts)").
            let name = String(text.prefix { $0.isLetter })
            reason = APNsReasonTable.byReason[name] != nil ? name : "unknown"
        }
        // Looked up as the result names its app (the usual hit); only on a miss is the app mapped
        // to its label, and the counter kept under the label, so made-up names add no entries.
        let raw = Key(outcome: result.outcome, status: result.status, reason: reason, app: result.app)
        return counters.withLock { counters in
            if let counter = counters[raw] { return counter }
            var key = raw
            key.app = raw.app.map { apps.contains($0) ? $0 : "unknown" }
            if let counter = counters[key] { return counter }
            let counter = Counter(label: "apns.worker.notifications", dimensions: [
                ("outcome", key.outcome.rawValue), ("status", key.status.map(String.init) ?? "none"),
                ("reason", key.reason), ("app", key.app ?? "none"),
            ])
            counters[key] = counter
            return counter
        }
    }
}

/// An accepted job shared by reference between the sends of its tokens (see `deliver`).
final class JobInFlight: Sendable {
    let accepted: AcceptedJob

    init(_ accepted: AcceptedJob) { self.accepted = accepted }

    var jobID: String { accepted.jobID }
    var job: ResolvedJob { accepted.job }
    var appName: String { accepted.appName }
    var source: SourcePosition { accepted.source }
    var previousAttempts: Int { accepted.previousAttempts }
    var tokens: [DeviceToken] { accepted.tokens }
    // Read per attempt: straight from the stored job, not through a copy of `job`.
    var deadline: Int64? { accepted.job.job.deadline }
    var expiration: Int64? { accepted.job.job.expiration }
}
