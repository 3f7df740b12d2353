/// The fields of an unusable job that its `invalid` results still carry (see
/// ``JobDecoder/bestEffortContext(value:headers:)``).
public struct JobContext: Sendable, Hashable {
    public var app: String?
    public var topic: String?
    public var meta: RawJSON?
    /// The envelope's `id`, when it is a valid one.
    public var id: String?
    /// The well-formed tokens of `token` and `tokens`, lowercased, each once, in order.
    public var tokens: [String] = []
    /// Whether `token` or `tokens` held something that is not a device token.
    public var hasUnreadableToken = false
    /// `tokens`, for repeats: a list may run to 100,000 entries.
    private var seenTokens: Set<String> = []

    public init(app: String? = nil, topic: String? = nil, meta: RawJSON? = nil) {
        self.app = app
        self.topic = topic
        self.meta = meta
    }

    mutating func addToken(_ value: JSONValue) {
        // `null` counts as absent, as it does for the decoder.
        if case .null = value { return }
        guard let text = value.string, let token = try? DeviceToken(hex: text) else {
            hasUnreadableToken = true
            return
        }
        if seenTokens.insert(token.hex).inserted { tokens.append(token.hex) }
    }
}

/// Decodes and validates jobs in either encoding.
///
/// Every rejection is a `JobRejection` whose reason names the field and the problem; no input
/// makes it trap. The payload is checked in place and kept as the producer's own bytes.
public struct JobDecoder: Sendable {
    public struct Limits: Sendable, Hashable {
        /// Most tokens one fan-out job may carry. Default: 1000.
        public var maximumTokensPerJob: Int
        /// The most tokens a job can carry within the default record limit (512 KiB holds about
        /// 7,800 tokens of 32 bytes with their quotes and commas, beside a payload): a larger
        /// token limit could never be reached.
        public static let tokensThatFit = 7_500
        /// Largest record value accepted, in bytes, before anything is parsed. Default: 512 KiB.
        public var maximumRecordBytes: Int
        /// Deepest JSON nesting accepted anywhere in a job. Default: 64.
        public var maximumDepth: Int

        public init(maximumTokensPerJob: Int = 1000, maximumRecordBytes: Int = 512 * 1024, maximumDepth: Int = 64) {
            self.maximumTokensPerJob = maximumTokensPerJob
            self.maximumRecordBytes = maximumRecordBytes
            self.maximumDepth = maximumDepth
        }
    }

    /// The record header whose presence selects the header encoding.
    public static let tokenHeader = "apns-token"

    public var limits: Limits

    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    /// Decodes a record: the header encoding when it carries an `apns-token` header, the JSON
    /// envelope otherwise.
    public func decode(value: [UInt8], headers: [RecordHeader] = []) throws(JobRejection) -> NotificationJob {
        if headers.contains(where: { $0.key == Self.tokenHeader }) {
            return try decodeHeaderJob(headers: headers, payload: value)
        }
        return try decodeEnvelope(value)
    }

    // MARK: - Envelope

