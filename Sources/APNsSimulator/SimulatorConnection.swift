import APNsCore
import APNsHTTP2
import DequeModule
import Foundation
import Logging
import NIOCore
import NIOSSL

/// What every connection of one simulator shares.
final class SimulatorContext: Sendable {
    let configuration: APNsSimulatorConfiguration
    let validator = RequestValidator()
    let verifier: ProviderTokenVerifier
    let counters: SimulatorCounters
    let rateLimiter: DeviceRateLimiter?
    let registry = ConnectionRegistry()
    /// Faults switched on and off at run time (admin `POST /faults`).
    let faults = RuntimeFaults()
    /// The configured values that runtime faults can override (read on every request; copying
    /// the whole behaviour would retain each of its collections).
    let configuredRates: EffectiveBehaviour
    /// Whether any per-token behaviour is configured (only then is the token lowercased and looked up).
    let hasTokenBehaviour: Bool
    let logger: Logger

    init(configuration: APNsSimulatorConfiguration, counters: SimulatorCounters, logger: Logger) {
        self.configuration = configuration
        self.counters = counters
        self.logger = logger
        self.verifier = ProviderTokenVerifier(keys: configuration.authentication.tokenKeys, maximumAge: configuration.authentication.maximumTokenAge)
        let behaviour = configuration.behaviour
        self.configuredRates = EffectiveBehaviour(behaviour)
        self.rateLimiter = behaviour.perDeviceLimit.map { DeviceRateLimiter(limit: $0, window: behaviour.perDeviceWindow) }
        self.hasTokenBehaviour = !behaviour.unregisteredTokens.isEmpty || !behaviour.deviceTopics.isEmpty || behaviour.perDeviceLimit != nil
    }
}

/// The open HTTP/2 connections by number, so that GOAWAY can be sent to all of them (on demand,
/// or at stop).
typealias ConnectionRegistry = ConnectionSet<UInt64, ConnectionHandle>

struct ConnectionHandle: Sendable {
    let channel: any Channel
    let goAway: @Sendable (String) -> Void
    /// Closes the TCP connection with a reset (RST), below TLS: no close_notify, no GOAWAY.
    let reset: @Sendable () -> Void
    /// Closes the connection cleanly: TLS close_notify (on TLS connections), then FIN; no GOAWAY.
    let closeNotify: @Sendable () -> Void
}

/// How a connection authenticates its requests.
enum ConnectionAuthentication {
    case token(TokenAuthenticator)
    /// The topics the client certificate grants, or why its requests are all refused (a
    /// certificate whose topics cannot be read: 403 BadCertificate).
    case certificate(Result<TopicGrant, APNsRejection>)

    var name: String {
        switch self {
        case .token: "token"
        case .certificate: "certificate"
        }
    }
}

/// One HTTP/2 connection of the provider API: collects each stream's headers and body,
/// judges the request and answers. Lives on the channel's event loop.
///
/// Its state is only touched on that loop, and never by two overlapping accesses, so the hot
/// properties are `@exclusivity(unchecked)`: the runtime's checks cost 7% of the CPU per request.
final class SimulatorConnection: HTTP2SessionDelegate {
    /// The request headers the provider API reads, as bit positions for duplicate detection.
    private enum Field: Int {
        case method, path, authorization, apnsID, expiration, priority, topic, collapseID, pushType
    }

    private struct StreamState {
        var head = APNsRequestHead()
        var seen: UInt16 = 0
        /// Body bytes received; the bytes themselves are kept only for `--dump`.
        var bodyCount = 0
        var body: ByteBuffer?
        var dumpHeaders: [(String, String)] = []
        /// The header list's size as RFC 9113 counts it (name + value + 32 per field).
        var headerListBytes = 0

        /// Keeps body bytes for `--dump`; payloads above the largest limit are only counted.
        mutating func keep(_ chunk: HTTP2DataChunk, allocator: ByteBufferAllocator) {
            if body == nil { body = allocator.buffer(capacity: chunk.count) }
            if let kept = body?.readableBytes, kept <= 5120 + 16384 { body?.writeChunk(chunk) }
        }
    }

