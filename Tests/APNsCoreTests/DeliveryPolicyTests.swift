import APNsCore
import Testing

@Suite("Delivery policy: retries, deadlines, outcomes")
struct DeliveryPolicyTests {
    let policy = DeliveryPolicy(retry: RetryPolicy(inProcessAttempts: 2, maxAttempts: 4, baseDelayMilliseconds: 100, maxDelayMilliseconds: 10_000))
    let now = UnixMillis(seconds: 1_767_225_600)

    func after(_ attempt: Int, _ result: AttemptResult, deadline: Int64? = nil, expiration: Int64? = nil) -> DeliveryDecision {
        policy.after(attempt: attempt, result: result, now: now, deadline: deadline, expiration: expiration, jitter: 1)
    }

    @Test("200 is delivered; final and token-invalidating answers are rejected at once")
    func finalAnswers() {
        #expect(after(1, .answered(status: 200, reason: nil)) == .finish(.delivered, status: 200, reason: nil))
        #expect(after(1, .answered(status: 410, reason: .unregistered)) == .finish(.rejected, status: 410, reason: "Unregistered"))
        #expect(after(1, .answered(status: 400, reason: .badTopic)) == .finish(.rejected, status: 400, reason: "BadTopic"))
        #expect(after(1, .answered(status: 413, reason: .payloadTooLarge)) == .finish(.rejected, status: 413, reason: "PayloadTooLarge"))
        #expect(after(1, .answered(status: 403, reason: .invalidProviderToken)) == .finish(.rejected, status: 403, reason: "InvalidProviderToken"))
    }

    @Test("retryable answers back off in process, then through the retry topic, then fail")
    func retryLadder() {
        #expect(after(1, .answered(status: 503, reason: .serviceUnavailable)) == .retryInProcess(afterMilliseconds: 100, lastReason: "ServiceUnavailable"))
        #expect(after(2, .answered(status: 503, reason: .serviceUnavailable)) == .retryLater(notBefore: UnixMillis(now.value + 200), lastReason: "ServiceUnavailable"))
        #expect(after(3, .answered(status: 429, reason: .tooManyRequests)) == .retryLater(notBefore: UnixMillis(now.value + 400), lastReason: "TooManyRequests"))
        #expect(after(4, .answered(status: 500, reason: .internalServerError)) == .finish(.failed, status: 500, reason: "InternalServerError (gave up after 4 attempts)"))
    }

