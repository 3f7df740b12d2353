import APNsClient
import APNsCore
import CoreMetrics
import KafkaTransport
import Logging
import NIOCore

/// One job with one token, delivered without a task of its own: the APNs client calls back
/// with the answer, the result is published from there, and the producer's acknowledgement
/// finishes the record and gives its in-flight slot back.
///
/// Tasks, continuations and executor hops per notification were a large share of the worker's
/// CPU; most jobs have one token and are answered on the first attempt, so they take this
/// path. The rare steps that must wait (an in-process retry's delay, publishing again after
/// Kafka refused) continue as tasks under the worker's `run()` (`continueLater`), which a
/// shutdown cancels.
///
/// Each step runs after the previous one handed over through a lock or a queue (the client's
/// pending requests, librdkafka's delivery reports), never two at once; so the mutable
/// `sending`, `progress` and `message` need no lock of their own.
final class DirectDelivery: KafkaDeliveryRecipient, APNsOutcomeReceiver, @unchecked Sendable {
    private let worker: PushWorker
    private let record: KafkaRecord
    private let weight: Int
    private let token: DeviceToken
    /// The job and its request until the outcome message is made. Dropped then, on the thread
    /// that just used them, instead of with this object on the producer's polling thread, where
    /// freeing them cost cache misses (measured: about 6% of the worker's CPU).
    private var sending: (job: JobInFlight, notification: OutgoingNotification)?
    private var progress: PushWorker.SendProgress
    private var sentAt = NIODeadline.uptimeNanoseconds(0)
    /// When the answer came, and so (about) when its result went to the producer: a publish that
    /// fails counts as stalled from then (readiness), not from the retry after librdkafka's
    /// report, which comes only after message.timeout.ms.
    private var answeredAt = NIODeadline.uptimeNanoseconds(0)
    /// The job's one outcome message (a result, or the job for the retry topic), kept until Kafka
    /// acknowledged it in case it must be published again. Set before it is handed to the
    /// producer, whose queue orders that before the delivery report reads it.
    private var message: KafkaOutgoingMessage?

    init(worker: PushWorker, job: JobInFlight, record: KafkaRecord, weight: Int) {
        self.worker = worker
        self.record = record
        self.weight = weight
        // The caller checked that the job has exactly one token.
        let notification = worker.makeNotification(token: job.tokens[0], of: job)
        self.token = notification.token
        self.sending = (job, notification)
        self.progress = PushWorker.SendProgress(attempts: job.previousAttempts)
    }

    /// Sends, unless the job's deadline or expiration already passed.
    func start() {
        // Set until the outcome message is made, which ends the sending.
        guard case let (job, notification)? = sending else {
            return assertionFailure("a direct delivery started again after its outcome was made")
        }
        if let finished = worker.finishedBeforeSending(job, token: token, progress: progress) {
            publish(outcomeOf: finished, job: job)
            return
        }
        progress.attempts += 1
        sentAt = .now()
        worker.sender.submit(notification, to: self)
    }

    func receive(_ outcome: APNsOutcome, tag: Int) {
        // The client calls back once per submit, so this is always set.
        guard case let (job, notification)? = sending else {
            return assertionFailure("a second outcome for one submit")
        }
        let now = NIODeadline.now()
        answeredAt = now
        if progress.attempts == job.previousAttempts + 1, case .answered(let response) = outcome {
            recordAddedLatency(answeredAt: now, response: response)
        }
        let sent = SendResult(outcome, sentID: notification.request.apnsID, latencyMs: sentAt.milliseconds(until: now))
        switch worker.afterSending(sent, job: job, token: token, sendBy: notification.sendBy, progress: &progress) {
        case .done(let finished):
            publish(outcomeOf: finished, job: job)
        case .retryInProcess(let delay):
            // Only this device waits (a 429, a 503, a lost connection); rare, so a task is fine.
            worker.continueLater({
                do {
                    try await Task.sleep(for: .milliseconds(delay))
                } catch {
                    // Cancelled (a forced stop): not sent again without its backoff (a 429'd
                    // device would get back-to-back requests); left for the group to redo.
                    return self.abandon()
                }
                // Its partition moved on during the backoff (lost, or revoked past its drain):
                // the new owner redoes the job; sending here too reaches the device twice.
                guard self.worker.consumer.isCurrent(self.record) else { return self.abandon() }
                self.start()
            }, ifStopped: abandon)
        }
    }

    /// The answer's latency runs from its HEADERS going to the session, so that moment is the
    /// answer's arrival minus it.
    private func recordAddedLatency(answeredAt: NIODeadline, response: APNsResponse) {
        let polledAt = record.polledAtUptimeNanoseconds
        guard polledAt > 0 else { return }
        let onTheWire = Int64(answeredAt.uptimeNanoseconds) - TimeAmount(response.latency).nanoseconds
        worker.addedLatency.recordNanoseconds(max(0, onTheWire - Int64(polledAt)))
    }

    private func publish(outcomeOf outcome: PushWorker.TokenOutcome, job: JobInFlight) {
        let message = worker.outcomeMessage(outcome, of: job, record: record)
        // Before the send: the delivery report may come (on another thread) before it returns.
        sending = nil
        self.message = message
        do throws(KafkaError) {
            try worker.publisher.producer.send(message, reportingTo: self)
        } catch {
            // Refused locally (a full queue, say): published again below, with backoff.
            kafkaDelivered(.failure(error))
        }
    }

    override func kafkaDelivered(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        guard case .failure(let error) = result else { return finish() }
        // Set before every send; without it there is nothing to publish again, and the slot at
        // least goes back.
        guard let message else { return abandon() }
        let progress = [token: progress]
        // Published again by itself, even when refused as too large: it went out in a batch
        // with other deliveries' messages, which the broker refuses whole. Refused again alone,
        // what stands for it (a split retry record, `failed` results) goes out instead.
        worker.publisher.retryLogs.log(.warning, "publishing failed; will retry", metadata: ["kafka.topic": "\(message.topic)", "error": "\(error)"], to: worker.logger)
        let since = answeredAt.uptimeNanoseconds > 0 ? ContinuousClock.now - .nanoseconds((NIODeadline.now() - answeredAt).nanoseconds) : nil
        worker.continueLater({
            // False only when shutdown cancelled it first: the record then stays unfinished and
            // is redone after its partition moves (duplicates allowed, losses not).
            if await self.worker.publish([message], for: self.record, progress: progress, since: since) {
                self.finish()
            } else {
                self.abandon()
            }
        }, ifStopped: abandon)
    }

    private func finish() {
        worker.consumer.markFinished(record)
        worker.limiter.release(weight)
    }

    /// Gives the slot back without finishing the record (the worker is stopping).
    private func abandon() {
        worker.limiter.release(weight)
    }
}