    private let context: SimulatorContext
    private let channel: any Channel
    let id: UInt64
    private let transport: String
    /// Strong, and dropped when the connection closes: weak references make every retain of
    /// the objects involved take a slow path, which shows at 100k requests per second.
    @exclusivity(unchecked) var session: HTTP2Session?
    /// Token auth state, mutated in place on every request (nil for certificate auth).
    @exclusivity(unchecked) private var tokenAuthenticator: TokenAuthenticator?
    private let certificateGrant: Result<TopicGrant, APNsRejection>?
    @exclusivity(unchecked) private var streams: HTTP2StreamTable<StreamState>
    /// The request whose header block is arriving (header blocks never interleave).
    @exclusivity(unchecked) private var current = StreamState()
    @exclusivity(unchecked) private var currentStream: Int32 = 0
    /// The last `:path` and `authorization` values, reused when the next request repeats
    /// them byte for byte (the common case), so that no String is made for them.
    @exclusivity(unchecked) private var lastPath = HeaderValueCache()
    @exclusivity(unchecked) private var lastAuthorization = HeaderValueCache()
    @exclusivity(unchecked) private var lastGrant: (team: String, grant: TopicGrant)?
    /// Unix seconds, read once per read burst (requests of one burst arrived together).
    @exclusivity(unchecked) private var clockSeconds: Int64?
    /// Response header fields, refilled for every answer.
    @exclusivity(unchecked) private var responseHeaders = HTTP2HeaderBlock(byteCapacity: 128, fieldCapacity: 4)
    /// Counts gathered during a read burst, published under the counters' lock once per burst.
    @exclusivity(unchecked) private var pending = PendingCounts()
    @exclusivity(unchecked) private var answered = 0
    @exclusivity(unchecked) private var goingAway = false
    @exclusivity(unchecked) private var advertisedMaxStreams: UInt32
    @exclusivity(unchecked) private var lastActivity = NIODeadline.now()
    /// Error-rate and jitter draws: seeded per connection from `random_seed` when it is set, so
    /// that runs repeat while connections still draw differently.
    @exclusivity(unchecked) private var random: SplitMix64
    /// `apns-id` and `apns-unique-id` values: never seeded, so ids stay unique across
    /// connections, simulators and runs whatever the seed (results carry them).
    @exclusivity(unchecked) private var identifiers = SplitMix64(seed: UInt64.random(in: .min ... .max))
    private var flushScheduled = false
    /// Answers waiting out the configured latency, in due order, served by one timer: a timer
    /// per request cost the simulator more than making the answer.
    @exclusivity(unchecked) private var delayed = Deque<DelayedAnswer>()
    @exclusivity(unchecked) private var delayTimerArmed = false
    @exclusivity(unchecked) private var closed = false
    @exclusivity(unchecked) private var tokenVerificationsCounted = 0
    @exclusivity(unchecked) private var tokenAccepted = false

    init(context: SimulatorContext, channel: any Channel, transport: String, authentication: ConnectionAuthentication) {
        self.context = context
        self.channel = channel
        self.transport = transport
        switch authentication {
        case .token(let authenticator):
            self.tokenAuthenticator = authenticator
            self.certificateGrant = nil
        case .certificate(let grant):
            self.tokenAuthenticator = nil
            self.certificateGrant = grant
        }
        let id = context.counters.openConnection(
            transport: transport,
            authentication: authentication.name,
            remoteAddress: channel.remoteAddress?.description ?? "?"
        )
        self.id = id
        // The connection's number mixed in: every connection of a seeded run would otherwise
        // fail exactly the same requests. Through one draw, so that connections do not get
        // shifted copies of one stream (SplitMix64 steps by a constant).
        self.random = SplitMix64(seed: context.configuration.behaviour.randomSeed.map { seed in
            var mixer = SplitMix64(seed: seed &+ id)
            return mixer.next()
        } ?? UInt64.random(in: .min ... .max))
        self.advertisedMaxStreams = context.configuration.behaviour.maxConcurrentStreams
        // Streams beyond the table (more than 512 open at once) go to its overflow dictionary.
        self.streams = HTTP2StreamTable(minimumCapacity: Int(min(context.configuration.behaviour.maxConcurrentStreams, 512)))
        if case .token = authentication, context.configuration.authentication.singleStreamUntilAuthenticated {
            advertisedMaxStreams = 1
        }
    }

    /// The SETTINGS sent with the connection preface (APNs's usual values).
    var initialSettings: [HTTP2Setting] {
        [
            .maxConcurrentStreams(advertisedMaxStreams),
            HTTP2Setting(.headerTableSize, 4096),
            HTTP2Setting(.maxHeaderListSize, UInt32(RequestValidator.maximumHeaderListSize)),
        ]
    }