    public func decodeEnvelope(_ bytes: [UInt8]) throws(JobRejection) -> NotificationJob {
        guard !bytes.isEmpty else {
            throw JobRejection("empty record: expected a JSON job envelope (or an apns-token header with a raw payload)")
        }
        try checkRecordSize(bytes.count)
        var parser = JSONParser(bytes: bytes, maxDepth: limits.maximumDepth)
        var fields = EnvelopeFields()
        do {
            try parser.beginObject()
            // Keys seen so far, to refuse repeats: a bit per key the decoder knows, and a set
            // (made only when needed) for the others.
            var seenKnown: UInt16 = 0
            // By bytes, as RFC 8259 compares names: Strings compare canonically equivalent
            // spellings ("caf\u00e9", "cafe\u0301") equal, and those are different keys.
            var seenOther: Set<[UInt8]> = []
            var first = true
            while let rawKey = try parser.nextRawKey(first: first) {
                first = false
                // Known keys are matched on their bytes: no String per key. A key written with
                // escapes ("to\u006ben") is read as text first, so it still counts as itself.
                let known = rawKey.hasEscapes
                    ? EnvelopeKey(try parser.string(of: rawKey))
                    : EnvelopeKey.all.first { parser.key(rawKey, is: $0.staticName) }
                let repeated: Bool
                if let known {
                    repeated = seenKnown & known.bit != 0
                    seenKnown |= known.bit
                } else {
                    repeated = !seenOther.insert(Array(try parser.string(of: rawKey).utf8)).inserted
                }
                guard !repeated else {
                    let key = try parser.string(of: rawKey)
                    throw EnvelopeError.rejection(JobRejection(field: key, "key \(JobRules.quoted(JobRules.clip(key))) appears more than once"))
                }
                switch known {
                case .payload?, .meta?:
                    // Kept as raw bytes: validated here, never decoded into a tree.
                    let isObject = parser.peekSignificant() == UInt8(ascii: "{")
                    let range = try parser.skipValueReturningRange()
                    if known == .payload {
                        fields.payload = (range, isObject)
                    } else {
                        fields.meta = (range, isObject)
                    }
                case let known?:
                    fields.values[known.rawValue] = try parser.parseValue()
                case nil:
                    // Unknown keys are allowed, but must still be valid JSON.
                    _ = try parser.parseValue()
                }
            }
            try parser.expectEnd()
        } catch let error as JSONSyntaxError {
            throw JobRejection(error.description)
        } catch let error as EnvelopeError {
            switch error { case .rejection(let rejection): throw rejection }
        } catch {
            throw JobRejection("\(error)")
        }
        return try fields.job(bytes: bytes, limits: limits)
    }

    /// The envelope keys the decoder reads. Their values sit in fixed slots (no dictionary per
    /// job); `payload` and `meta` are kept as raw byte ranges instead.
    private enum EnvelopeKey: Int, CaseIterable {
        case id, tokens, token, topic, pushType, priority, expiration, collapseID, environment, app, deadline
        case payload, meta

        init?(_ name: String) {
            guard let key = Self.all.first(where: { $0.name == name }) else { return nil }
            self = key
        }

        var staticName: StaticString {
            switch self {
            case .id: "id"
            case .tokens: "tokens"
            case .token: "token"
            case .topic: "topic"
            case .pushType: "push_type"
            case .priority: "priority"
            case .expiration: "expiration"
            case .collapseID: "collapse_id"
            case .environment: "environment"
            case .app: "app"
            case .deadline: "deadline"
            case .payload: "payload"
            case .meta: "meta"
            }
        }

        var name: String { staticName.description }

        /// Every key, for matching raw key bytes (made once, not per key).
        static let all = allCases

        var bit: UInt16 { 1 << UInt16(rawValue) }
    }

    private enum EnvelopeError: Error { case rejection(JobRejection) }

    private struct EnvelopeFields {
        /// One slot per key whose value is parsed: every `EnvelopeKey` before `payload`.
        var values = InlineArray<11, JSONValue?>(repeating: nil)
        var payload: (Range<Int>, Bool)?
        var meta: (Range<Int>, Bool)?

        /// The value of a key, treating an explicit `null` as absent.
        func value(_ key: EnvelopeKey) -> JSONValue? {
            guard let value = values[key.rawValue], value != .null else { return nil }
            return value
        }

        func string(_ key: EnvelopeKey) throws(JobRejection) -> String? {
            guard let value = value(key) else { return nil }
            guard case .string(let text) = value else {
                throw JobRejection(field: key.name, "\(key.name) must be a string, got \(value.typeName)")
            }
            return text
        }

        func integer(_ key: EnvelopeKey) throws(JobRejection) -> (Int64?, String)? {
            guard let value = value(key) else { return nil }
            guard case .number(let literal) = value else {
                throw JobRejection(field: key.name, "\(key.name) must be an integer, got \(value.typeName)")
            }
            return (Int64(literal), literal)
        }