    @Test("a fan-out job's 429 TooManyRequests goes to the retry topic at once: one device's wait must not hold the job's other slots")
    func fanOutThrottledDeviceRetriesLater() {
        let throttled = AttemptResult.answered(status: 429, reason: .tooManyRequests)
        #expect(policy.after(attempt: 1, result: throttled, now: now, deadline: nil, expiration: nil, sharesSlots: true, jitter: 1)
            == .retryLater(notBefore: UnixMillis(now.value + 100), lastReason: "TooManyRequests"))
        #expect(after(1, throttled) == .retryInProcess(afterMilliseconds: 100, lastReason: "TooManyRequests"), "a one-token job holds only its own slot")
        // Other retryable answers (a 503 usually hits every device alike) still wait in process.
        #expect(policy.after(attempt: 1, result: .answered(status: 503, reason: .serviceUnavailable), now: now, deadline: nil, expiration: nil, sharesSlots: true, jitter: 1)
            == .retryInProcess(afterMilliseconds: 100, lastReason: "ServiceUnavailable"))
    }

    @Test("unanswered attempts (connection lost, refused stream, timeout) are retried the same way")
    func notAnswered() {
        #expect(after(1, .notAnswered("REFUSED_STREAM")) == .retryInProcess(afterMilliseconds: 100, lastReason: "REFUSED_STREAM"))
        #expect(after(4, .notAnswered("request timed out after 10 s")) == .finish(.failed, status: nil, reason: "request timed out after 10 s (gave up after 4 attempts)"))
    }

    @Test("an attempt APNs may have taken is retried by default; with give-up it fails at once, saying so, while certain ones are still retried")
    func possiblyDelivered() {
        let lost = "the connection was lost after the request was written"
        #expect(after(1, .unconfirmed(lost)) == .retryInProcess(afterMilliseconds: 100, lastReason: lost))
        var cautious = policy
        cautious.retry.possiblyDelivered = .giveUp
        let decision = cautious.after(attempt: 1, result: .unconfirmed(lost), now: now, deadline: now.seconds - 60, expiration: nil, jitter: 1)
        // Failed, not expired, even past the deadline: it may well have been delivered.
        #expect(decision == .finish(.failed, status: nil, reason: "\(lost); not sent again, as APNs may have taken it (retry.possibly-delivered is give-up)"))
        #expect(cautious.after(attempt: 1, result: .notAnswered("REFUSED_STREAM"), now: now, deadline: nil, expiration: nil, jitter: 1)
            == .retryInProcess(afterMilliseconds: 100, lastReason: "REFUSED_STREAM"))
        #expect(cautious.after(attempt: 1, result: .answered(status: 503, reason: .serviceUnavailable), now: now, deadline: nil, expiration: nil, jitter: 1)
            == .retryInProcess(afterMilliseconds: 100, lastReason: "ServiceUnavailable"))
    }

    @Test("an unknown reason is judged by its status")
    func unknownReason() {
        #expect(after(1, .answered(status: 503, reason: APNsReason(rawValue: "BrandNew"))) == .retryInProcess(afterMilliseconds: 100, lastReason: "BrandNew"))
        #expect(after(1, .answered(status: 400, reason: APNsReason(rawValue: "BrandNew"))) == .finish(.rejected, status: 400, reason: "BrandNew"))
    }

    @Test("no retry outlives the deadline or a non-zero expiration")
    func deadlines() {
        let soon = now.seconds  // the deadline is now: a retry 100 ms later would be past it
        #expect(after(1, .answered(status: 503, reason: .serviceUnavailable), deadline: soon)
            == .finish(.expired, status: 503, reason: "ServiceUnavailable; deadline 2026-01-01T00:00:00.000Z comes before the next attempt could (in 100 ms)"))
        #expect(after(1, .answered(status: 503, reason: .serviceUnavailable), expiration: soon)
            == .finish(.expired, status: 503, reason: "ServiceUnavailable; apns-expiration 2026-01-01T00:00:00.000Z comes before the next attempt could (in 100 ms)"))
        // apns-expiration 0 (now or never) does not stop the worker from retrying a moment later.
        #expect(after(1, .answered(status: 503, reason: .serviceUnavailable), expiration: 0) == .retryInProcess(afterMilliseconds: 100, lastReason: "ServiceUnavailable"))
        #expect(after(1, .answered(status: 503, reason: .serviceUnavailable), deadline: soon + 60) == .retryInProcess(afterMilliseconds: 100, lastReason: "ServiceUnavailable"))
    }

    @Test("a record that already made every allowed attempt is failed without being sent")
    func attemptsUsedUp() {
        #expect(policy.beforeSending(now: now, deadline: nil, expiration: nil, attemptsMade: 3) == nil)
        #expect(policy.beforeSending(now: now, deadline: nil, expiration: nil, attemptsMade: 4)
            == .finish(.failed, status: nil, reason: "4 attempts were already made, and retry.max-attempts is 4; not sent again"))
        // Past its cutoff too, it is expired: the cutoff is what the producer asked for.
        guard case .finish(.expired, _, _)? = policy.beforeSending(now: now, deadline: now.seconds - 1, expiration: nil, attemptsMade: 1_000_000) else {
            Issue.record("expected expired")
            return
        }
    }

    @Test("timestamps far outside any calendar saturate and still format, never trap")
    func extremeTimestamps() {
        #expect(UnixMillis(seconds: 1_152_921_504_606_846_976).value == .max, "2^60 s saturates instead of wrapping to the past")
        #expect(UnixMillis(seconds: -1_152_921_504_606_846_976).value == .min)
        #expect(UnixMillis(.min).rfc3339.hasSuffix(".192Z"))
        #expect(UnixMillis(.max).rfc3339.hasSuffix(".807Z"))
        #expect(UnixMillis(-1).rfc3339 == "1969-12-31T23:59:59.999Z")
    }

    @Test("a last attempt that ends past the cutoff is expired, not failed")
    func lastAttemptPastCutoff() {
        #expect(after(4, .notAnswered("request timed out after 10 s"), deadline: now.seconds - 1)
            == .finish(.expired, status: nil, reason: "request timed out after 10 s; deadline 2025-12-31T23:59:59.000Z passed before APNs accepted the notification"))
    }

    @Test("past the cutoff by the transport's monotonic clock, it is expired even if the wall clock stepped back")
    func cutoffPassedByTheMonotonicClock() {
        // The wall clock reads a second before the deadline; the transport says its send-by passed.
        let lateByTransport = policy.after(
            attempt: 4, result: .notAnswered("too late"), now: now, deadline: now.seconds + 1, expiration: nil, cutoffPassed: true, jitter: 1
        )
        #expect(lateByTransport == .finish(.expired, status: nil, reason: "too late; deadline 2026-01-01T00:00:01.000Z passed before APNs accepted the notification"))
        // Without the flag, the same attempt is the last one and fails.
        let byWallClock = policy.after(attempt: 4, result: .notAnswered("too late"), now: now, deadline: now.seconds + 1, expiration: nil, jitter: 1)
        #expect(byWallClock == .finish(.failed, status: nil, reason: "too late (gave up after 4 attempts)"))
    }

    @Test("a job already past its deadline is not sent at all")
    func beforeSending() {
        #expect(policy.beforeSending(now: now, deadline: now.seconds - 1, expiration: nil)
            == .finish(.expired, status: nil, reason: "deadline 2025-12-31T23:59:59.000Z passed before APNs accepted the notification"))
        #expect(policy.beforeSending(now: now, deadline: now.seconds + 1, expiration: 0) == nil)
        #expect(policy.beforeSending(now: now, deadline: nil, expiration: nil) == nil)
    }
}
