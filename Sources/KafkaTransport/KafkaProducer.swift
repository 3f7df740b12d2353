import APNsCore
import CRdKafka
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// An idempotent Kafka producer.
///
/// Every message gets its own delivery report: ``send(_:)`` returns when the broker acknowledged
/// the message (or throws the reason it never will), and ``send(_:onDelivery:)`` calls its closure
/// once, on the producer's polling thread (or, at shutdown, the thread that flushes: `rd_kafka_flush`
/// polls too, so reports may come from either, never both for one message). Enqueue errors come
/// back from `rd_kafka_produceva`'s own error object, never from librdkafka's thread-local last
/// error.
///
/// A dedicated thread polls librdkafka for delivery reports from `init` until shutdown. As a
/// `Service`, ``run()`` waits for graceful shutdown, then flushes with a deadline.
public final class KafkaProducer: Service, Sendable {
    private let core: ProducerCore
    private let configuration: KafkaProducerConfiguration
    private let logger: Logger
    /// How long ``run()`` lets queued messages drain at shutdown. Default: 10 seconds.
    public let shutdownFlushTimeout: Duration

    public init(
        configuration: KafkaProducerConfiguration,
        logger: Logger,
        shutdownFlushTimeout: Duration = .seconds(10)
    ) throws(KafkaError) {
        let context = ClientContext(logger: logger, clientID: configuration.client.clientID, role: "producer", metrics: configuration.client.metrics)
        let handle = try RDKafkaHandle(
            type: RD_KAFKA_PRODUCER,
            properties: configuration.rdKafkaProperties(),
            context: context
        ) { conf in
            rd_kafka_conf_set_dr_msg_cb(conf) { rk, message, _ in
                guard let message, let opaque = message.pointee._private else { return }
                let recipient = Unmanaged<KafkaDeliveryRecipient>.fromOpaque(opaque).takeRetainedValue()
                recipient.complete(message.pointee, context: ClientContext.from(rk))
            }
        }
        self.core = ProducerCore(handle: handle, logger: logger)
        self.configuration = configuration
        self.logger = logger
        self.shutdownFlushTimeout = shutdownFlushTimeout
        core.startPolling()
    }

    deinit {
        core.stopPolling()
    }

    /// Produces one message and returns where it was written, once the broker acknowledged it.
    /// When the local queue is full, waits for room (up to the message timeout).
    @discardableResult
    public func send(_ message: KafkaOutgoingMessage) async throws(KafkaError) -> KafkaDeliveryReport {
        let deadline = ContinuousClock.now + configuration.messageTimeout
        while true {
            let outcome: Result<KafkaDeliveryReport, KafkaError>? = await withUnsafeContinuation { continuation in
                let handler = DeliveryHandler { result in
                    continuation.resume(returning: result)
                }
                if let error = core.enqueue(message, handler: handler) {
                    if error.code == .queueFull {
                        continuation.resume(returning: nil)
                    } else {
                        continuation.resume(returning: .failure(error))
                    }
                }
            }
            if let outcome { return try outcome.get() }
            // Queue full: deliveries free room within milliseconds.
            guard ContinuousClock.now < deadline else {
                throw KafkaError(
                    code: .queueFull,
                    message: "the producer queue stayed full for the whole message timeout",
                    isRetryable: true
                )
            }
            do {
                try await Task.sleep(for: .milliseconds(2))
            } catch {
                throw KafkaError(code: .produce, message: "cancelled while waiting for room in the producer queue")
            }
        }
    }

    /// Enqueues one message; `onDelivery` is called exactly once, on the polling (or flushing) thread, with the
    /// outcome. Keep it short. Throws (and never calls `onDelivery`) when librdkafka refuses the
    /// message, e.g. ``KafkaError/Code/queueFull`` (retryable) or an unknown partition.
    public func send(
        _ message: KafkaOutgoingMessage,
        onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void
    ) throws(KafkaError) {
        let handler = DeliveryHandler(callback: onDelivery)
        if let error = core.enqueue(message, handler: handler) { throw error }
    }