        func job(bytes: [UInt8], limits: Limits) throws(JobRejection) -> NotificationJob {
            let tokens = try self.tokens(limits: limits)
            guard let (payloadRange, payloadIsObject) = payload, bytes[payloadRange] != ArraySlice("null".utf8) else {
                throw JobRejection(field: "payload", "payload is missing")
            }
            guard payloadIsObject else {
                throw JobRejection(field: "payload", "payload must be a JSON object")
            }
            // Fields are checked into locals and the job made once at the end: mutating a job
            // field by field copied it (every string and array in it) along the way.
            let payload = RawJSON(bytes: bytes[payloadRange])
            var id: String?
            var topic: String?
            var pushType: PushType?
            var priority: NotificationPriority?
            var expiration: Int64?
            var collapseID: String?
            var environment: APNsEnvironment?
            var app: String?
            var deadline: Int64?
            var jobMeta: RawJSON?
            if let text = try string(.id) { id = try JobRules.identifier(text, field: "id") }
            if let text = try string(.topic) { topic = try JobRules.topic(text) }
            if let text = try string(.pushType) { pushType = try JobRules.pushType(text) }
            if let (value, literal) = try integer(.priority) { priority = try JobRules.priority(value, literal: literal) }
            if let (value, literal) = try integer(.expiration) { expiration = try JobRules.expiration(value, literal: literal) }
            if let text = try string(.collapseID) { collapseID = try JobRules.collapseID(text) }
            if let text = try string(.environment) { environment = try JobRules.environment(text) }
            if let text = try string(.app) { app = try JobRules.identifier(text, field: "app") }
            if let (value, literal) = try integer(.deadline) { deadline = try JobRules.deadline(value, literal: literal) }
            if let (metaRange, metaIsObject) = meta, bytes[metaRange] != ArraySlice("null".utf8) {
                guard metaIsObject else { throw JobRejection(field: "meta", "meta must be a JSON object") }
                guard metaRange.count <= JobRules.maximumMetaBytes else {
                    throw JobRejection(field: "meta", "meta is \(metaRange.count) bytes; at most \(JobRules.maximumMetaBytes) are allowed")
                }
                jobMeta = RawJSON(bytes: bytes[metaRange])
            }
            try JobRules.checkPayloadSize(payload.count, pushType: pushType ?? .voip)
            return NotificationJob(
                id: id, tokens: tokens, topic: topic, pushType: pushType, priority: priority, expiration: expiration,
                collapseID: collapseID, payload: payload, environment: environment, app: app, deadline: deadline, meta: jobMeta
            )
        }

        private func tokens(limits: Limits) throws(JobRejection) -> [DeviceToken] {
            switch (value(.tokens), value(.token)) {
            case (.some, .some):
                throw JobRejection(field: "tokens", "both token and tokens are given; use one")
            case (nil, nil):
                throw JobRejection(field: "tokens", "no device token: give token (a string) or tokens (an array of strings)")
            case (nil, .some(let single)):
                guard case .string(let text) = single else {
                    throw JobRejection(field: "token", "token must be a string, got \(single.typeName)")
                }
                do { return [try DeviceToken(hex: text)] } catch { throw error.at("token") }
            case (.some(let list), nil):
                guard case .array(let elements) = list else {
                    throw JobRejection(field: "tokens", "tokens must be an array of strings, got \(list.typeName)")
                }
                guard !elements.isEmpty else { throw JobRejection(field: "tokens", "tokens is empty") }
                guard elements.count <= limits.maximumTokensPerJob else {
                    throw JobRejection(field: "tokens", "\(elements.count) tokens in one job; at most \(limits.maximumTokensPerJob) are allowed")
                }
                var tokens: [DeviceToken] = []
                tokens.reserveCapacity(elements.count)
                var positions: [DeviceToken: Int] = [:]
                for (index, element) in elements.enumerated() {
                    guard case .string(let text) = element else {
                        throw JobRejection(field: "tokens[\(index)]", "token must be a string, got \(element.typeName)")
                    }
                    let token: DeviceToken
                    do { token = try DeviceToken(hex: text) } catch { throw error.at("tokens[\(index)]") }
                    if let earlier = positions.updateValue(index, forKey: token) {
                        throw JobRejection(field: "tokens[\(index)]", "token repeats tokens[\(earlier)]")
                    }
                    tokens.append(token)
                }
                return tokens
            }
        }
    }