    /// Registers the connection and starts its idle timer; call once the handler is in the pipeline.
    func activate() {
        let loopBound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        let eventLoop = channel.eventLoop
        let channel = self.channel
        let registered = context.registry.add(id, ConnectionHandle(
            channel: channel,
            goAway: { reason in eventLoop.execute { loopBound.value.goAway(reason: reason) } },
            reset: { eventLoop.execute { Self.reset(channel) } },
            closeNotify: { channel.close(promise: nil) }
        ))
        guard registered else {
            channel.close(promise: nil)
            return
        }
        scheduleIdleCheck()
    }

    // MARK: HTTP2SessionDelegate

    func http2(_ session: HTTP2Session, didBeginHeadersOn stream: Int32) {
        current = StreamState()
        currentStream = stream
    }

    func http2(_ session: HTTP2Session, didReceiveHeadersOn stream: Int32) {
        // Trailers (a second header block) are ignored.
        guard stream == currentStream else { return }
        // Moved out rather than copied (a copy retains every header String).
        var state = StreamState()
        swap(&state, &current)
        streams.insert(state, for: stream)
        currentStream = 0
    }

    func http2(_ session: HTTP2Session, didReceiveHeader field: HTTP2HeaderField, on stream: Int32) {
        let kind: Field?
        switch field.nameCount {
        case 5: kind = field.nameEquals(":path") ? .path : nil
        case 7: kind = field.nameEquals(":method") ? .method : (field.nameEquals("apns-id") ? .apnsID : nil)
        case 10: kind = field.nameEquals("apns-topic") ? .topic : nil
        // With a certificate, authorization "is ignored" (Table 8-2): not even checked for repeats.
        case 13: kind = field.nameEquals("authorization") ? (tokenAuthenticator == nil ? nil : .authorization) : (field.nameEquals("apns-priority") ? .priority : nil)
        case 14: kind = field.nameEquals("apns-push-type") ? .pushType : nil
        case 15: kind = field.nameEquals("apns-expiration") ? .expiration : nil
        case 16: kind = field.nameEquals("apns-collapse-id") ? .collapseID : nil
        default: kind = nil
        }
        guard stream == currentStream else { return }
        // Over the advertised limit nothing more is kept (a peer ignoring it could otherwise
        // make each stream hold megabytes of headers); the request is answered 431.
        current.headerListBytes += field.nameCount + field.valueCount + 32
        if current.headerListBytes > RequestValidator.maximumHeaderListSize {
            current.head.headerListTooLarge = true
            return
        }
        if context.configuration.dump { current.dumpHeaders.append((field.name, field.value)) }
        guard let kind else { return }
        let bit: UInt16 = 1 << UInt16(kind.rawValue)
        if current.seen & bit != 0 {
            if current.head.duplicateHeader == nil { current.head.duplicateHeader = field.name }
            return
        }
        current.seen |= bit
        switch kind {
        case .method: current.head.method = field.value
        case .path: current.head.path = lastPath.value(for: field)
        case .authorization: current.head.authorization = lastAuthorization.value(for: field)
        case .apnsID: current.head.apnsID = field.value
        case .expiration: current.head.expiration = field.value
        case .priority: current.head.priority = field.value
        case .topic: current.head.topic = field.value
        case .collapseID: current.head.collapseID = field.value
        case .pushType: current.head.pushType = field.value
        }
    }

    func http2(_ session: HTTP2Session, didReceiveData chunk: HTTP2DataChunk, on stream: Int32) {
        guard let location = streams.location(of: stream) else { return }
        let dump = context.configuration.dump
        let allocator = channel.allocator
        streams.update(stream, at: location) { state in
            state.bodyCount += chunk.count
            if dump { state.keep(chunk, allocator: allocator) }
        }
    }

    func http2(_ session: HTTP2Session, didReceiveEndStreamOn stream: Int32) {
        guard let state = streams.removeValue(forKey: stream) else { return }
        handleRequest(stream: stream, state: state, session: session)
    }

    func http2(_ session: HTTP2Session, didCloseStream stream: Int32, errorCode: HTTP2ErrorCode) {
        if streams.removeValue(forKey: stream) != nil || errorCode != .noError {
            pending.streamsReset += 1
        }
    }