    /// Enqueues one message whose delivery report goes to `recipient`'s
    /// ``KafkaDeliveryRecipient/kafkaDelivered(_:)``, exactly once, on the polling (or flushing) thread.
    /// Unlike ``send(_:onDelivery:)`` it makes no handler or closure per message: librdkafka
    /// carries the recipient itself. Throws (and never reports) when librdkafka refuses the
    /// message. Messages still queued when the producer stops without draining (see
    /// ``shutdown(flushTimeout:)``) are reported as failed.
    public func send(_ message: KafkaOutgoingMessage, reportingTo recipient: KafkaDeliveryRecipient) throws(KafkaError) {
        if let error = core.enqueue(message, handler: recipient) { throw error }
    }

    /// Like ``send(_:onDelivery:)``, but while the local queue is full it waits (polling every
    /// `retryInterval`) instead of failing: back-pressure for a sender that has nothing better to
    /// do. Other errors, and cancellation while waiting, are thrown.
    public func sendWaitingForSpace(
        _ message: KafkaOutgoingMessage,
        retryInterval: Duration = .milliseconds(2),
        onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void
    ) async throws {
        while true {
            do {
                try send(message, onDelivery: onDelivery)
                return
            } catch where error.code == .queueFull {
                try await Task.sleep(for: retryInterval)
            }
        }
    }

    /// Messages enqueued or in flight, not yet reported.
    public var queuedMessages: Int { Int(rd_kafka_outq_len(core.handle.pointer)) }

    /// Waits until every queued message has a delivery report, up to `timeout`.
    public func flush(timeout: Duration) async throws(KafkaError) {
        let handle = core.handle
        let milliseconds = Int32(clamping: max(0, timeout.milliseconds))
        let result = await BlockingThread.run(name: "kafka-flush") {
            rd_kafka_flush(handle.pointer, milliseconds).rawValue
        }
        if result != RD_KAFKA_RESP_ERR_NO_ERROR.rawValue {
            throw KafkaError(
                code: .flushTimeout,
                message: "\(queuedMessages) message(s) still undelivered after flushing for \(timeout)",
                rdKafka: rd_kafka_resp_err_t(rawValue: result),
                retryable: true
            )
        }
    }

    /// Makes librdkafka raise a fatal error, as its idempotent producer does when it can no longer
    /// keep its guarantees (`rd_kafka_test_fatal_error`); for tests of what follows.
    func raiseFatalErrorForTesting(_ reason: String) {
        _ = rd_kafka_test_fatal_error(core.handle.pointer, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, reason)
    }

    /// Flushes for up to `flushTimeout`, then fails whatever is left (their delivery reports say
    /// "purged"), and stops the polling thread. Later sends throw ``KafkaError/Code/closed``.
    public func shutdown(flushTimeout: Duration) async {
        guard core.beginClose() else { return }
        do {
            try await flush(timeout: flushTimeout)
        } catch {
            logger.warning("producer shutdown: flush incomplete, purging the rest", metadata: ["kafka.error": "\(error)"])
        }
        await core.stopPollingAndWait()
    }

    /// Runs until graceful shutdown (or cancellation), then ``shutdown(flushTimeout:)``. Throws
    /// librdkafka's fatal error if it raises one: the producer can send nothing more, and a
    /// service group then stops the process instead of retrying forever.
    public func run() async throws {
        var fatal: KafkaError?
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            if let error = core.handle.context.fatalError.withLock({ $0 }) {
                fatal = error
                break
            }
            try? await Task.sleep(for: .milliseconds(250))
        }
        await shutdown(flushTimeout: fatal == nil ? shutdownFlushTimeout : .zero)
        if let fatal { throw fatal }
    }
}

/// Receives the delivery reports of messages sent with ``KafkaProducer/send(_:reportingTo:)``.
///
/// Subclass it to take reports without a handler or closure per message: librdkafka carries the
/// recipient (retained) as each message's opaque, and the delivery-report callback releases it.
/// Subclasses are treated as `Sendable` without the compiler's checks: they must be thread-safe
/// themselves, as ``kafkaDelivered(_:)`` runs on the producer's polling thread.
///
/// It holds no reference to the client's context: the callback finds that through the handle
/// (unretained), so producing and reporting do not both touch one shared reference count for
/// every message.
open class KafkaDeliveryRecipient: @unchecked Sendable {
    public init() {}

