/// How a notification attempt ended.
public enum Outcome: String, Sendable, CaseIterable, Hashable {
    /// APNs accepted it (200).
    case delivered
    /// APNs said no and retrying cannot help (400, 403, 404, 405, 410, 413).
    case rejected
    /// The job's deadline or `apns-expiration` passed before APNs accepted it.
    case expired
    /// The job itself was unusable; the worker never sent it.
    case invalid
    /// Retries were exhausted.
    case failed
}

/// Where a job came from in Kafka, copied into each of its results.
public struct SourcePosition: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }

    /// The job id used when a job has none: `<topic>-<partition>-<offset>` of the record as first
    /// consumed. Kafka allows topic names of 249 characters, which would make this longer than
    /// the 256 bytes a job id may have, and a retry record carrying it would then be refused as
    /// invalid: a topic too long for that is shortened to its start, `~` and a 64-bit FNV-1a hash
    /// of the whole name (in hex), so that ids stay distinct, stable and within the limit.
    public var derivedJobID: String {
        let position = "-\(partition)-\(offset)"
        let limit = JobRules.maximumIdentifierBytes
        guard topic.utf8.count + position.utf8.count > limit else { return topic + position }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in topic.utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        }
        let digest = String(hash, radix: 16)
        let tag = "~" + String(repeating: "0", count: 16 - digest.utf8.count) + digest
        // Whole characters only, so that the id stays valid UTF-8 within the limit.
        var kept = ""
        var keptBytes = 0
        let budget = limit - tag.utf8.count - position.utf8.count
        for character in topic {
            let size = character.utf8.count
            guard keptBytes + size <= budget else { break }
            kept.append(character)
            keptBytes += size
        }
        return kept + tag + position
    }
}

/// One result per notification attempt that ends, published to `apns.results` keyed by token.
public struct NotificationResult: Sendable, Hashable {
    public var jobID: String
    /// The token as the job gave it, in lowercase hex (so results of one device share a key
    /// whatever case producers use); for an `invalid` job whose token could not be read, the
    /// raw text is unavailable and this is empty.
    public var token: String
    public var topic: String?
    public var app: String?
    public var outcome: Outcome
    /// APNs's HTTP status when APNs answered; nil otherwise.
    public var status: Int?
    /// APNs's reason when APNs gave one; otherwise the worker's own reason (e.g. the validation failure).
    public var reason: String?
    public var apnsID: String?
    public var apnsUniqueID: String?
    /// APNs's 410 timestamp (ms since the epoch).
    public var unregisteredAt: Int64?
    public var attempts: Int
    public var latencyMs: Double
    public var sentAt: UnixMillis
    public var worker: String
    public var meta: RawJSON?
    public var source: SourcePosition

    public init(
        jobID: String,
        token: String,
        topic: String? = nil,
        app: String? = nil,
        outcome: Outcome,
        status: Int? = nil,
        reason: String? = nil,
        apnsID: String? = nil,
        apnsUniqueID: String? = nil,
        unregisteredAt: Int64? = nil,
        attempts: Int,
        latencyMs: Double,
        sentAt: UnixMillis,
        worker: String,
        meta: RawJSON? = nil,
        source: SourcePosition
    ) {
        self.jobID = jobID
        self.token = token
        self.topic = topic
        self.app = app
        self.outcome = outcome
        self.status = status
        self.reason = reason
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.unregisteredAt = unregisteredAt
        self.attempts = attempts
        self.latencyMs = latencyMs
        self.sentAt = sentAt
        self.worker = worker
        self.meta = meta
        self.source = source
    }

    /// The outcome docs/design.md assigns to an APNs status code.
    public static func outcome(forStatus status: Int) -> Outcome {
        switch status {
        case 200: .delivered
        case 429, 500...599: .failed
        default: .rejected
        }
    }

    /// The JSON value written to `apns.results`.
    public func encoded() -> [UInt8] {
        // Room for the whole result at once (a regrowth copies it): the strings' lengths, plus
        // the keys, numbers and timestamp (about 300 bytes). Escaping, rare, may still grow it.
        let strings = jobID.utf8.count + token.utf8.count + (topic?.utf8.count ?? 0) + (app?.utf8.count ?? 0)
            + (reason?.utf8.count ?? 0) + (apnsID?.utf8.count ?? 0) + (apnsUniqueID?.utf8.count ?? 0)
            + worker.utf8.count + source.topic.utf8.count + (meta?.count ?? 0)
        var writer = JSONWriter(capacity: strings + 384)
        writer.beginObject()
        writer.field("job_id", jobID)
        writer.field("token", token)
        writer.field("topic", topic)
        writer.field("app", app)
        writer.field("outcome", outcome.rawValue)
        writer.field("status", status)
        writer.field("reason", reason)
        writer.field("apns_id", apnsID)
        if let apnsUniqueID { writer.field("apns_unique_id", apnsUniqueID) }
        writer.field("unregistered_at", unregisteredAt)
        writer.field("attempts", attempts)
        writer.field("latency_ms", latencyMs)
        writer.field("sent_at", sentAt)
        writer.field("worker", worker)
        writer.field("meta", raw: meta)
        writer.beginObject("source")
        writer.field("topic", source.topic)
        writer.field("partition", Int(source.partition))
        writer.field("offset", source.offset)
        writer.endObject()
        writer.endObject()
        return writer.bytes
    }

    /// Reads a result back (the feedback worker, the demo and tests consume `apns.results`).
    public init(decoding bytes: [UInt8]) throws(ContractDecodingError) {
        let object = try ContractObject(bytes, contract: "result")
        jobID = try object.requiredString("job_id")
        token = try object.requiredString("token")
        topic = try object.optionalString("topic")
        app = try object.optionalString("app")
        let outcomeText = try object.requiredString("outcome")
        guard let outcome = Outcome(rawValue: outcomeText) else {
            throw ContractDecodingError(contract: "result", field: "outcome", "unknown outcome \"\(outcomeText)\"")
        }
        self.outcome = outcome
        status = try object.optionalInt("status").map(Int.init)
        reason = try object.optionalString("reason")
        apnsID = try object.optionalString("apns_id")
        apnsUniqueID = try object.optionalString("apns_unique_id")
        unregisteredAt = try object.optionalInt("unregistered_at")
        attempts = Int(try object.requiredInt("attempts"))
        latencyMs = try object.requiredDouble("latency_ms")
        let sentAtText = try object.requiredString("sent_at")
        guard let sentAt = UnixMillis(rfc3339: sentAtText) else {
            throw ContractDecodingError(contract: "result", field: "sent_at", "not an RFC 3339 UTC time: \"\(sentAtText)\"")
        }
        self.sentAt = sentAt
        worker = try object.requiredString("worker")
        meta = try object.optionalRawObject("meta", in: bytes)
        let source = try object.requiredObject("source")
        self.source = SourcePosition(
            topic: try source.requiredString("topic"),
            partition: Int32(clamping: try source.requiredInt("partition")),
            offset: try source.requiredInt("offset")
        )
    }
}