    // MARK: - Headers + raw payload

    public func decodeHeaderJob(headers: [RecordHeader], payload: [UInt8]) throws(JobRejection) -> NotificationJob {
        // One slot per header the encoding defines (no dictionary, no hashing per record).
        var values = InlineArray<10, String?>(repeating: nil)
        for header in headers {
            guard let key = HeaderKey(name: header.key) else { continue }
            guard header.value != nil else {
                throw JobRejection(field: "\(header.key) header", "header \(header.key) has no value")
            }
            guard let text = header.text else {
                throw JobRejection(field: "\(header.key) header", "header \(header.key) is not valid UTF-8")
            }
            guard values[key.rawValue] == nil else {
                throw JobRejection(field: "\(header.key) header", "header \(header.key) appears more than once")
            }
            values[key.rawValue] = text
        }
        guard let tokenText = values[HeaderKey.token.rawValue] else {
            throw JobRejection(field: "apns-token header", "no device token: the apns-token header is missing")
        }
        let token: DeviceToken
        do { token = try DeviceToken(hex: tokenText) } catch { throw error.at("apns-token header") }

        guard !payload.isEmpty else {
            throw JobRejection(field: "payload", "payload is empty: the record value must be the APNs payload JSON object")
        }
        try checkRecordSize(payload.count)
        do {
            try JSONParser.validateObject(payload, range: 0..<payload.count, maxDepth: limits.maximumDepth)
        } catch {
            throw JobRejection(field: "payload", error.description)
        }
        var job = NotificationJob(tokens: [token], payload: RawJSON(bytes: payload[...]), encoding: .headers)

        func rule<T>(_ header: HeaderKey, _ check: (String) throws(JobRejection) -> T) throws(JobRejection) -> T? {
            guard let text = values[header.rawValue] else { return nil }
            do { return try check(text) } catch { throw error.at("\(header.name) header") }
        }
        job.topic = try rule(.topic, JobRules.topic)
        job.pushType = try rule(.pushType, JobRules.pushType)
        job.priority = try rule(.priority) { text throws(JobRejection) in try JobRules.priority(JobRules.integer(text), literal: text) }
        job.expiration = try rule(.expiration) { text throws(JobRejection) in try JobRules.expiration(JobRules.integer(text), literal: text) }
        job.collapseID = try rule(.collapseID, JobRules.collapseID)
        job.apnsID = try rule(.apnsID, JobRules.apnsID)
        job.id = try rule(.jobID) { text throws(JobRejection) in try JobRules.identifier(text, field: "job-id") }
        job.app = try rule(.app) { text throws(JobRejection) in try JobRules.identifier(text, field: "app") }
        if let metaText = values[HeaderKey.meta.rawValue] {
            let bytes = Array(metaText.utf8)
            guard bytes.count <= JobRules.maximumMetaBytes else {
                throw JobRejection(field: "meta header", "meta is \(bytes.count) bytes; at most \(JobRules.maximumMetaBytes) are allowed")
            }
            do {
                // One level less: every result carries it one level down, as an envelope's is.
                try JSONParser.validateObject(bytes, range: 0..<bytes.count, maxDepth: limits.maximumDepth - 1)
            } catch {
                throw JobRejection(field: "meta header", "meta must be a JSON object: \(error.description)")
            }
            job.meta = RawJSON(bytes: bytes[...])
        }
        try JobRules.checkPayloadSize(payload.count, pushType: job.pushType ?? .voip)
        return job
    }

