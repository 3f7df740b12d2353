import APNsCore
import APNsHTTP2
import Logging
import Metrics
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// What a connection tells its owner (the pool). Called on the connection's event loop.
protocol APNsConnectionEvents: AnyObject, Sendable {
    func connectionBecameReady(_ connection: APNsConnection, maxConcurrentStreams: UInt32?)
    func connection(_ connection: APNsConnection, didChangeMaxConcurrentStreams value: UInt32)
    /// `count` streams ended (answered, refused, timed out or failed); `tokenAccepted` when an
    /// answer among them proved the token valid. Called once per batch of answers.
    func connection(_ connection: APNsConnection, didFinishStreams count: Int, tokenAccepted: Bool)
    /// A submitted request ended, after `didFinishStreams` gave its stream back.
    func connection(_ connection: APNsConnection, didFinish request: APNsRequest, with outcome: APNsOutcome)
    func connection(_ connection: APNsConnection, didRejectProviderToken reason: APNsReason)
    /// APNs answered 403 with a credential reason (a certificate for the other environment, say)
    /// to `inARow` requests with no 200 between: a setting to fix, not a bad job.
    func connection(_ connection: APNsConnection, didRejectCredentials reason: APNsReason, inARow: Int)
    /// GOAWAY arrived, the connection was retired, or it closed: no new work.
    func connectionBecameUnusable(_ connection: APNsConnection)
    func connectionDidClose(_ connection: APNsConnection)
}

// Debug builds (and so the tests) trap if a request were ever resumed twice; release builds
// use the cheaper unchecked continuation.
#if DEBUG
typealias OutcomeContinuation = CheckedContinuation<APNsOutcome, Never>
func withOutcomeContinuation(_ body: (OutcomeContinuation) -> Void) async -> APNsOutcome {
    await withCheckedContinuation(body)
}
#else
typealias OutcomeContinuation = UnsafeContinuation<APNsOutcome, Never>
func withOutcomeContinuation(_ body: (OutcomeContinuation) -> Void) async -> APNsOutcome {
    await withUnsafeContinuation(body)
}
#endif

/// One request travelling through the pool and a connection. A class: it is handed from queue
/// to queue (the pool's waiters, the connection's pending requests, its stream table), and each
/// hand-over then moves one reference instead of copying the notification's fields.
final class APNsRequest: Sendable {
    /// Where the outcome goes.
    enum Destination: Sendable {
        /// A caller suspended in `APNsClientPool.send`.
        case caller(OutcomeContinuation)
        /// The receiver of `APNsClientPool.submit`; the pool may send the request again first.
        case receiver(any APNsOutcomeReceiver, tag: Int)
    }

    let notification: APNsNotification
    /// When the answer must have arrived: the stream is cancelled then.
    let deadline: NIODeadline
    /// When the request must have been written: not sent after that (`distantFuture` for none).
    let sendBy: NIODeadline
    let destination: Destination
    /// Times it was sent again because APNs certainly did not process it.
    let retries: Int

    init(notification: APNsNotification, deadline: NIODeadline, sendBy: NIODeadline = .distantFuture, destination: Destination, retries: Int = 0) {
        self.notification = notification
        self.deadline = deadline
        self.sendBy = sendBy
        self.destination = destination
        self.retries = retries
    }

    /// How long it may wait for a stream.
    var waitsUntil: NIODeadline { min(deadline, sendBy) }

    func sentAgain() -> APNsRequest {
        APNsRequest(notification: notification, deadline: deadline, sendBy: sendBy, destination: destination, retries: retries + 1)
    }

    /// Why a request was not written before its `sendBy`; `when` says where it was then.
    static func tooLate(_ when: String) -> APNsNotAnswered {
        APNsNotAnswered(.tooLate, "its send-by time (the job's deadline or expiration) passed \(when); it was not sent", certainlyNotProcessed: true)
    }
}

/// One long-lived HTTP/2 connection to APNs: NIO socket, NIOSSL (TLS 1.2+, ALPN h2, verified
/// server certificate) and a libnghttp2 client session.
///
/// Threading: everything but `pending` is confined to `eventLoop` (the channel's). Callers on
/// other threads only append to `pending` under its lock and schedule one drain per batch, so
/// that a burst of sends costs one event-loop hop and one write. That confinement is why the
/// class can be `@unchecked Sendable`.
final class APNsConnection: @unchecked Sendable {
    let id: UInt64
    let eventLoop: any EventLoop
    private let configuration: APNsClientConfiguration
    private let events: any APNsConnectionEvents
    private let logger: Logger
    private let metrics: ClientMetrics

    // Cross-thread: requests handed over, drained on the loop.
    private struct Pending {
        var requests: [APNsRequest] = []
        var drainScheduled = false
    }
    private let pending = Mutex(Pending())

