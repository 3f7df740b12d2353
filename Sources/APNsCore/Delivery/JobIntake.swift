/// A job accepted for sending: everything its notifications share.
public struct AcceptedJob: Sendable {
    public var jobID: String
    public var job: ResolvedJob
    public var appName: String
    public var source: SourcePosition
    /// Attempts already made (0 for a job from `apns.jobs`; from the `attempt` header on retries).
    public var previousAttempts: Int
    /// Not to be sent before this time (the `not-before` header of a retry record).
    public var notBefore: UnixMillis?
    /// Why the previous attempt did not settle it (a retry record's `last-reason` header).
    public var previousReason: String?
    /// APNs's status on the previous attempt (a retry record's `last-status` header).
    public var previousStatus: Int?
    /// The tokens still to send: all of them, or on a retry record only those the retry names.
    public var tokens: [DeviceToken]
}

/// A job that can never be sent: one `invalid` result per token it names, and a DLQ copy.
public struct RejectedJob: Sendable {
    public var rejection: JobRejection
    public var results: [NotificationResult]
    /// The original record value, unchanged, and its headers plus the DLQ headers.
    public var deadLetterValue: [UInt8]
    public var deadLetterHeaders: [RecordHeader]
}

public enum IntakeDecision: Sendable {
    case accepted(AcceptedJob)
    case rejected(RejectedJob)
}

/// Turns a consumed record into work or into `invalid` results, with the worker's rules:
/// decode either encoding, pick the app, fill its defaults, read retry headers.
///
/// It never throws and never traps: any input yields a decision, so a poison record cannot stop
/// a partition.
public struct JobIntake: Sendable {
    public var configuration: FleetConfiguration
    public var decoder: JobDecoder
    public var workerID: String

    public init(configuration: FleetConfiguration, workerID: String) {
        self.configuration = configuration
        self.decoder = JobDecoder(limits: .init(maximumTokensPerJob: configuration.worker.maxTokensPerJob))
        self.workerID = workerID
    }

    /// `isRetryRecord` says whether the record is the worker's own retry record: by default,
    /// whether `source` is on the retry topic (a retry record read back before it is published
    /// keeps its job's source).
    public func accept(value: [UInt8], headers: [RecordHeader], source: SourcePosition, now: UnixMillis, isRetryRecord: Bool? = nil) -> IntakeDecision {
        // The retry headers (`attempt`, `not-before`, `last-reason`, `job-id`, `retry-tokens`)
        // are the worker's own only on the retry topic; on a job topic they are the producer's,
        // which must not skip tokens, fail a job unsent or hold its partition back.
        let retryHeaders = isRetryRecord ?? (source.topic == configuration.topics.retry) ? headers : []
        // A job without `id` keeps the id of its first consumption through retries (checked
        // like an `id`: a record edited by hand must not carry a bad one into every result).
        let inheritedID = retryHeaders.text(RetryHeaders.jobIDKey).flatMap { try? JobRules.identifier($0, field: RetryHeaders.jobIDKey) }
        let retry: RetryHeaders?
        do {
            retry = try RetryHeaders(headers: retryHeaders)
        } catch {
            // Still its job's id, and only the tokens it was retrying: the job's others already
            // have their results. A valid `attempt` beside a damaged header still says it was sent.
            let attempt = retryHeaders.text(RetryHeaders.attemptKey).flatMap(RetryHeaders.attempt)
            return reject(
                JobRejection(field: "\(error.field ?? "retry") header", error.message), value: value, headers: headers, source: source, now: now,
                jobID: inheritedID, tokens: Self.namedRetryTokens(retryHeaders), previousAttempts: attempt ?? 0
            )
        }
        do {
            let job = try decoder.decode(value: value, headers: headers)
            let jobID = job.id ?? inheritedID ?? source.derivedJobID
            do {
                // By index: the fields are read in place, not from a copy of the app's configuration.
                let appIndex = try configuration.appIndex(for: job)
                let binary = configuration.apps[appIndex].transport == .binary
                let settled = try job.settledFields(
                    defaults: configuration.apps[appIndex].defaults, appName: configuration.apps[appIndex].name, pushTypeTopics: !binary
                )
                if binary { try Self.checkBinaryInterface(job) }
                let tokens = try retryTokens(headers: retryHeaders, job: job)
                // Nothing can fail past this point, so the job moves into the result uncopied.
                let resolved = ResolvedJob(
                    job: consume job, topic: settled.topic, pushType: settled.pushType,
                    priority: settled.priority, environment: settled.environment
                )
                return .accepted(AcceptedJob(
                    jobID: jobID, job: resolved, appName: configuration.apps[appIndex].name, source: source,
                    previousAttempts: retry?.attempt ?? 0, notBefore: retry?.notBefore, previousReason: retry.flatMap { $0.lastReason.isEmpty ? nil : $0.lastReason },
                    previousStatus: retry?.lastStatus, tokens: tokens
                ))
            } catch {
                // A retry record stands for the tokens it names: the job's others already have
                // their results, and must not get a second, `invalid`, one.
                let tokens = (try? retryTokens(headers: retryHeaders, job: job)) ?? Self.namedRetryTokens(retryHeaders) ?? job.tokens
                return reject(error, value: value, headers: headers, source: source, now: now, jobID: jobID, job: job, tokens: tokens, previousAttempts: retry?.attempt ?? 0)
            }
        } catch {
            // A retry record whose job no longer decodes (a limit lowered since) still stands
            // only for the tokens it names.
            return reject(
                error, value: value, headers: headers, source: source, now: now, jobID: inheritedID, tokens: Self.namedRetryTokens(retryHeaders),
                previousAttempts: retry?.attempt ?? 0
            )
        }
    }