    func http2(_ session: HTTP2Session, didSendResetStream stream: Int32, errorCode: HTTP2ErrorCode) {
        if errorCode == .refusedStream { pending.streamsRefused += 1 }
    }

    /// The simulator's own GOAWAYs are counted where they are submitted (`goAway(reason:)`, always
    /// NO_ERROR). One with an error is libnghttp2's: the client broke the protocol (more streams
    /// than an acknowledged SETTINGS allows, say) and the connection ends; counted and said, so
    /// that a client test sees why its connection went.
    func http2(_ session: HTTP2Session, didSendGoAway goAway: HTTP2GoAway) {
        guard goAway.errorCode != .noError else { return }
        context.counters.update(id) { $0.goAwaysSent += 1 }
        let detail = String(decoding: goAway.opaqueData.prefix(200), as: UTF8.self)
        context.logger.warning("connection ended by the HTTP/2 library: the client broke the protocol", metadata: [
            "connection": "\(id)", "http2.error": "\(goAway.errorCode)", "http2.last_stream": "\(goAway.lastStreamID)", "http2.detail": "\(detail)",
        ])
        if context.configuration.dump { context.configuration.dumpSink("<<< connection #\(id): GOAWAY \(goAway.errorCode) \(detail)") }
    }

    func http2SessionWillFlush(_ session: HTTP2Session) {
        clockSeconds = nil
        // Requests arrived since the last flush (the idle timer reads this).
        if pending.requests > 0 { lastActivity = .now() }
        if !pending.isEmpty {
            context.counters.publish(id, &pending)
        }
    }

    func http2SessionDidClose(_ session: HTTP2Session) {
        closed = true
        _ = streams.removeAll()
        if !pending.isEmpty { context.counters.publish(id, &pending) }
        // Breaks the connection <-> session reference cycle.
        session.delegate = nil
        self.session = nil
        context.registry.remove(id)
        context.counters.closeConnection(id)
    }

    // MARK: Requests

    private func handleRequest(stream: Int32, state: StreamState, session: HTTP2Session) {
        pending.requests += 1
        let behaviour = context.faults.effective(context.configuredRates)
        let rejection = judge(state, behaviour: behaviour)
        let apnsID = state.head.apnsID.map(ResponseID.echoed) ?? .generated(RandomUUID(using: &identifiers))
        if context.configuration.dump { dump(stream: stream, state: state, rejection: rejection) }
        if behaviour.latency > .zero || behaviour.latencyJitter > .zero {
            var delay = behaviour.latency
            if behaviour.latencyJitter > .zero { delay += behaviour.latencyJitter * random.nextUnit() }
            let due = NIODeadline.now() + TimeAmount(delay)
            if let last = delayed.last, due < last.due {
                // Out of order (jitter, or the latency lowered while running): a timer of its own,
                // which holds the connection until it runs; a closed connection ignores it.
                channel.eventLoop.assumeIsolated().scheduleTask(deadline: due) {
                    guard !self.closed else { return }
                    self.answer(stream: stream, rejection: rejection, apnsID: apnsID, behaviour: behaviour)
                    self.scheduleFlush()
                }
            } else {
                delayed.append(DelayedAnswer(due: due, stream: stream, rejection: rejection, apnsID: apnsID, behaviour: behaviour))
                armDelayTimer()
            }
        } else {
            answer(stream: stream, rejection: rejection, apnsID: apnsID, behaviour: behaviour)
        }
    }

    private struct DelayedAnswer {
        let due: NIODeadline
        let stream: Int32
        let rejection: APNsRejection?
        let apnsID: ResponseID
        let behaviour: EffectiveBehaviour
    }

    /// One timer for the oldest delayed answer; when it fires, every answer due goes out.
    private func armDelayTimer() {
        guard !delayTimerArmed, let first = delayed.first else { return }
        delayTimerArmed = true
        channel.eventLoop.assumeIsolated().scheduleTask(deadline: first.due) {
            self.delayTimerArmed = false
            guard !self.closed else { return }
            let now = NIODeadline.now()
            while let next = self.delayed.first, next.due <= now {
                self.delayed.removeFirst()
                self.answer(stream: next.stream, rejection: next.rejection, apnsID: next.apnsID, behaviour: next.behaviour)
            }
            self.scheduleFlush()
            self.armDelayTimer()
        }
    }