    // Loop-confined, and never accessed re-entrantly: so these skip the runtime's exclusivity
    // checks, which ran several times per request.
    @exclusivity(unchecked) private var channel: (any Channel)?
    @exclusivity(unchecked) private var session: HTTP2Session?
    @exclusivity(unchecked) private var streams: HTTP2StreamTable<InFlight>
    /// The response header block being received. Its fields arrive back to back; they are kept
    /// here and go into the stream's entry once (`commitHeaderBlock`), or, for an answer that
    /// ends with its headers (every 200), straight into the answer without touching the table.
    @exclusivity(unchecked) private var headerBlock = ResponseHeaderBlock()
    @exclusivity(unchecked) private var tokenSchedule: ProviderTokenSchedule
    @exclusivity(unchecked) private var authorization: String?
    @exclusivity(unchecked) private var ready = false
    /// The connect timeout fired before SETTINGS came: the connection is being given up.
    @exclusivity(unchecked) private var connectTimedOut = false
    /// 403s with a credential reason since the last answer that proved the credentials (see
    /// `credentialRejectionsToReport`).
    @exclusivity(unchecked) private var credentialRejectionsInARow = 0
    @exclusivity(unchecked) private var unusable = false
    @exclusivity(unchecked) private var closed = false
    @exclusivity(unchecked) private var goAwayLastStreamID: Int32?
    @exclusivity(unchecked) private var lastRead = NIODeadline.now()
    @exclusivity(unchecked) private var pingSentAt: NIODeadline?
    @exclusivity(unchecked) private var sweepTask: Scheduled<Void>?
    /// Whether the next sweep was scheduled at the idle pace (see `scheduleSweep`).
    @exclusivity(unchecked) private var sweepIsIdle = false
    /// Bumped whenever a sweep is scheduled: a cancelled sweep that the event loop had already
    /// picked up (NIO does not guarantee cancellation) sees it changed and does nothing, so a
    /// connection never keeps two sweep chains.
    @exclusivity(unchecked) private var sweepGeneration: UInt64 = 0
    @exclusivity(unchecked) private var drainDeadline: NIODeadline?
    /// When the session was told to end with a GOAWAY (`closeIfDrained`).
    @exclusivity(unchecked) private var terminatedAt: NIODeadline?
    /// Reused for every request's header fields (no String or array allocated per request).
    @exclusivity(unchecked) private var requestHeaders = HTTP2HeaderBlock()
    @exclusivity(unchecked) private var spareBatch: [APNsRequest] = []
    /// Outcomes decided during a read burst (or another event-loop task), delivered together:
    /// the pool hears once per batch, then every caller is resumed.
    @exclusivity(unchecked) private var completions: [(request: APNsRequest, outcome: APNsOutcome)] = []
    @exclusivity(unchecked) private var spareCompletions: [(request: APNsRequest, outcome: APNsOutcome)] = []
    @exclusivity(unchecked) private var completionsAcceptedToken = false
    @exclusivity(unchecked) private var completionFlushScheduled = false
    /// Set by frames received since the last flush; `lastRead` is updated once per burst.
    @exclusivity(unchecked) private var readSinceFlush = false
    /// One clock reading per burst for answer latencies.
    @exclusivity(unchecked) private var burstNow: NIODeadline?
    @exclusivity(unchecked) private(set) var hadSuccess = false
    /// 5xx answers since the last other answer (see `retireIfFailingFast`).
    @exclusivity(unchecked) private var serverErrorsInARow = 0
    /// Sent requests that timed out since the last answer (nil after an answer), and when that
    /// answer came (see `retireIfUnanswering`).
    private struct UnansweredRun {
        var timeouts: Int
        /// The later of the last answer and the earliest send among them.
        var since: NIODeadline
    }
    @exclusivity(unchecked) private var unanswered: UnansweredRun?
    @exclusivity(unchecked) private var lastAnswerAt = NIODeadline.now()
    /// Read from other threads after the connection became unusable (a benign race: only a backoff hint).
    private let successSeen = Atomic<Bool>(false)
    var hadSuccessSnapshot: Bool { successSeen.load(ordering: .relaxed) }

    private let readyPromise: EventLoopPromise<Void>
    private let unusablePromise: EventLoopPromise<Void>
    private let closedPromise: EventLoopPromise<Void>

    /// What a response's header block said so far.
    private struct ResponseHeaderBlock {
        var stream: Int32 = 0
        var status = 0
        /// The apns-id's bytes (reused buffer), compared with the request's before making a String.
        var apnsID: [UInt8] = []
        var hasAPNsID = false
        var apnsUniqueID: String?

        mutating func begin(_ stream: Int32) {
            self.stream = stream
            status = 0
            hasAPNsID = false
            apnsID.removeAll(keepingCapacity: true)
            apnsUniqueID = nil
        }

        /// Copies what was received into `inFlight`.
        func apply(to inFlight: inout InFlight) {
            if status != 0 { inFlight.status = status }
            if hasAPNsID {
                // APNs echoes the request's apns-id: reuse that String when the bytes match.
                if let requested = inFlight.request.notification.apnsID, apnsID.elementsEqual(requested.utf8) {
                    inFlight.apnsID = requested
                } else {
                    inFlight.apnsID = String(decoding: apnsID, as: UTF8.self)
                }
            }
            if let apnsUniqueID { inFlight.apnsUniqueID = apnsUniqueID }
        }
    }

    /// A stream until its answer: the request (kept for its apns-id, deadline and where the
    /// outcome goes; its payload stays in memory until then) and what the answer said so far.
    private struct InFlight {
        let request: APNsRequest
        /// When its HEADERS were handed to the session: the answer's latency starts here.
        let sentAt: NIODeadline
        var status = 0
        var apnsID: String?
        var apnsUniqueID: String?
        var body: ByteBuffer?

        init(_ request: APNsRequest, sentAt: NIODeadline) {
            self.request = request
            self.sentAt = sentAt
        }
    }

    private let authority: String

    init(id: UInt64, eventLoop: any EventLoop, configuration: APNsClientConfiguration, events: any APNsConnectionEvents, logger: Logger, metrics: ClientMetrics) {
        self.id = id
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.events = events
        self.metrics = metrics
        var logger = logger
        logger[metadataKey: "apns.connection"] = "\(id)"
        self.logger = logger
        self.tokenSchedule = ProviderTokenSchedule(refreshAge: configuration.tokenRefreshAge)
        self.authority = configuration.endpoint.host
        self.streams = HTTP2StreamTable(minimumCapacity: configuration.maximumStreamsPerConnection)
        self.readyPromise = eventLoop.makePromise()
        self.unusablePromise = eventLoop.makePromise()
        self.closedPromise = eventLoop.makePromise()
    }

    /// Completes when the connection takes no more work (GOAWAY, retired, closed).
    var unusableFuture: EventLoopFuture<Void> { unusablePromise.futureResult }
    /// Completes when the socket is closed.
    var closedFuture: EventLoopFuture<Void> { closedPromise.futureResult }

