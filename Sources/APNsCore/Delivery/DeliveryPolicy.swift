/// How one attempt to send a notification ended, as the worker's retry logic sees it.
public enum AttemptResult: Sendable, Hashable {
    /// APNs answered with a status (and, unless 200, a reason).
    case answered(status: Int, reason: APNsReason?)
    /// No answer, and APNs certainly did not deliver the request: it was never written, the
    /// stream was refused, or the answer began with a status other than 200 and was cut before
    /// its reason. The text says why, and becomes `last-reason` / the result's reason.
    case notAnswered(String)
    /// No answer, but APNs may have taken the request: it was written, then its deadline
    /// passed or its connection was lost, reset or went away before any status came. Sent again, a device could get
    /// it twice (`RetryPolicy.possiblyDelivered` decides).
    case unconfirmed(String)

    public var isNotAnswered: Bool {
        switch self {
        case .notAnswered, .unconfirmed: true
        case .answered: false
        }
    }

    /// APNs's HTTP status, when it answered.
    public var status: Int? {
        if case .answered(let status, _) = self { return status }
        return nil
    }

    /// What a retry names as its last reason: APNs's reason, or the status, or why no answer came.
    public var lastReason: String {
        switch self {
        case .answered(let status, let reason): reason?.rawValue ?? "HTTP \(status)"
        case .notAnswered(let why), .unconfirmed(let why): why
        }
    }
}

/// What to do next with a notification after an attempt, or before the first one.
public enum DeliveryDecision: Sendable, Hashable {
    /// The notification is done: publish a result with this outcome.
    case finish(Outcome, status: Int?, reason: String?)
    /// Try again in this process after the delay.
    case retryInProcess(afterMilliseconds: Int, lastReason: String)
    /// Hand the job to the retry topic, not to be sent before `notBefore`.
    case retryLater(notBefore: UnixMillis, lastReason: String)
}

/// docs/design.md's retry rules as a pure function, so that every path through them is unit-tested
/// and the worker only executes the decision.
///
/// - 200 is delivered; final and token-invalidating reasons are rejected at once.
/// - Retryable answers (429, 500, 503, a stale provider token) and unanswered attempts back off
///   exponentially with jitter: `inProcessAttempts` times in process, then through the retry
///   topic, until `maxAttempts`, after which the result is `failed`.
/// - An attempt APNs may have taken without answering is retried like the others, or, with
///   `possiblyDelivered` `.giveUp`, ends `failed` at once (no second copy from the worker).
/// - Nothing is retried past the job's `deadline` or its non-zero `apns-expiration`: the
///   result is then `expired`. (`apns-expiration` 0 means APNs will not store the notification;
///   it does not stop the worker from getting it to APNs a moment later.)
public struct DeliveryPolicy: Sendable, Hashable {
    public var retry: RetryPolicy

    public init(retry: RetryPolicy = RetryPolicy()) {
        self.retry = retry
    }

    /// The moment after which a job must not be sent, in milliseconds, if it has one.
    public static func cutoff(deadline: Int64?, expiration: Int64?) -> UnixMillis? {
        let candidates = [deadline, expiration.flatMap { $0 > 0 ? $0 : nil }].compactMap { $0 }
        return candidates.min().map { UnixMillis(seconds: $0) }
    }

    /// Checked before every attempt: a job past its deadline or expiration is not sent, nor one
    /// that already made every attempt allowed (a retry record from before `maxAttempts` was
    /// lowered, or a producer's own `attempt` header).
    public func beforeSending(now: UnixMillis, deadline: Int64?, expiration: Int64?, attemptsMade: Int = 0) -> DeliveryDecision? {
        if let cutoff = Self.cutoff(deadline: deadline, expiration: expiration), now > cutoff {
            return .finish(.expired, status: nil, reason: Self.expiredReason(deadline: deadline, expiration: expiration, cutoff: cutoff))
        }
        guard attemptsMade >= retry.maxAttempts else { return nil }
        return .finish(.failed, status: nil, reason: "\(attemptsMade) attempts were already made, and retry.max-attempts is \(retry.maxAttempts); not sent again")
    }