    /// The `apns-id` of an answer: the request's, or one made up for it (kept as bits, and
    /// written straight into the response headers).
    private enum ResponseID {
        case echoed(String)
        case generated(RandomUUID)

        var text: String {
            switch self {
            case .echoed(let text): text
            case .generated(let uuid): uuid.text
            }
        }
    }

    /// Checks the request's provider token (nil: the connection has no token authentication);
    /// counts verifications, and a valid token lifts the one-stream limit of a new connection.
    private func authenticateToken(_ head: APNsRequestHead) -> Result<VerifiedProviderToken, APNsRejection>? {
        guard let result = tokenAuthenticator?.authenticate(authorization: head.authorization, now: burstClock()) else { return nil }
        if let verifications = tokenAuthenticator?.verifications, verifications != tokenVerificationsCounted {
            let added = verifications - tokenVerificationsCounted
            tokenVerificationsCounted = verifications
            context.counters.update(id) { $0.tokenVerifications += added }
        }
        if case .success = result, !tokenAccepted {
            tokenAccepted = true
            setMaxConcurrentStreams(context.configuration.behaviour.maxConcurrentStreams)
        }
        return result
    }

    /// Decides the answer: nil for 200.
    private func judge(_ state: StreamState, behaviour rates: EffectiveBehaviour) -> APNsRejection? {
        if goingAway { return APNsRejection(.shutdown) }
        if let rejection = context.validator.checkRoute(state.head) {
            // Answered as a route error, but a valid provider token still lifts the one-stream
            // limit ("until you send a push message with valid provider authentication token"):
            // a first request to a bad device token must not hold the connection at one stream.
            if certificateGrant == nil, !tokenAccepted { _ = authenticateToken(state.head) }
            return rejection
        }

        let grant: TopicGrant
        if let certificateGrant {
            switch certificateGrant {
            case .success(let granted): grant = granted
            case .failure(let rejection): return rejection
            }
        } else {
            guard let result = authenticateToken(state.head) else { return APNsRejection(.missingProviderToken) }
            switch result {
            case .failure(let rejection): return rejection
            case .success(let claims): grant = tokenGrant(team: claims.teamID)
            }
        }

        let accepted: APNsAcceptedRequest
        switch context.validator.checkHeaders(state.head, payloadCount: state.bodyCount, grant: grant) {
        case .failure(let rejection): return rejection
        case .success(let request): accepted = request
        }

        if context.hasTokenBehaviour {
            let behaviour = context.configuration.behaviour
            let token = accepted.deviceToken.lowercased()
            if let bound = behaviour.deviceTopics[token], bound != accepted.topic {
                return APNsRejection(.deviceTokenNotForTopic)
            }
            if let timestamp = behaviour.unregisteredTokens[token] {
                return APNsRejection(.unregistered, timestamp: timestamp)
            }
            if let limiter = context.rateLimiter, !limiter.admit(token) {
                return APNsRejection(.tooManyRequests)
            }
        }
        if rates.internalServerErrorRate > 0 || rates.serviceUnavailableRate > 0 || rates.shutdownRate > 0 {
            let draw = random.nextUnit()
            if draw < rates.internalServerErrorRate { return APNsRejection(.internalServerError) }
            if draw < rates.internalServerErrorRate + rates.serviceUnavailableRate { return APNsRejection(.serviceUnavailable) }
            if draw < rates.internalServerErrorRate + rates.serviceUnavailableRate + rates.shutdownRate { return APNsRejection(.shutdown) }
        }
        return nil
    }

    private func burstClock() -> Int64 {
        if let clockSeconds { return clockSeconds }
        let now = Int64(Date().timeIntervalSince1970)
        clockSeconds = now
        return now
    }

    /// The topics a team's tokens may push to, looked up once per team the connection sees.
    private func tokenGrant(team: String) -> TopicGrant {
        if let last = lastGrant, last.team == team { return last.grant }
        let grant = TopicGrant(topics: context.configuration.authentication.teamTopics[team] ?? [], topicRequired: true)
        lastGrant = (team, grant)
        return grant
    }