    // MARK: Connecting

    /// Opens the socket, completes TLS and waits for the server's first SETTINGS.
    func connect(sslContext: NIOSSLContext) async throws {
        let endpoint = configuration.endpoint
        // SNI and name verification use the host name; for an IP address NIOSSL checks the
        // certificate's IP SAN against the peer address instead.
        let serverHostname: String? = Self.isIPAddress(endpoint.host) ? nil : endpoint.host
        let bootstrap = ClientBootstrap(group: eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(TimeAmount(configuration.connectTimeout))
            .channelInitializer { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname)
                    try channel.pipeline.syncOperations.addHandler(tls)
                    try channel.pipeline.syncOperations.addHandler(HandshakeHandler(connection: self))
                }
            }
        let timeout = eventLoop.scheduleTask(in: TimeAmount(configuration.connectTimeout)) { [self] in
            // SETTINGS may have come just before, with this task not cancelled yet: the
            // connection is in use by then and must stay open.
            guard !ready else { return }
            connectTimedOut = true
            readyPromise.fail(APNsClientError(.connect, "no HTTP/2 SETTINGS from \(endpoint.host):\(endpoint.port) within \(configuration.connectTimeout)"))
            self.channel?.close(promise: nil)
        }
        defer { timeout.cancel() }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            let failure = APNsClientError(.connect, "cannot connect to \(endpoint.host):\(endpoint.port): \(error)")
            readyPromise.fail(failure)
            eventLoop.execute { self.finishClosed() }
            throw failure
        }
        eventLoop.execute { [self] in
            self.channel = channel
            channel.closeFuture.whenComplete { [self] _ in self.handleClose() }
        }
        do {
            try await readyPromise.futureResult.get()
        } catch {
            channel.close(promise: nil)
            throw error
        }
    }

    static func isIPAddress(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }

    /// Called by the handshake handler once TLS is up with ALPN h2.
    fileprivate func installHTTP2(on channel: any Channel) throws {
        self.channel = channel
        // The session holds the connection strongly (weak references are slow to load on every
        // callback); `handleClose` breaks the cycle.
        let session = try HTTP2Session(role: .client, delegate: self)
        self.session = session
        let handler = HTTP2ChannelHandler(session: session, initialSettings: [
            HTTP2Setting(.enablePush, 0),
            HTTP2Setting(.initialWindowSize, 1 << 20),
        ])
        // A session failure (a protocol error by the peer, say) closes the connection; without
        // this line the requests would only hear "closed before the answer".
        handler.onError = { [logger] error in
            logger.warning("HTTP/2 session failed; closing the connection", metadata: ["apns.error": "\(error)"])
        }
        try channel.pipeline.syncOperations.addHandler(handler)
        scheduleSweep()
    }

    fileprivate func handshakeFailed(_ error: any Error) {
        readyPromise.fail(APNsClientError(.connect, "TLS with \(configuration.endpoint.host):\(configuration.endpoint.port) failed: \(error)"))
    }

    // MARK: Sending (any thread)

    /// Sends one request; the pool has already taken a stream of this connection's budget.
    func execute(_ notification: APNsNotification, deadline: NIODeadline, sendBy: NIODeadline) async -> APNsOutcome {
        await withOutcomeContinuation { continuation in
            enqueue(APNsRequest(notification: notification, deadline: deadline, sendBy: sendBy, destination: .caller(continuation)))
        }
    }

    /// Sends a submitted request (its stream is taken); its outcome goes back to the pool.
    func enqueue(_ request: APNsRequest) {
        let schedule = pending.withLock { pending -> Bool in
            pending.requests.append(request)
            if pending.drainScheduled { return false }
            pending.drainScheduled = true
            return true
        }
        if schedule {
            eventLoop.execute { self.drainPending() }
        }
    }

    // MARK: Loop-confined work

    private func drainPending() {
        // The batch array is swapped out and back, so steady state allocates no arrays.
        var batch = spareBatch
        spareBatch = []
        pending.withLock { pending in
            pending.drainScheduled = false
            swap(&batch, &pending.requests)
        }
        guard !batch.isEmpty else { return }
        let now = NIODeadline.now()
        // Decided once per batch, when first needed: the token schedule reads the wall clock,
        // which showed in profiles when done per request.
        var batchAuthorization: BatchAuthorization?
        for request in batch {
            submit(request, now: now, batchAuthorization: &batchAuthorization)
        }
        batch.removeAll(keepingCapacity: true)
        spareBatch = batch
        if sweepIsIdle, !streams.isEmpty { sweepSoon() }
        // Not once closed: requests whose HEADERS were still queued were reported as never
        // sent, and retried elsewhere; a flush now could still write them (and the resets
        // queued with them free the streams they wait for).
        if !closed { session?.flush() }
        flushCompletions()
    }

    /// How the requests of one batch authenticate.
    private enum BatchAuthorization {
        /// A client certificate: no header.
        case certificate
        case bearer(String)
        /// Token auth, but no token could be signed.
        case unsigned
    }

    private func decideAuthorization() -> BatchAuthorization {
        guard case .token(let signer) = configuration.authentication else { return .certificate }
        return currentAuthorization(signer).map { .bearer($0) } ?? .unsigned
    }

    private func submit(_ request: APNsRequest, now: NIODeadline, batchAuthorization: inout BatchAuthorization?) {
        guard let session, !closed else {
            finish(request, .notAnswered(APNsNotAnswered(.connectionFailed, "the connection closed before the request was written", certainlyNotProcessed: true)))
            return
        }
        if unusable {
            finish(request, .notAnswered(APNsNotAnswered(.goAway, "the connection was going away before the request was written", certainlyNotProcessed: true)))
            return
        }
        if request.deadline <= now {
            finish(request, .notAnswered(APNsNotAnswered(.timeout, "the deadline passed before the request was written", certainlyNotProcessed: true)))
            return
        }
        if request.sendBy <= now {
            finish(request, .notAnswered(APNsRequest.tooLate("before it was written")))
            return
        }
        // Fields are read in place: a copy of the notification would retain and release each.
        requestHeaders.removeAll()
        requestHeaders.append(":method", "POST")
        requestHeaders.append(":scheme", "https")
        requestHeaders.append(":path", prefix: "/3/device/", request.notification.deviceToken, neverIndex: true)
        requestHeaders.append(":authority", authority)
        let decided = batchAuthorization ?? decideAuthorization()
        batchAuthorization = decided
        switch decided {
        case .certificate:
            break
        case .bearer(let value):
            requestHeaders.append("authorization", value, neverIndex: true)
        case .unsigned:
            finish(request, .notAnswered(APNsNotAnswered(.connectionFailed, "the provider token could not be signed", certainlyNotProcessed: true)))
            return
        }
        // Unique per notification: indexing it would only evict useful entries (and cost both
        // ends an insertion) on every request.
        if let apnsID = request.notification.apnsID { requestHeaders.append("apns-id", apnsID, neverIndex: true) }
        if let expiration = request.notification.expiration { requestHeaders.append("apns-expiration", decimal: expiration) }
        if let priority = request.notification.priority {
            switch priority {
            case .immediate: requestHeaders.append("apns-priority", "10" as StaticString)
            case .powerConsiderate: requestHeaders.append("apns-priority", "5" as StaticString)
            case .low: requestHeaders.append("apns-priority", "1" as StaticString)
            }
        }
        if let topic = request.notification.topic { requestHeaders.append("apns-topic", topic) }
        if let collapseID = request.notification.collapseID { requestHeaders.append("apns-collapse-id", collapseID) }
        if let pushType = request.notification.pushType { requestHeaders.append("apns-push-type", pushType.rawValue) }

        do {
            // The payload goes into DATA frames straight from the notification's bytes.
            let stream = try session.submitRequest(requestHeaders, body: request.notification.payload.bytes)
            streams.insert(InFlight(request, sentAt: now), for: stream)
            // A connection's 2^30 stream ids last days at full speed; hand over to a new one
            // well before they run out, while this one's streams finish.
            if stream > Self.lastStreamIDToUse, !unusable {
                logger.info("Retiring connection: its stream ids are nearly used up")
                becomeUnusable()
            }
        } catch {
            if error.isStreamIDExhausted {
                // Unusable first, so that the pool sends the request again elsewhere.
                becomeUnusable()
                closeIfDrained()
            }
            finish(request, .notAnswered(APNsNotAnswered(.connectionFailed, "the request could not be submitted: \(error)", certainlyNotProcessed: true)))
        }
    }

    /// Past this stream id a connection takes no more work (a margin of 50,000 requests below
    /// the last one HTTP/2 allows).
    static let lastStreamIDToUse: Int32 = .max - 100_000

    /// The bearer header for now, minting a token when the schedule says so.
    private func currentAuthorization(_ signer: ProviderTokenSigner) -> String? {
        let elapsed = configuration.clock.elapsed()
        switch tokenSchedule.decide(at: elapsed) {
        case .keep:
            if let authorization { return authorization }
            fallthrough
        case .mint:
            do {
                let issuedAt = configuration.clock.now()
                let token = try signer.token(issuedAt: issuedAt)
                tokenSchedule.minted(at: elapsed)
                authorization = "bearer " + token
                metrics.tokensMinted.increment()
                logger.debug("Minted a provider token", metadata: ["apns.token.issued_at": "\(issuedAt)"])
                return authorization
            } catch {
                logger.error("Cannot sign a provider token", metadata: ["apns.error": "\(error)"])
                return nil
            }
        }
    }

    /// Decides a request's outcome; the caller is resumed, and the stream given back to the
    /// pool, by the next `flushCompletions` (at the end of this burst or event-loop task).
    private func finish(_ request: APNsRequest, _ outcome: consuming APNsOutcome, tokenAccepted: Bool = false) {
        completions.append((request, outcome))
        if tokenAccepted { completionsAcceptedToken = true }
        if !completionFlushScheduled {
            // A safety net: every path that finishes requests also flushes, usually sooner.
            completionFlushScheduled = true
            eventLoop.execute { [self] in
                completionFlushScheduled = false
                flushCompletions()
            }
        }
    }

    /// Gives the finished streams back to the pool (one lock for the batch), records metrics,
    /// then resumes the callers.
    private func flushCompletions() {
        burstNow = nil
        guard !completions.isEmpty else { return }
        var batch = spareCompletions
        spareCompletions = []
        swap(&batch, &completions)
        let tokenAccepted = completionsAcceptedToken
        completionsAcceptedToken = false
        events.connection(self, didFinishStreams: batch.count, tokenAccepted: tokenAccepted)
        metrics.record(batch.lazy.map(\.outcome))
        for (request, outcome) in batch {
            switch request.destination {
            case .caller(let continuation): continuation.resume(returning: outcome)
            case .receiver: events.connection(self, didFinish: request, with: outcome)
            }
        }
        batch.removeAll(keepingCapacity: true)
        spareCompletions = batch
    }

    private var now: NIODeadline {
        if let burstNow { return burstNow }
        let now = NIODeadline.now()
        burstNow = now
        return now
    }

    fileprivate func beganHeaders(on stream: Int32) {
        readSinceFlush = true
        commitHeaderBlock()
        headerBlock.begin(stream)
    }

    /// Writes a header block still held here into its stream's entry: before the next block
    /// begins and before DATA is added to an entry. (Paths that drop entries without an answer
    /// need not: a block whose stream is gone is dropped when committed.)
    private func commitHeaderBlock() {
        let stream = headerBlock.stream
        guard stream != 0 else { return }
        headerBlock.stream = 0
        guard let location = streams.location(of: stream) else { return }
        let block = headerBlock
        streams.update(stream, at: location) { block.apply(to: &$0) }
    }

    fileprivate func receivedHeader(_ field: HTTP2HeaderField, on stream: Int32) {
        if stream != headerBlock.stream { beganHeaders(on: stream) }
        switch field.nameCount {
        case 7 where field.nameEquals(":status"):
            headerBlock.status = field.withValueBytes { bytes in
                var value = 0
                for byte in bytes {
                    guard byte >= 0x30, byte <= 0x39 else { return 0 }
                    value = value * 10 + Int(byte - 0x30)
                }
                return value
            }
        case 7 where field.nameEquals("apns-id"):
            headerBlock.apnsID.removeAll(keepingCapacity: true)
            field.withValueBytes { headerBlock.apnsID.append(contentsOf: $0) }
            headerBlock.hasAPNsID = true
        case 14 where field.nameEquals("apns-unique-id"):
            headerBlock.apnsUniqueID = field.value
        default:
            break
        }
    }

    fileprivate func receivedData(_ chunk: HTTP2DataChunk, on stream: Int32) {
        readSinceFlush = true
        commitHeaderBlock()
        guard let location = streams.location(of: stream), let channel else { return }
        streams.update(stream, at: location) { inFlight in
            // APNs error bodies are tiny JSON objects; anything beyond 8 KB is not kept.
            var body = inFlight.body ?? channel.allocator.buffer(capacity: max(64, min(chunk.count, 8192)))
            guard body.readableBytes + chunk.count <= 8192 else { return }
            chunk.append(to: &body)
            inFlight.body = body
        }
    }

    fileprivate func receivedEndStream(on stream: Int32) {
        readSinceFlush = true
        guard var inFlight = streams.removeValue(forKey: stream) else {
            if headerBlock.stream == stream { headerBlock.stream = 0 }
            return
        }
        takeHeaderBlock(of: stream, into: &inFlight)
        var reason: APNsReason?
        var timestamp: Int64?
        if let body = inFlight.body, body.readableBytes > 0 {
            (reason, timestamp) = Self.parseBody(body)
        }
        // The entry ends here: its strings move into the response instead of being copied.
        let response = APNsResponse(
            status: inFlight.status,
            reason: reason,
            apnsID: inFlight.apnsID.take(),
            apnsUniqueID: inFlight.apnsUniqueID.take(),
            timestamp: timestamp,
            latency: Self.duration(from: inFlight.sentAt, to: now)
        )
        let tokenAccepted = StreamBudget.provesTokenValid(status: response.status, reason: reason)
        if response.status == 200, !hadSuccess {
            hadSuccess = true
            successSeen.store(true, ordering: .relaxed)
        }
        if let reason, reason.known?.refreshesProviderToken == true, configuration.authentication.isToken {
            events.connection(self, didRejectProviderToken: reason)
        }
        if response.status == 403, let reason, Self.credentialReasons.contains(reason) {
            credentialRejectionsInARow += 1
            // Every tenth: an answer elsewhere that clears the error (a 410 proves the
            // credentials too) must not silence this connection for good.
            if credentialRejectionsInARow.isMultiple(of: Self.credentialRejectionsToReport) {
                events.connection(self, didRejectCredentials: reason, inARow: credentialRejectionsInARow)
            }
        } else if tokenAccepted, credentialRejectionsInARow != 0 {
            credentialRejectionsInARow = 0
        }
        finish(inFlight.request, .answered(response), tokenAccepted: tokenAccepted)
        unanswered = nil
        lastAnswerAt = now
        retireIfFailingFast(status: response.status, reason: reason)
        closeIfDrained()
    }

    /// A connection answered with at once keeps the most free streams, so the pool would hand
    /// it nearly every request (and every retry of them) while healthy connections wait on
    /// APNs. Retired, it is replaced after the slot's backoff, which grows while replacements
    /// fail the same way:
    /// - 503 Shutdown: the server is going away;
    /// - 429 TooManyProviderTokenUpdates: APNs may refuse this connection for a while;
    /// - `serverErrorsToRetire` 5xx answers in a row with no other answer between: a sick
    ///   front end (an occasional 500 among successes does not count).
    /// 403 reasons that say the credentials, not the job, are wrong; each ends its job as
    /// `rejected` (the result contract), so a pool answered only with them reports a
    /// configuration error, which readiness shows, after this many in a row on one connection.
    static let credentialReasons: Set<APNsReason> = [.badCertificate, .badCertificateEnvironment, .forbidden, .missingProviderToken]
    static let credentialRejectionsToReport = 10

    private func retireIfFailingFast(status: Int, reason: APNsReason?) {
        if status >= 500 {
            serverErrorsInARow += 1
        } else {
            serverErrorsInARow = 0
        }
        guard !unusable else { return }
        if reason == .shutdown {
            logger.info("APNs answered 503 Shutdown; retiring the connection")
        } else if reason == .tooManyProviderTokenUpdates {
            logger.warning("APNs answered 429 TooManyProviderTokenUpdates; retiring the connection")
        } else if serverErrorsInARow >= Self.serverErrorsToRetire {
            logger.warning("APNs answered only server errors; retiring the connection", metadata: [
                "apns.status": "\(status)", "apns.reason": "\(reason?.rawValue ?? "none")", "apns.errors_in_a_row": "\(serverErrorsInARow)",
            ])
        } else {
            return
        }
        metrics.connectionEvent("retired")
        becomeUnusable()
    }

    /// See `retireIfFailingFast`: enough that a burst of errors among successes never counts.
    static let serverErrorsToRetire = 100

    /// A connection whose sent requests time out, `timeoutsToRetire` in a row with no answer
    /// for `pingTimeout` while they waited, is stuck even if it answers PING (a front end alive,
    /// its streams not served): as its timed-out streams leave it with the most free ones, the
    /// pool would keep feeding it, and each request would end as a timeout APNs may have
    /// processed. Retired, it finishes what it has and a replacement connects. The quiet time
    /// (counted from the later of the last answer and the first timed-out request's send, so
    /// that idle time does not count) keeps a latency spike just past a short request timeout
    /// from retiring every busy connection at once.
    private func retireIfUnanswering(timedOut: Int, earliestSentAt: NIODeadline?, now: NIODeadline) {
        guard let earliestSentAt else { return }
        let since = max(lastAnswerAt, earliestSentAt)
        var run = unanswered ?? UnansweredRun(timeouts: 0, since: since)
        run.timeouts += timedOut
        run.since = min(run.since, since)
        unanswered = run
        guard !unusable, run.timeouts >= Self.timeoutsToRetire, now - run.since >= TimeAmount(configuration.pingTimeout) else { return }
        logger.warning("APNs answered none of the connection's recent requests; retiring the connection", metadata: [
            "apns.timeouts_in_a_row": "\(run.timeouts)", "apns.seconds_unanswered": "\((now - run.since).nanoseconds / 1_000_000_000)",
        ])
        metrics.connectionEvent("retired")
        becomeUnusable()
    }

    static let timeoutsToRetire = 20

    static func parseBody(_ body: ByteBuffer) -> (APNsReason?, Int64?) {
        guard let value = try? JSONParser.parse(Array(body.readableBytesView)) else { return (nil, nil) }
        let reason = value["reason"]?.string.map { APNsReason(rawValue: $0) }
        // Int64(exactly:) rather than Int64(_:), which traps on 1e19 or infinity from the server.
        let timestamp = value["timestamp"]?.int64 ?? value["timestamp"]?.double.flatMap { Int64(exactly: $0.rounded(.towardZero)) }
        return (reason, timestamp)
    }

    /// Moves the header block still held here into `inFlight`, if it is `stream`'s.
    private func takeHeaderBlock(of stream: Int32, into inFlight: inout InFlight) {
        guard headerBlock.stream == stream else { return }
        headerBlock.apply(to: &inFlight)
        headerBlock.stream = 0
    }

    /// Finishes a stream whose answer did not end: with `otherwise`, unless the answer's final
    /// HEADERS came before the cut (a reset, a lost connection, the deadline). Their status
    /// proves APNs took the request: a 200 was delivered, so it is answered (sending it again
    /// could show it twice); any other status was not delivered, so it is certainly not
    /// processed, and the retry, with backoff, gets the reason the cut body held. A 1xx is no
    /// final answer.
    private func finishCut(_ stream: Int32, _ inFlight: inout InFlight, otherwise: APNsNotAnswered) {
        takeHeaderBlock(of: stream, into: &inFlight)
        if inFlight.status >= 200 {
            // An answer, if a cut one: the connection is not unanswering.
            unanswered = nil
            lastAnswerAt = now
        }
        switch inFlight.status {
        case 200:
            if !hadSuccess {
                hadSuccess = true
                successSeen.store(true, ordering: .relaxed)
            }
            let response = APNsResponse(
                status: 200, apnsID: inFlight.apnsID.take(), apnsUniqueID: inFlight.apnsUniqueID.take(),
                latency: Self.duration(from: inFlight.sentAt, to: now)
            )
            finish(inFlight.request, .answered(response), tokenAccepted: StreamBudget.provesTokenValid(status: 200, reason: nil))
        case let status where status > 200:
            finish(inFlight.request, .notAnswered(APNsNotAnswered(.cutShort, "APNs answered \(status), then \(otherwise.description)", certainlyNotProcessed: true)))
        default:
            finish(inFlight.request, .notAnswered(otherwise))
        }
    }

    fileprivate func streamClosed(_ stream: Int32, errorCode: HTTP2ErrorCode) {
        // Answered streams already left the table: a miss is the common case.
        guard !streams.isEmpty, var inFlight = streams.removeValue(forKey: stream) else { return }
        let outcome: APNsNotAnswered
        if errorCode == .refusedStream {
            if let last = goAwayLastStreamID, stream > last {
                outcome = APNsNotAnswered(.goAway, "stream \(stream) above the GOAWAY's last stream \(last)", certainlyNotProcessed: true)
            } else {
                outcome = APNsNotAnswered(.refusedStream, "the server refused stream \(stream)", certainlyNotProcessed: true)
            }
        } else {
            outcome = APNsNotAnswered(.connectionFailed, "stream \(stream) closed without an answer (\(errorCode))", certainlyNotProcessed: false)
        }
        finishCut(stream, &inFlight, otherwise: outcome)
        closeIfDrained()
    }

    fileprivate func receivedGoAway(_ goAway: HTTP2GoAway) {
        goAwayLastStreamID = goAway.lastStreamID
        let reason = goAway.opaqueData.isEmpty ? nil : Self.parseBody(ByteBuffer(bytes: goAway.opaqueData)).0
        logger.notice("APNs sent GOAWAY", metadata: [
            "apns.goaway.reason": "\(reason?.rawValue ?? String(decoding: goAway.opaqueData.prefix(200), as: UTF8.self))",
            "apns.goaway.error_code": "\(goAway.errorCode)",
            "apns.goaway.last_stream_id": "\(goAway.lastStreamID)",
            "apns.in_flight": "\(streams.count)",
        ])
        metrics.connectionEvent("goaway")
        // The pool stops choosing this connection before any caller hears back, so that the
        // retries below go elsewhere.
        becomeUnusable()
        // Streams above the last one APNs will process are answered now (exactly once: they
        // leave `streams` here, so their later close is ignored) and retried elsewhere.
        for stream in streams.sortedKeys where stream > goAway.lastStreamID {
            if let inFlight = streams.removeValue(forKey: stream) {
                finish(inFlight.request, .notAnswered(APNsNotAnswered(.goAway, "stream \(stream) above the GOAWAY's last stream \(goAway.lastStreamID) (\(reason?.rawValue ?? "no reason"))", certainlyNotProcessed: true)))
            }
        }
        closeIfDrained()
    }

    fileprivate func receivedSettings(_ settings: [HTTP2Setting]) {
        let limit = settings.last { $0.identifier == .maxConcurrentStreams }?.value
        // SETTINGS that come while the connection closes after its connect timeout (a TLS close
        // waits for the peer) must not make it usable: the pool has given up on it.
        guard !connectTimedOut else { return }
        if !ready {
            ready = true
            metrics.connectionEvent("ready")
            logger.debug("Connection ready", metadata: ["apns.max_concurrent_streams": "\(limit.map(String.init) ?? "unlimited")"])
            events.connectionBecameReady(self, maxConcurrentStreams: limit)
            readyPromise.succeed()
        } else if let limit {
            events.connection(self, didChangeMaxConcurrentStreams: limit)
        }
    }

    fileprivate func receivedPingAck() {
        pingSentAt = nil
    }

    fileprivate func markRead() {
        readSinceFlush = true
    }

    /// Once per burst, before its output is written.
    fileprivate func willFlush() {
        if readSinceFlush {
            readSinceFlush = false
            lastRead = now
        }
        flushCompletions()
    }

    /// Stops taking work: the pool will open a replacement; this one closes once idle.
    func retire(reason: String) {
        eventLoop.execute { [self] in
            guard !unusable else { return }
            logger.info("Retiring connection", metadata: ["apns.reason": "\(reason)"])
            becomeUnusable()
            closeIfDrained()
        }
    }

    /// Drains for shutdown: no new work; closes when idle or at `deadline`.
    func drain(until deadline: NIODeadline) {
        eventLoop.execute { [self] in
            drainDeadline = deadline
            becomeUnusable()
            closeIfDrained()
            sweepSoon()
        }
    }

    private func becomeUnusable() {
        guard !unusable else { return }
        unusable = true
        events.connectionBecameUnusable(self)
        unusablePromise.succeed()
    }

    private func closeIfDrained() {
        guard unusable, streams.isEmpty, !closed else { return }
        let now = NIODeadline.now()
        let pastDrainDeadline = drainDeadline.map { now >= $0 } ?? false
        if terminatedAt == nil, !pastDrainDeadline, channel?.isWritable == true, let session,
            (try? session.terminate(errorCode: .noError)) != nil
        {
            // The GOAWAY goes out first (now, or at the end of the read burst this runs in),
            // then the driver closes the connection.
            terminatedAt = now
            session.flush()
            sweepSoon()
            return
        }
        // Without a session, past the drain deadline, or with a peer that does not read (the
        // GOAWAY still not out after a second; the sweep calls this again), close now.
        if let terminatedAt, now - terminatedAt < .seconds(1), !pastDrainDeadline { return }
        channel?.close(promise: nil)
    }

    private func handleClose() {
        guard !closed else { return }
        closed = true
        sweepTask?.cancel()
        readyPromise.fail(APNsClientError(.connect, "the connection closed before HTTP/2 was ready"))
        becomeUnusable()
        let lost = streams.removeAll()
        for (stream, var inFlight) in lost {
            // Certain when above a GOAWAY's last stream, or when its HEADERS never left nghttp2's
            // queue (the peer stopped reading, or its stream limit fell): another connection
            // may then send it again.
            let certain = (goAwayLastStreamID.map { stream > $0 } ?? false) || !(session?.hasSentHeaders(on: stream) ?? true)
            let why = APNsNotAnswered(.connectionFailed, "the connection closed before the answer", certainlyNotProcessed: certain)
            finishCut(stream, &inFlight, otherwise: why)
        }
        // Breaks the connection <-> session cycle.
        session?.delegate = nil
        metrics.connectionEvent("closed")
        logger.debug("Connection closed", metadata: ["apns.lost_streams": "\(lost.count)"])
        events.connectionDidClose(self)
        finishClosed()
        // Requests that arrived after the close are failed by the drain.
        drainPending()
        flushCompletions()
    }

    private func finishClosed() {
        closed = true
        unusablePromise.succeed()
        closedPromise.succeed()
    }

    // MARK: Deadlines and PING

    /// While streams are open or the connection is closing, deadlines are checked every
    /// `deadlineCheckInterval`. An idle connection has only its PING to look after, so its next
    /// sweep waits until that is due, at most a second: idle connections used to wake the event
    /// loop 50 times a second each. Work arriving brings the sweep forward (`sweepSoon`).
    private func scheduleSweep() {
        let fast = TimeAmount(configuration.deadlineCheckInterval)
        var delay = fast
        sweepIsIdle = streams.isEmpty && drainDeadline == nil && terminatedAt == nil
        if sweepIsIdle {
            let pingDue = pingSentAt.map { $0 + TimeAmount(configuration.pingTimeout) } ?? lastRead + TimeAmount(configuration.pingInterval)
            delay = min(max(pingDue - .now(), fast), .seconds(1))
        }
        sweepGeneration &+= 1
        let generation = sweepGeneration
        sweepTask = eventLoop.scheduleTask(in: delay) { [self] in
            guard generation == sweepGeneration else { return }
            sweep()
            // `sweep` may have scheduled the next one already (through `sweepSoon`).
            if !closed, generation == sweepGeneration { scheduleSweep() }
        }
    }

    /// Brings an idle connection's next sweep forward to the deadline pace.
    private func sweepSoon() {
        guard sweepIsIdle, !closed, session != nil else { return }
        sweepTask?.cancel()
        scheduleSweep()
    }

    private func sweep() {
        guard let session, !closed else { return }
        let now = NIODeadline.now()
        var wrote = false
        var sentRequestsTimedOut = 0
        var earliestTimedOutSend: NIODeadline?
        if !streams.isEmpty {
            var expired: [Int32] = []
            var unsentPastSendBy: [Int32] = []
            streams.forEach { stream, inFlight in
                if inFlight.request.deadline <= now {
                    expired.append(stream)
                } else if inFlight.request.sendBy <= now {
                    unsentPastSendBy.append(stream)
                }
            }
            for stream in expired.sorted() {
                guard var inFlight = streams.removeValue(forKey: stream) else { continue }
                let unsent = !session.hasSentHeaders(on: stream)
                // A stream whose answer began proves the path alive: not a timeout for PING and retiring.
                takeHeaderBlock(of: stream, into: &inFlight)
                if !unsent, inFlight.status == 0 {
                    sentRequestsTimedOut += 1
                    earliestTimedOutSend = min(earliestTimedOutSend ?? inFlight.sentAt, inFlight.sentAt)
                }
                try? session.submitResetStream(stream, errorCode: .cancel)
                wrote = true
                let why = APNsNotAnswered(.timeout, "no answer before the deadline; stream \(stream) cancelled", certainlyNotProcessed: unsent)
                finishCut(stream, &inFlight, otherwise: why)
            }
            // Handed to the session in time, but its HEADERS still queued there (the peer not
            // reading, or its stream limit lowered): cancelled before they go out late.
            for stream in unsentPastSendBy.sorted() where !session.hasSentHeaders(on: stream) {
                guard let inFlight = streams.removeValue(forKey: stream) else { continue }
                try? session.submitResetStream(stream, errorCode: .cancel)
                wrote = true
                finish(inFlight.request, .notAnswered(APNsRequest.tooLate("while its HEADERS waited to be written")))
            }
        }
        if let drainDeadline, now >= drainDeadline, !streams.isEmpty {
            for (stream, var inFlight) in streams.removeAll() {
                let unsent = !session.hasSentHeaders(on: stream)
                try? session.submitResetStream(stream, errorCode: .cancel)
                let why = APNsNotAnswered(.shutdown, "the client shut down before the answer", certainlyNotProcessed: unsent)
                finishCut(stream, &inFlight, otherwise: why)
            }
            wrote = true
        }
        if let pingSentAt {
            if now - pingSentAt > TimeAmount(configuration.pingTimeout) {
                logger.warning("PING unanswered: the connection is dead", metadata: ["apns.ping_timeout": "\(configuration.pingTimeout)"])
                metrics.connectionEvent("dead")
                // Answer everything now: a graceful TLS close would wait for a peer that is gone.
                let channel = self.channel
                flushCompletions()
                handleClose()
                channel?.close(promise: nil)
                return
            }
        } else if ready, now - lastRead > TimeAmount(configuration.pingInterval)
            || (sentRequestsTimedOut > 0 && now - lastRead > Self.quietBeforeSuspectPing) {
            // A request that went out and timed out on a connection that has read nothing for a
            // while hints at a dead path (a black hole drops packets without a reset): PING now,
            // rather than after `pingInterval`. Until then the pool keeps handing the dead
            // connection work, as its timed-out streams left it with the most free streams.
            do {
                try session.submitPing(opaqueData: UInt64(truncatingIfNeeded: now.uptimeNanoseconds))
                pingSentAt = now
                wrote = true
            } catch {
                channel?.close(promise: nil)
                return
            }
        }
        retireIfUnanswering(timedOut: sentRequestsTimedOut, earliestSentAt: earliestTimedOutSend, now: now)
        if wrote { session.flush() }
        closeIfDrained()
        flushCompletions()
    }

    /// How long a connection must have read nothing for a timed-out request to bring its PING
    /// forward: a connection still answering other streams is alive, whatever one stream did.
    static let quietBeforeSuspectPing = TimeAmount.seconds(1)

    static func duration(from start: NIODeadline, to end: NIODeadline) -> Duration {
        .nanoseconds(Int64(end.uptimeNanoseconds &- start.uptimeNanoseconds))
    }
}

