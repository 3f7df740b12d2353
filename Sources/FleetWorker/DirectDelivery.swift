import APNsClient
import APNsCore
import KafkaTransport
import Logging
import NIOCore
import Synchronization

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
/// `progress` needs no lock of its own.
final class DirectDelivery: APNsOutcomeReceiver, @unchecked Sendable {
    private let worker: PushWorker
    private let job: JobInFlight
    private let record: KafkaRecord
    private let weight: Int
    private let notification: OutgoingNotification
    private var progress: PushWorker.SendProgress
    private var sentAt = NIODeadline.uptimeNanoseconds(0)
    /// The messages being published, acknowledgements still awaited, and those Kafka refused.
    private let publishing = Mutex<(messages: [KafkaOutgoingMessage], remaining: Int, failed: [KafkaOutgoingMessage])>(([], 0, []))

    init(worker: PushWorker, job: JobInFlight, record: KafkaRecord, weight: Int) {
        self.worker = worker
        self.job = job
        self.record = record
        self.weight = weight
        // The caller checked that the job has exactly one token.
        self.notification = worker.makeNotification(token: job.tokens[0], of: job)
        self.progress = PushWorker.SendProgress(attempts: job.previousAttempts)
    }

    /// Sends, unless the job's deadline or expiration already passed.
    func start() {
        if let finished = worker.finishedBeforeSending(job, token: notification.token, progress: progress) {
            publish(worker.outcomeMessages([finished], of: job, record: record))
            return
        }
        progress.attempts += 1
        sentAt = .now()
        worker.sender.submit(notification, to: self)
    }

    func receive(_ outcome: APNsOutcome, tag: Int) {
        let sent = SendResult(outcome, latencyMs: sentAt.millisecondsUntilNow)
        switch worker.afterSending(sent, job: job, token: notification.token, progress: &progress) {
        case .done(let finished):
            publish(worker.outcomeMessages([finished], of: job, record: record))
        case .retryInProcess(let delay):
            // Only this device waits (a 429, a 503, a lost connection); rare, so a task is fine.
            worker.continueLater({
                try? await Task.sleep(for: .milliseconds(delay))
                self.start()
            }, ifStopped: abandon)
        }
    }

    private func publish(_ messages: [KafkaOutgoingMessage]) {
        publishing.withLock { $0 = (messages, messages.count, []) }
        for index in messages.indices {
            do throws(KafkaError) {
                // The callback captures an index, not the message: a smaller context per message.
                try worker.publisher.producer.send(messages[index]) { result in self.acknowledged(index, result) }
            } catch {
                // Refused locally (a full queue, say): published again below, with backoff.
                acknowledged(index, .failure(error))
            }
        }
    }

    private func acknowledged(_ index: Int, _ result: Result<KafkaDeliveryReport, KafkaError>) {
        let (failed, topic) = publishing.withLock { state -> ([KafkaOutgoingMessage]?, String?) in
            var topic: String?
            if case .failure = result {
                topic = state.messages[index].topic
                state.failed.append(state.messages[index])
            }
            state.remaining -= 1
            return (state.remaining == 0 ? state.failed : nil, topic)
        }
        if let topic, case .failure(let error) = result {
            worker.logger.warning("publishing failed; will retry", metadata: ["kafka.topic": "\(topic)", "error": "\(error)"])
        }
        guard let failed else { return }
        if failed.isEmpty {
            finish()
            return
        }
        worker.continueLater({
            // False only when shutdown cancelled it first: the record then stays unfinished and
            // is redone after its partition moves (duplicates allowed, losses not).
            if await self.worker.publisher.publish(failed) {
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