    /// One message's outcome, called once per message sent to this recipient. Keep it short.
    open func kafkaDelivered(_ result: Result<KafkaDeliveryReport, KafkaError>) {}

    final func complete(_ message: rd_kafka_message_t, context: ClientContext?) {
        let topic = message.rkt.flatMap { rd_kafka_topic_name($0) }.map { String(cString: $0) } ?? ""
        if message.err == RD_KAFKA_RESP_ERR_NO_ERROR {
            context?.delivered.increment()
            kafkaDelivered(.success(KafkaDeliveryReport(topic: topic, partition: message.partition, offset: message.offset)))
        } else {
            context?.deliveryFailed.increment()
            kafkaDelivered(.failure(KafkaError(
                code: .delivery,
                message: "delivery to \(topic) failed",
                rdKafka: message.err
            )))
        }
    }
}

/// Calls a closure with one message's delivery report (``KafkaProducer/send(_:onDelivery:)`` and
/// the awaiting ``KafkaProducer/send(_:)``).
final class DeliveryHandler: KafkaDeliveryRecipient, @unchecked Sendable {
    let callback: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void

    init(callback: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void) {
        self.callback = callback
    }

    override func kafkaDelivered(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        callback(result)
    }
}

/// The producer's handle and polling thread.
final class ProducerCore: Sendable {
    let handle: RDKafkaHandle
    let logger: Logger
    private let closing = Atomic<Bool>(false)
    private let stop = Atomic<Bool>(false)
    /// Sends between their `closing` check and librdkafka taking the message: the final purge
    /// waits for them, or a message that slipped in after it would never get its report.
    private let enqueuing = Atomic<Int>(0)
    private let stopped = Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    init(handle: RDKafkaHandle, logger: Logger) {
        self.handle = handle
        self.logger = logger
    }

    func startPolling() {
        // The thread holds the core (and so the handle) until it has purged and drained the
        // queue; the last reference then destroys the handle on this thread, not the caller's.
        BlockingThread.start(name: "kafka-producer-poll") { [self] in
            pollLoop()
        }
    }