// The session's delegate. All calls arrive on the connection's event loop.
extension APNsConnection: HTTP2SessionDelegate {
    func http2(_ session: HTTP2Session, didBeginHeadersOn stream: Int32) {
        beganHeaders(on: stream)
    }

    func http2(_ session: HTTP2Session, didReceiveHeader field: HTTP2HeaderField, on stream: Int32) {
        receivedHeader(field, on: stream)
    }

    func http2(_ session: HTTP2Session, didReceiveHeadersOn stream: Int32) {
        markRead()
    }

    func http2(_ session: HTTP2Session, didReceiveData chunk: HTTP2DataChunk, on stream: Int32) {
        receivedData(chunk, on: stream)
    }

    func http2(_ session: HTTP2Session, didReceiveEndStreamOn stream: Int32) {
        receivedEndStream(on: stream)
    }

    func http2(_ session: HTTP2Session, didCloseStream stream: Int32, errorCode: HTTP2ErrorCode) {
        streamClosed(stream, errorCode: errorCode)
    }

    func http2(_ session: HTTP2Session, didReceiveGoAway goAway: HTTP2GoAway) {
        markRead()
        receivedGoAway(goAway)
    }

    func http2(_ session: HTTP2Session, didReceivePingAck opaqueData: UInt64) {
        markRead()
        receivedPingAck()
    }

    func http2(_ session: HTTP2Session, didReceiveSettings settings: [HTTP2Setting]) {
        markRead()
        receivedSettings(settings)
    }

    func http2SessionWillFlush(_ session: HTTP2Session) {
        willFlush()
    }
}

/// Waits for the TLS handshake, insists on ALPN h2, then installs the HTTP/2 session.
private final class HandshakeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let connection: APNsConnection

    init(connection: APNsConnection) {
        self.connection = connection
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tlsEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        guard negotiated == "h2" else {
            connection.handshakeFailed(APNsClientError(.connect, "the server did not negotiate HTTP/2 (ALPN: \(negotiated ?? "none"))"))
            context.close(promise: nil)
            return
        }
        do {
            try connection.installHTTP2(on: context.channel)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        } catch {
            connection.handshakeFailed(error)
            context.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        connection.handshakeFailed(error)
        context.close(promise: nil)
    }
}