    /// The well-formed tokens a retry record's `retry-tokens` header names, read leniently (for
    /// the `invalid` results of a record that is unusable otherwise); nil without the header or
    /// when it names none.
    static func namedRetryTokens(_ headers: [RecordHeader]) -> [DeviceToken]? {
        guard let list = headers.text(retryTokensKey) else { return nil }
        var seen = Set<DeviceToken>()
        let tokens = list.split(separator: ",").compactMap { try? DeviceToken(hex: String($0)) }.filter { seen.insert($0).inserted }
        return tokens.isEmpty ? nil : tokens
    }

    /// The legacy binary interface's own limits, so that a job it can never carry is `invalid`
    /// (with a DLQ copy) rather than refused later by the gateway.
    static func checkBinaryInterface(_ job: NotificationJob) throws(JobRejection) {
        let limit = LegacyNotification.maximumPayloadBytes
        guard job.payload.count <= limit else {
            throw JobRejection(field: "payload", "payload is \(job.payload.count) bytes; the legacy binary interface (protocol binary) allows at most \(limit)")
        }
        if let token = job.tokens.first(where: { $0.bytes.count != LegacyNotification.tokenBytes }) {
            throw JobRejection(field: "token", "device token \(token.redacted) is \(token.bytes.count) bytes; the legacy binary interface takes \(LegacyNotification.tokenBytes)")
        }
    }

    /// The header naming which tokens of a fan-out job a retry record is for.
    public static let retryTokensKey = "retry-tokens"

    private func retryTokens(headers: [RecordHeader], job: NotificationJob) throws(JobRejection) -> [DeviceToken] {
        guard let list = headers.text(Self.retryTokensKey) else { return job.tokens }
        // Sets: a fan-out job may carry thousands of tokens.
        let jobTokens = Set(job.tokens)
        var named = Set<DeviceToken>()
        var tokens: [DeviceToken] = []
        for text in list.split(separator: ",") {
            let token: DeviceToken
            do { token = try DeviceToken(hex: String(text)) } catch { throw error.at("\(Self.retryTokensKey) header") }
            guard jobTokens.contains(token) else {
                throw JobRejection(field: "\(Self.retryTokensKey) header", "token \(token.redacted) is not one of the job's tokens")
            }
            // Named twice, it would be sent twice and get two results.
            guard named.insert(token).inserted else {
                throw JobRejection(field: "\(Self.retryTokensKey) header", "token \(token.redacted) is named twice")
            }
            tokens.append(token)
        }
        guard !tokens.isEmpty else { throw JobRejection(field: "\(Self.retryTokensKey) header", "names no token") }
        return tokens
    }

    private func reject(
        _ rejection: JobRejection,
        value: [UInt8],
        headers: [RecordHeader],
        source: SourcePosition,
        now: UnixMillis,
        jobID: String?,
        job: NotificationJob? = nil,
        tokens jobTokens: [DeviceToken]? = nil,
        previousAttempts: Int = 0
    ) -> IntakeDecision {
        // A job that did not decode still names its app, topic, meta, id and tokens, most
        // likely: its results carry them where they are valid on their own.
        let context = job.map { JobContext(app: $0.app, topic: $0.topic, meta: $0.meta) } ?? decoder.bestEffortContext(value: value, headers: headers)
        let tokens = (jobTokens ?? job?.tokens).map { $0.map(\.hex) } ?? Self.bestEffortTokens(context, headers: headers)
        // Built once: a fan-out job may have thousands of tokens.
        let reason = rejection.reason
        // A retry record was sent before (APNs may have delivered it): not `invalid`, which says
        // "never sent", but `failed`, with its attempts. Something changed since its last
        // attempt: the configuration (its app removed, a limit lowered) or the record itself.
        let sentBefore = previousAttempts > 0
        let resultReason = sentBefore ? "\(reason) (the retry record became unusable after \(previousAttempts) attempts)" : reason
        let results = (tokens.isEmpty ? [""] : tokens).map { token in
            NotificationResult(
                jobID: jobID ?? context.id ?? source.derivedJobID, token: token, topic: context.topic, app: context.app,
                outcome: sentBefore ? .failed : .invalid, reason: resultReason, attempts: previousAttempts, latencyMs: 0,
                sentAt: now, worker: workerID, meta: context.meta, source: source
            )
        }
        let deadLetter = DeadLetterHeaders(reason: reason, source: source)
        return .rejected(RejectedJob(
            rejection: rejection, results: results, deadLetterValue: value,
            deadLetterHeaders: deadLetter.applied(to: headers)
        ))
    }

    /// The tokens an unusable record seems to address, so each still gets its `invalid` result.
    /// Only well-formed tokens are taken; entries that are not (one result stands for all of
    /// them) are reported under an empty token, so a reader counting results misses none.
    static func bestEffortTokens(_ context: JobContext, headers: [RecordHeader]) -> [String] {
        if headers.contains(where: { $0.key == JobDecoder.tokenHeader }) {
            // Empty, or not UTF-8: one result under an empty token.
            return [headers.text(JobDecoder.tokenHeader).flatMap { try? DeviceToken(hex: $0) }?.hex ?? ""]
        }
        return context.tokens + (context.hasUnreadableToken ? [""] : [])
    }
}