    private func pollLoop() {
        let rk = handle.pointer
        while !stop.load(ordering: .acquiring) {
            rd_kafka_poll(rk, 100)
        }
        // `closing` is set, so no new send gets past its check; wait for those already past it.
        while enqueuing.load(ordering: .sequentiallyConsistent) > 0 {
            rd_kafka_poll(rk, 1)
        }
        // Fail what is left so that every waiting `send` returns.
        rd_kafka_purge(rk, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
        let deadline = ContinuousClock.now + .seconds(5)
        while rd_kafka_outq_len(rk) > 0, ContinuousClock.now < deadline {
            rd_kafka_poll(rk, 50)
        }
        let remaining = rd_kafka_outq_len(rk)
        if remaining > 0 {
            logger.error("producer stopped with undelivered messages", metadata: ["kafka.queued": "\(remaining)"])
        }
        let waiters = stopped.withLock { state in
            state.done = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns false if closing had already begun.
    func beginClose() -> Bool {
        !closing.exchange(true, ordering: .sequentiallyConsistent)
    }

    func stopPolling() {
        closing.store(true, ordering: .sequentiallyConsistent)
        stop.store(true, ordering: .releasing)
    }

    func stopPollingAndWait() async {
        stopPolling()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = stopped.withLock { state in
                if !state.done { state.waiters.append(continuation) }
                return state.done
            }
            if done { continuation.resume() }
        }
    }

    /// Hands the message to librdkafka. On success the handler is owned by librdkafka until its
    /// delivery report; on failure it is released and the error returned.
    func enqueue(_ message: KafkaOutgoingMessage, handler: KafkaDeliveryRecipient) -> KafkaError? {
        // Counted before the check (both sequentially consistent): either the stopping thread
        // sees this send and waits for it, or this send sees `closing`.
        enqueuing.add(1, ordering: .sequentiallyConsistent)
        defer { enqueuing.subtract(1, ordering: .sequentiallyConsistent) }
        if closing.load(ordering: .sequentiallyConsistent) {
            return KafkaError(code: .closed, message: "the producer is shut down")
        }
        if handle.context.isFatal.load(ordering: .acquiring), let fatal = handle.context.fatalError.withLock({ $0 }) { return fatal }
        var headers: OpaquePointer?
        if !message.headers.isEmpty {
            let list = rd_kafka_headers_new(message.headers.count)
            for header in message.headers {
                if let value = header.value {
                    _ = value.withUnsafeBytes { bytes in
                        rd_kafka_header_add(list, header.key, -1, bytes.baseAddress, bytes.count)
                    }
                } else {
                    _ = rd_kafka_header_add(list, header.key, -1, nil, 0)
                }
            }
            headers = list
        }
        let opaque = Unmanaged.passRetained(handler).toOpaque()
        let rk = handle.pointer
        let error: OpaquePointer?
        if let rkt = handle.topicHandle(message.topic) {
            error = Self.produce(rk, message, headers: headers, opaque: opaque) { $0.vtype = RD_KAFKA_VTYPE_RKT; $0.u.rkt = rkt }
        } else {
            error = message.topic.withCString { topic in
                Self.produce(rk, message, headers: headers, opaque: opaque) { $0.vtype = RD_KAFKA_VTYPE_TOPIC; $0.u.cstr = topic }
            }
        }
        guard let error else { return nil }
        // Not enqueued: librdkafka owns neither the opaque nor the headers.
        Unmanaged<KafkaDeliveryRecipient>.fromOpaque(opaque).release()
        if let headers { rd_kafka_headers_destroy(headers) }
        let code = rd_kafka_error_code(error)
        if code == RD_KAFKA_RESP_ERR__QUEUE_FULL {
            rd_kafka_error_destroy(error)
            return KafkaError(
                code: .queueFull,
                message: "the producer's local queue is full",
                rdKafka: code,
                retryable: true
            )
        }
        return KafkaError(code: .produce, message: "could not enqueue a message for \(message.topic)", consuming: error)
    }

    /// One `rd_kafka_produceva` call; `topic` fills in the topic element (by handle or by name).
    private static func produce(
        _ rk: OpaquePointer,
        _ message: KafkaOutgoingMessage,
        headers: OpaquePointer?,
        opaque: UnsafeMutableRawPointer,
        topic: (inout rd_kafka_vu_t) -> Void
    ) -> OpaquePointer? {
        message.value.withUnsafeBytes { value in
            withOptionalBytes(message.key) { key in
                withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 8) { vus in
                    var count = 0
                    func add(_ fill: (inout rd_kafka_vu_t) -> Void) {
                        var vu = rd_kafka_vu_t()
                        fill(&vu)
                        vus.initializeElement(at: count, to: vu)
                        count += 1
                    }
                    add(topic)
                    add {
                        $0.vtype = RD_KAFKA_VTYPE_VALUE
                        $0.u.mem.ptr = UnsafeMutableRawPointer(mutating: value.baseAddress)
                        $0.u.mem.size = value.count
                    }
                    if let key {
                        add {
                            $0.vtype = RD_KAFKA_VTYPE_KEY
                            $0.u.mem.ptr = UnsafeMutableRawPointer(mutating: key.baseAddress)
                            $0.u.mem.size = key.count
                        }
                    }
                    if let partition = message.partition {
                        add { $0.vtype = RD_KAFKA_VTYPE_PARTITION; $0.u.i32 = partition }
                    }
                    if let timestamp = message.timestamp {
                        add { $0.vtype = RD_KAFKA_VTYPE_TIMESTAMP; $0.u.i64 = timestamp }
                    }
                    if let headers {
                        add { $0.vtype = RD_KAFKA_VTYPE_HEADERS; $0.u.headers = headers }
                    }
                    add { $0.vtype = RD_KAFKA_VTYPE_MSGFLAGS; $0.u.i = RD_KAFKA_MSG_F_COPY }
                    add { $0.vtype = RD_KAFKA_VTYPE_OPAQUE; $0.u.ptr = opaque }
                    defer { vus.baseAddress.map { _ = $0.deinitialize(count: count) } }
                    return rd_kafka_produceva(rk, vus.baseAddress, count)
                }
            }
        }
    }
}

/// Calls `body` with the bytes of `bytes`, or `nil` when there are none.
private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}