    /// Decides after attempt number `attempt` (1 for the first) ended with `result`.
    /// `jitter` is a uniform random number in [0, 1], passed in so tests are deterministic.
    /// `now` and `jitter` are read only when the attempt did not settle the notification: most
    /// answers are a 200, and they cost a clock reading and a random draw otherwise.
    /// `cutoffPassed` says that the caller's monotonic clock is past the cutoff already (the
    /// transport refused to write it that late): a wall clock stepped back must not turn that
    /// into another attempt, or into `failed`.
    /// `sharesSlots` says that the notification is one of a fan-out job's, whose in-flight slots
    /// are all held until every token is settled: a 429 TooManyRequests, one device's, then goes
    /// to the retry topic at once instead of waiting in process and holding the others' slots
    /// (read only for such a 429: the per-notification path does not pay for it).
    public func after(
        attempt: Int,
        result: AttemptResult,
        now: @autoclosure () -> UnixMillis,
        deadline: Int64?,
        expiration: Int64?,
        cutoffPassed: Bool = false,
        sharesSlots: @autoclosure () -> Bool = false,
        jitter: @autoclosure () -> Double
    ) -> DeliveryDecision {
        var lastStatus: Int?
        if case .answered(let status, let reason) = result {
            if status == 200 { return .finish(.delivered, status: 200, reason: nil) }
            let classification = reason?.classification(status: status) ?? APNsReasonTable.classification(status: status)
            if classification != .retryable {
                return .finish(.rejected, status: status, reason: reason?.rawValue)
            }
            lastStatus = status
        }
        let lastReason = result.lastReason
        if givesUp(after: result) {
            return .finish(.failed, status: nil, reason: "\(lastReason); not sent again, as APNs may have taken it (retry.possibly-delivered is give-up)")
        }

        // Past the job's cutoff the answer is that it expired, even on its last attempt.
        if let cutoff = Self.cutoff(deadline: deadline, expiration: expiration), cutoffPassed || now() > cutoff {
            return .finish(.expired, status: lastStatus, reason: "\(lastReason); \(Self.expiredReason(deadline: deadline, expiration: expiration, cutoff: cutoff))")
        }
        guard attempt < retry.maxAttempts else {
            return .finish(.failed, status: lastStatus, reason: "\(lastReason) (gave up after \(attempt) attempts)")
        }
        let delay = retry.delayMilliseconds(afterAttempt: attempt, jitter: jitter())
        let notBefore = UnixMillis(now().value + Int64(delay))
        if let cutoff = Self.cutoff(deadline: deadline, expiration: expiration), notBefore > cutoff {
            return .finish(.expired, status: lastStatus, reason: "\(lastReason); \(Self.expiredReason(deadline: deadline, expiration: expiration, cutoff: cutoff, nextAttemptIn: delay))")
        }
        let oneDeviceThrottled = if case .answered(429, .tooManyRequests?) = result { true } else { false }
        if attempt < retry.inProcessAttempts, !(oneDeviceThrottled && sharesSlots()) {
            return .retryInProcess(afterMilliseconds: delay, lastReason: lastReason)
        }
        return .retryLater(notBefore: notBefore, lastReason: lastReason)
    }

    /// Whether `after` ends an attempt with `result` as `failed` because APNs may have taken it
    /// (`retry.possibly-delivered: give-up`), rather than by the usual rules.
    public func givesUp(after result: AttemptResult) -> Bool {
        guard case .unconfirmed = result else { return false }
        return retry.possiblyDelivered == .giveUp
    }

    /// Why a notification is expired: its cutoff passed, or (`nextAttemptIn`) would pass before
    /// the backoff allows another attempt.
    static func expiredReason(deadline: Int64?, expiration: Int64?, cutoff: UnixMillis, nextAttemptIn delay: Int? = nil) -> String {
        let which = deadline.map { UnixMillis(seconds: $0) == cutoff } == true ? "deadline" : "apns-expiration"
        if let delay {
            return "\(which) \(cutoff.rfc3339) comes before the next attempt could (in \(delay) ms)"
        }
        return "\(which) \(cutoff.rfc3339) passed before APNs accepted the notification"
    }
}