    /// `apns-id` is unique per response, so it is sent never indexed: indexing it would only
    /// churn both HPACK dynamic tables.
    private func answer(stream: Int32, rejection: APNsRejection?, apnsID: ResponseID, behaviour: EffectiveBehaviour) {
        guard let session else { return }
        responseHeaders.removeAll()
        responseHeaders.append(":status", SimulatorCounters.statusText(rejection?.status ?? 200))
        if rejection != nil { responseHeaders.append("content-type", "application/json") }
        switch apnsID {
        case .echoed(let text):
            responseHeaders.append("apns-id", text, neverIndex: true)
        case .generated(let uuid):
            responseHeaders.append("apns-id", valueCount: UUIDText.count, neverIndex: true) { uuid.write(into: $0) }
        }
        if rejection == nil, context.configuration.behaviour.development {
            let unique = RandomUUID(using: &identifiers)
            responseHeaders.append("apns-unique-id", valueCount: UUIDText.count, neverIndex: true) { unique.write(into: $0) }
        }
        do {
            if let rejection {
                var body = channel.allocator.buffer(capacity: 64)
                body.writeString("{\"reason\":\"")
                body.writeString(rejection.reason.rawValue)
                if let timestamp = rejection.timestamp {
                    body.writeString("\",\"timestamp\":")
                    body.writeString(String(timestamp))
                    body.writeString("}")
                } else {
                    body.writeString("\"}")
                }
                try session.submitResponse(stream: stream, headers: responseHeaders, body: body)
            } else {
                try session.submitResponse(stream: stream, headers: responseHeaders)
            }
        } catch {
            // The stream was reset before the answer (for example while latency was applied);
            // its close was counted.
            return
        }
        pending.recordAnswer(status: rejection?.status ?? 200, reason: rejection?.reason.rawValue)
        if context.configuration.dump {
            context.configuration.dumpSink("<<< connection #\(id) stream \(stream): \(rejection.map { "\($0.status) \($0.reason)" } ?? "200") apns-id \(apnsID.text)")
        }

        // APNs drops the stream limit to 1 after a rejected notification until one is accepted.
        // The rise does not depend on the behaviour in force: a run-time fault that dropped the
        // limit may have been cleared since.
        if rejection != nil {
            if behaviour.dropToOneStreamAfterRejection { setMaxConcurrentStreams(1) }
        } else if advertisedMaxStreams != context.configuration.behaviour.maxConcurrentStreams {
            setMaxConcurrentStreams(context.configuration.behaviour.maxConcurrentStreams)
        }
        answered += 1
        if let limit = context.configuration.behaviour.goAwayAfterStreams, answered >= limit, !goingAway {
            goAway(reason: context.configuration.behaviour.goAwayReason)
        }
    }

    private func setMaxConcurrentStreams(_ value: UInt32) {
        guard let session, value != advertisedMaxStreams else { return }
        advertisedMaxStreams = value
        try? session.submitSettings([.maxConcurrentStreams(value)])
    }

    // MARK: Connection-level