    /// What the results of an unusable job can still carry: its `app`, `topic` and `meta`, each
    /// taken only when it is valid on its own (and `meta` only as the producer's exact bytes),
    /// so that analytics can attribute an `invalid` result to its campaign; and, of an
    /// envelope, its `id` and tokens, so that each device gets its result under the producer's
    /// id. A syntax error ends the reading; what came before it stands (a byte that is not
    /// UTF-8 deep in the payload loses none of the fields before it).
    public func bestEffortContext(value: [UInt8], headers: [RecordHeader]) -> JobContext {
        var context = JobContext()
        func meta(_ bytes: [UInt8], _ range: Range<Int>) -> RawJSON? {
            // As deep as a result can carry it (one level down).
            guard range.count <= JobRules.maximumMetaBytes,
                (try? JSONParser.validateObject(bytes, range: range, maxDepth: limits.maximumDepth - 1)) != nil
            else { return nil }
            return RawJSON(bytes: bytes[range])
        }
        // Any header of the header encoding (even without apns-token) means the value is an APNs
        // payload, whose own `topic` or `meta` keys say nothing about the job. Not `job-id`:
        // every retry record carries one, JSON envelopes' too.
        let headerFields = headers.contains(where: { HeaderKey(name: $0.key).map { $0 != .jobID } ?? false })
        if headerFields {
            for header in headers {
                guard let key = HeaderKey(name: header.key), let text = header.text else { continue }
                switch key {
                case .app: context.app = context.app ?? (try? JobRules.identifier(text, field: "app"))
                case .topic: context.topic = context.topic ?? (try? JobRules.topic(text))
                case .meta:
                    let bytes = Array(text.utf8)
                    context.meta = context.meta ?? meta(bytes, 0..<bytes.count)
                // The header encoding's own id (on a retry record, the same one).
                case .jobID: context.id = context.id ?? (try? JobRules.identifier(text, field: "job-id"))
                default: break
                }
            }
        }
        // Without apns-token the value is an envelope (what the decoder took it for), which names
        // its id and devices whatever other headers came with it.
        guard !headers.contains(where: { $0.key == Self.tokenHeader }) else { return context }
        var parser = JSONParser(bytes: value, maxDepth: limits.maximumDepth)
        do {
            try parser.beginObject()
            var first = true
            while let rawKey = try parser.nextRawKey(first: first) {
                first = false
                switch try parser.string(of: rawKey) {
                case "meta" where !headerFields:
                    let range = try parser.skipValueReturningRange()
                    context.meta = context.meta ?? meta(value, range)
                case "app" where !headerFields:
                    if case .string(let text) = try parser.parseValue() { context.app = context.app ?? (try? JobRules.identifier(text, field: "app")) }
                case "topic" where !headerFields:
                    if case .string(let text) = try parser.parseValue() { context.topic = context.topic ?? (try? JobRules.topic(text)) }
                case "id":
                    if case .string(let text) = try parser.parseValue() { context.id = context.id ?? (try? JobRules.identifier(text, field: "id")) }
                case "token":
                    context.addToken(try parser.parseValue())
                case "tokens":
                    switch try parser.parseValue() {
                    case .array(let list): for value in list.prefix(100_000) { context.addToken(value) }
                    case .null: break
                    default: context.hasUnreadableToken = true
                    }
                default:
                    _ = try parser.skipValueReturningRange()
                }
            }
        } catch {
            // Read as far as the syntax allowed.
        }
        return context
    }

    /// The headers of the header encoding; any other header is the producer's own and ignored.
    /// The raw value is the header's slot in `decodeHeaderJob`.
    private enum HeaderKey: Int, CaseIterable {
        case token, topic, pushType, priority, expiration, collapseID, apnsID, jobID, app, meta

        init?(name: String) {
            guard let key = Self.all.first(where: { $0.name == name }) else { return nil }
            self = key
        }

        var name: String {
            switch self {
            case .token: "apns-token"
            case .topic: "apns-topic"
            case .pushType: "apns-push-type"
            case .priority: "apns-priority"
            case .expiration: "apns-expiration"
            case .collapseID: "apns-collapse-id"
            case .apnsID: "apns-id"
            case .jobID: "job-id"
            case .app: "app"
            case .meta: "meta"
            }
        }

        static let all = allCases
    }

    private func checkRecordSize(_ count: Int) throws(JobRejection) {
        guard count <= limits.maximumRecordBytes else {
            throw JobRejection("record is \(count) bytes; at most \(limits.maximumRecordBytes) are accepted")
        }
    }
}