    /// A TCP reset: SO_LINGER 0, then a close sent below TLS (from the TLS handler's context, so
    /// the close skips it and no close_notify goes out), as when a peer or middlebox drops the
    /// connection. The session learns of it from channelInactive, like any lost connection.
    static func reset(_ channel: any Channel) {
        let close: @Sendable () -> Void = {
            let pipeline = channel.pipeline.syncOperations
            if let below = try? pipeline.context(handlerType: NIOSSLServerHandler.self) {
                below.close(promise: nil)
            } else if let below = try? pipeline.context(handlerType: HTTP2ChannelHandler.self) {
                below.close(promise: nil)
            } else {
                channel.close(promise: nil)
            }
        }
        guard let options = channel as? any SocketOptionProvider else { return close() }
        options.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in close() }
    }

    /// Sends GOAWAY with `{"reason": reason}`; the connection closes when its open streams are done.
    func goAway(reason: String) {
        guard let session, !goingAway, !closed else { return }
        goingAway = true
        let body = Self.goAwayBody(reason: reason)
        do {
            try session.submitGoAway(errorCode: .noError, opaqueData: body)
            context.counters.update(id) { $0.goAwaysSent += 1 }
        } catch {
            session.close()
        }
        if context.configuration.dump { context.configuration.dumpSink("<<< connection #\(id): GOAWAY \(String(decoding: body, as: UTF8.self))") }
        scheduleFlush()
    }

    /// GOAWAY's debug data, `{"reason": …}`, escaped: the library's `goAway(reason:)` takes any text.
    static func goAwayBody(reason: String) -> [UInt8] {
        var writer = JSONWriter(capacity: 32 + reason.utf8.count)
        writer.beginObject()
        writer.field("reason", reason)
        writer.endObject()
        return writer.bytes
    }

    /// Writes pending frames once, after the current event loop task (answers made by timers batch up).
    private func scheduleFlush() {
        guard !flushScheduled else { return }
        flushScheduled = true
        channel.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            self.session?.flush()
        }
    }

    private func scheduleIdleCheck() {
        guard let timeout = context.configuration.behaviour.idleTimeout else { return }
        let amount = TimeAmount(timeout)
        channel.eventLoop.assumeIsolated().scheduleTask(in: max(.milliseconds(10), .nanoseconds(amount.nanoseconds / 4))) {
            guard !self.closed, !self.goingAway else { return }
            if NIODeadline.now() - self.lastActivity >= amount, self.streams.isEmpty {
                self.goAway(reason: APNsReason.idleTimeout.rawValue)
            } else {
                self.scheduleIdleCheck()
            }
        }
    }

    private func dump(stream: Int32, state: StreamState, rejection: APNsRejection?) {
        var lines = [">>> connection #\(id) (\(transport)) stream \(stream)"]
        for (name, value) in state.dumpHeaders {
            let shown = name == "authorization" ? Self.redactAuthorization(value) : value
            lines.append("    \(name): \(shown)")
        }
        if let duplicate = state.head.duplicateHeader { lines.append("    (header \(duplicate) repeated)") }
        let bytes = state.body.map { Array($0.readableBytesView) } ?? []
        lines.append("    payload: \(state.bodyCount) bytes")
        if !bytes.isEmpty {
            lines.append(RequestDump.hexDump(bytes).split(separator: "\n").map { "    " + $0 }.joined(separator: "\n"))
            if let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed]),
               let pretty = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .fragmentsAllowed]) {
                lines.append("    parsed:")
                lines.append(String(decoding: pretty, as: UTF8.self).split(separator: "\n").map { "      " + $0 }.joined(separator: "\n"))
            } else {
                lines.append("    parsed: (not JSON)")
            }
        }
        lines.append("    verdict: \(rejection.map { "\($0.status) \($0.reason)" } ?? "200")")
        context.configuration.dumpSink(lines.joined(separator: "\n"))
    }

    /// The JWT's header and claims are shown; the signature is not.
    static func redactAuthorization(_ value: String) -> String {
        guard let lastDot = value.lastIndex(of: ".") else { return "(\(value.utf8.count) bytes)" }
        return String(value[..<lastDot]) + ".<signature>"
    }
}

extension ByteBuffer {
    fileprivate mutating func writeChunk(_ chunk: HTTP2DataChunk) {
        chunk.append(to: &self)
    }
}

/// The last value of one header, reused while requests repeat it byte for byte.
struct HeaderValueCache {
    private var bytes: [UInt8] = []
    private var text = ""

    mutating func value(for field: HTTP2HeaderField) -> String {
        let same = field.withValueBytes { value in
            guard value.count == bytes.count else { return false }
            return bytes.withUnsafeBytes { cached in
                guard let left = cached.baseAddress, let right = value.baseAddress else { return cached.count == 0 }
                return memcmp(left, right, value.count) == 0
            }
        }
        if !same {
            text = field.value
            bytes = Array(text.utf8)
        }
        return text
    }
}

/// Counts of one connection not yet published to `SimulatorCounters`.
struct PendingCounts {
    struct Answer {
        let status: Int
        let reason: String?
        var count: Int
    }

    var requests = 0
    var streamsReset = 0
    var streamsRefused = 0
    /// Distinct (status, reason) pairs of this burst; a burst rarely has more than a few.
    var answers: [Answer] = []

    var isEmpty: Bool { requests == 0 && streamsReset == 0 && streamsRefused == 0 && answers.isEmpty }

    mutating func recordAnswer(status: Int, reason: String?) {
        for index in answers.indices where answers[index].status == status && answers[index].reason == reason {
            answers[index].count += 1
            return
        }
        answers.append(Answer(status: status, reason: reason, count: 1))
    }

    mutating func reset() {
        requests = 0
        streamsReset = 0
        streamsRefused = 0
        answers.removeAll(keepingCapacity: true)
    }
}
