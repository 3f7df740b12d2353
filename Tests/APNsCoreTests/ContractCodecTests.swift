import APNsCore
import Testing

private let source = SourcePosition(topic: "apns.jobs", partition: 3, offset: 18_227)

private func sampleResult(meta: RawJSON? = RawJSON(#"{"campaign":"shipping-updates"}"#)) -> NotificationResult {
    NotificationResult(
        jobID: "order-4711-shipped", token: tokenA, topic: "com.example.app", app: "example",
        outcome: .rejected, status: 410, reason: "Unregistered", apnsID: "9f1c0000-0000-4000-8000-000000000001",
        unregisteredAt: 1_767_225_600_123, attempts: 1, latencyMs: 31.4,
        sentAt: UnixMillis(1_795_341_600_123), worker: "worker-7f9c", meta: meta, source: source
    )
}

@Suite("Result, token event and header codecs")
struct ContractCodecTests {
    @Test("a result encodes to the docs/design.md shape and decodes back unchanged")
    func resultRoundTrip() throws {
        let result = sampleResult()
        let text = String(decoding: result.encoded(), as: UTF8.self)
        #expect(text == #"{"job_id":"order-4711-shipped","token":"\#(tokenA)","topic":"com.example.app","app":"example","outcome":"rejected","status":410,"reason":"Unregistered","apns_id":"9f1c0000-0000-4000-8000-000000000001","unregistered_at":1767225600123,"attempts":1,"latency_ms":31.4,"sent_at":"2026-11-22T10:00:00.123Z","worker":"worker-7f9c","meta":{"campaign":"shipping-updates"},"source":{"topic":"apns.jobs","partition":3,"offset":18227}}"#)
        #expect(try NotificationResult(decoding: result.encoded()) == result)
    }

    @Test("an invalid job's result carries nulls where APNs never answered, and escapes the reason")
    func invalidResult() throws {
        let result = NotificationResult(
            jobID: "apns.jobs-0-7", token: "", outcome: .invalid, reason: "topic: topic contains control character U+000A \"\n\"",
            attempts: 0, latencyMs: 0, sentAt: UnixMillis(0), worker: "w", source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 7)
        )
        let text = String(decoding: result.encoded(), as: UTF8.self)
        #expect(text.contains(#""status":null,"reason":"topic: topic contains control character U+000A \"\n\"""#))
        #expect(text.contains(#""meta":null"#))
        #expect(try NotificationResult(decoding: result.encoded()) == result)
    }

    @Test("decoding a malformed result names the field")
    func resultDecodingErrors() {
        #expect(throws: ContractDecodingError(contract: "result", field: "outcome", "unknown outcome \"lost\"")) {
            var text = String(decoding: sampleResult().encoded(), as: UTF8.self)
            text = text.replacing(#""outcome":"rejected""#, with: #""outcome":"lost""#, maxReplacements: 1)
            return try NotificationResult(decoding: Array(text.utf8))
        }
        #expect(throws: ContractDecodingError(contract: "result", field: "attempts", "expected an integer, got a string")) {
            var text = String(decoding: sampleResult().encoded(), as: UTF8.self)
            text = text.replacing(#""attempts":1"#, with: #""attempts":"1""#, maxReplacements: 1)
            return try NotificationResult(decoding: Array(text.utf8))
        }
    }

    @Test("timestamps format and parse as RFC 3339 UTC with milliseconds")
    func timestamps() {
        #expect(UnixMillis(0).rfc3339 == "1970-01-01T00:00:00.000Z")
        #expect(UnixMillis(951_782_400_000).rfc3339 == "2000-02-29T00:00:00.000Z")
        #expect(UnixMillis(-1).rfc3339 == "1969-12-31T23:59:59.999Z")
        #expect(UnixMillis(1_795_391_278_087).rfc3339 == "2026-11-22T23:47:58.087Z")
        // The ends of the four-digit years, and past them (written wider, not wrapped).
        #expect(UnixMillis(-62_135_596_800_000).rfc3339 == "0001-01-01T00:00:00.000Z")
        #expect(UnixMillis(253_402_300_799_999).rfc3339 == "9999-12-31T23:59:59.999Z")
        #expect(UnixMillis(253_402_300_800_000).rfc3339 == "10000-01-01T00:00:00.000Z")
        #expect(UnixMillis(rfc3339: "2026-11-22T10:00:00.123Z") == UnixMillis(1_795_341_600_123))
        #expect(UnixMillis(rfc3339: "2026-11-22T10:00:00Z") == UnixMillis(1_795_341_600_000))
        #expect(UnixMillis(rfc3339: "2026-11-22T10:00:00.5Z") == UnixMillis(1_795_341_600_500))
        #expect(UnixMillis(rfc3339: "2026-13-22T10:00:00Z") == nil)
        #expect(UnixMillis(rfc3339: "yesterday") == nil)
        for millis in stride(from: Int64(-86_400_000 * 800), to: 4_102_444_800_000, by: 86_399_999 * 37) {
            #expect(UnixMillis(rfc3339: UnixMillis(millis).rfc3339) == UnixMillis(millis))
        }
    }

    @Test("a 410 result becomes a token event keyed topic/token with APNs's timestamp")
    func tokenEventFromResult() throws {
        let event = try #require(TokenEvent(result: sampleResult(), observedAt: sampleResult().sentAt))
        #expect(event.key == "com.example.app/\(tokenA)")
        #expect(event.invalidatedAt == 1_767_225_600_123)
        #expect(event.source == .http2)
        #expect(event.reason == "Unregistered")
        #expect(event.timeIsStated)
        #expect(try TokenEvent(decoding: event.encoded()) == event)
        #expect(String(decoding: event.encoded(), as: UTF8.self) == #"{"token":"\#(tokenA)","topic":"com.example.app","app":"example","reason":"Unregistered","invalidated_at":1767225600123,"source":"http2","job_id":"order-4711-shipped"}"#)
    }

    @Test("only APNs's invalidating answers make token events")
    func tokenEventReasons() {
        var result = sampleResult()
        result.status = 400
        result.reason = "BadDeviceToken"
        result.unregisteredAt = nil
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77))?.invalidatedAt == 77)
        result.reason = "DeviceTokenNotForTopic"
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77)) != nil)
        result.reason = "BadTopic"
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77)) == nil)
        // Any 410: a reason the reference does not list, or none at all.
        result.status = 410
        result.reason = "ExpiredToken"
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77))?.reason == "ExpiredToken")
        result.reason = nil
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77))?.reason == "Unregistered")
        result.reason = ""
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77))?.reason == "Unregistered", "the schema wants a reason")
        var invalid = sampleResult()
        invalid.outcome = .invalid
        invalid.status = nil
        invalid.reason = "BadDeviceToken"
        #expect(TokenEvent(result: invalid, observedAt: UnixMillis(77)) == nil)
    }

    @Test("a 410 timestamp that cannot be APNs's (before 1970, or after the answer) gives way to the answer's time; a result from before 1970 makes no event")
    func implausibleUnregisteredTimes() {
        var result = sampleResult()
        let answered = result.sentAt
        for bogus in [Int64.min, -1, answered.value + 86_400_001, .max] {
            result.unregisteredAt = bogus
            let event = TokenEvent(result: result, observedAt: answered)
            #expect(event?.invalidatedAt == answered.value, "unregistered_at \(bogus)")
            #expect(event?.timeIsStated == false, "dated by the answer, so the ledger bounds its repeats")
        }
        // A day of clock skew between APNs and the worker is APNs's time still.
        result.unregisteredAt = answered.value + 86_400_000
        #expect(TokenEvent(result: result, observedAt: answered)?.invalidatedAt == answered.value + 86_400_000)
        result.unregisteredAt = 0
        #expect(TokenEvent(result: result, observedAt: answered)?.invalidatedAt == 0)
        #expect(TokenEvent(result: result, observedAt: UnixMillis(-1)) == nil)
        #expect(TokenEvent(result: result, observedAt: UnixMillis(.max))?.invalidatedAt == 0, "no overflow adding the skew")
    }

    @Test("a result whose token is not a device token, or whose topic is empty, makes no token event")
    func tokenEventNeedsATokenAndTopic() throws {
        var result = sampleResult()
        result.token = "not-a-token"
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77)) == nil)
        result = sampleResult()
        result.topic = ""
        #expect(TokenEvent(result: result, observedAt: UnixMillis(77)) == nil)
        // Upper-case hex is a device token: the event carries it in lower case, as keys do.
        result = sampleResult()
        result.token = tokenA.uppercased()
        #expect(try #require(TokenEvent(result: result, observedAt: UnixMillis(77))).key == "com.example.app/\(tokenA)")
    }

    @Test("retry headers replace earlier ones and read back")
    func retryHeaders() throws {
        let original = [RecordHeader("apns-token", tokenA), RecordHeader("attempt", "1"), RecordHeader("not-before", "5")]
        let retry = RetryHeaders(attempt: 2, notBefore: UnixMillis(1_767_225_600_000), lastReason: "ServiceUnavailable")
        let headers = retry.applied(to: original)
        #expect(headers.filter { $0.key == "attempt" }.count == 1)
        #expect(headers.first?.key == "apns-token")
        #expect(try RetryHeaders(headers: headers) == retry)
        #expect(try RetryHeaders(headers: [RecordHeader("apns-token", tokenA)]) == nil)
        #expect(throws: ContractDecodingError.self) { try RetryHeaders(headers: [RecordHeader("attempt", "zero")]) }

        // The last answer's status travels too, and replaces an earlier one; one that is no HTTP
        // status is left out rather than refusing the record (it is only reported).
        let answered = RetryHeaders(attempt: 3, notBefore: UnixMillis(5), lastReason: "TooManyRequests", lastStatus: 429)
        let again = answered.applied(to: answered.applied(to: original))
        #expect(again.filter { $0.key == "last-status" }.map(\.text) == ["429"])
        #expect(try RetryHeaders(headers: again) == answered)
        let base = [RecordHeader("attempt", "1"), RecordHeader("not-before", "0")]
        for (text, status) in [("503", 503 as Int?), ("abc", nil), ("99", nil), ("600", nil), ("", nil)] {
            #expect(try RetryHeaders(headers: base + [RecordHeader("last-status", text)])?.lastStatus == status, "\(text)")
        }
    }

    @Test("DLQ headers carry the reason and the source position")
    func deadLetterHeaders() throws {
        let dlq = DeadLetterHeaders(reason: "payload: payload must be a JSON object", source: source)
        let headers = dlq.applied(to: [RecordHeader("app", "example")])
        #expect(headers.map(\.key) == ["app", "dlq-reason", "source-topic", "source-partition", "source-offset"])
        #expect(try DeadLetterHeaders(headers: headers) == dlq)
    }
}

@Suite("APNs reason tables")
struct ReasonTableTests {
    /// Every row of Table 8-6 in the reference, with its status.
    static let table86: [(String, Int)] = [
        ("BadCollapseId", 400), ("BadDeviceToken", 400), ("BadExpirationDate", 400), ("BadMessageId", 400),
        ("BadPriority", 400), ("BadTopic", 400), ("DeviceTokenNotForTopic", 400), ("DuplicateHeaders", 400),
        ("IdleTimeout", 400), ("MissingDeviceToken", 400), ("MissingTopic", 400), ("PayloadEmpty", 400),
        ("TopicDisallowed", 400), ("BadCertificate", 403), ("BadCertificateEnvironment", 403),
        ("ExpiredProviderToken", 403), ("Forbidden", 403), ("InvalidProviderToken", 403),
        ("MissingProviderToken", 403), ("BadPath", 404), ("MethodNotAllowed", 405), ("Unregistered", 410),
        ("PayloadTooLarge", 413), ("TooManyProviderTokenUpdates", 429), ("TooManyRequests", 429),
        ("InternalServerError", 500), ("ServiceUnavailable", 503), ("Shutdown", 503),
    ]

    @Test("every Table 8-6 reason is known with its status, and every status is in Table 8-4")
    func completeness() {
        #expect(APNsReasonTable.entries.count == Self.table86.count)
        for (reason, status) in Self.table86 {
            #expect(APNsReason(rawValue: reason).known?.status == status, "\(reason)")
            #expect(APNsReasonTable.statuses[status] != nil)
        }
        #expect(Set(APNsReasonTable.statuses.keys) == [200, 400, 403, 404, 405, 410, 413, 429, 500, 503])
    }

    @Test("classification: dead tokens, retryable trouble, final rejections, unknown fallback")
    func classification() {
        #expect(APNsReason.unregistered.classification(status: 410) == .tokenInvalidating)
        #expect(APNsReason.badDeviceToken.classification(status: 400) == .tokenInvalidating)
        #expect(APNsReason.deviceTokenNotForTopic.classification(status: 400) == .tokenInvalidating)
        #expect(APNsReason.tooManyRequests.classification(status: 429) == .retryable)
        #expect(APNsReason.serviceUnavailable.classification(status: 503) == .retryable)
        #expect(APNsReason.expiredProviderToken.known?.refreshesProviderToken == true)
        #expect(APNsReason.badTopic.classification(status: 400) == .final)
        let novel = APNsReason(rawValue: "SomethingNew")
        #expect(!novel.isKnown)
        #expect(novel.classification(status: 503) == .retryable)
        #expect(novel.classification(status: 400) == .final)
    }

    @Test("legacy error-response codes of Table 5-1")
    func legacyStatuses() {
        #expect(LegacyErrorStatus.table.keys.sorted() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 255])
        #expect(LegacyErrorStatus.invalidToken.reasonName == "InvalidToken")
        #expect(LegacyErrorStatus.invalidToken.classification == .tokenInvalidating)
        #expect(LegacyErrorStatus.processingError.classification == .retryable)
        #expect(LegacyErrorStatus(code: 10).meaning == "Unknown status 10")
    }

    @Test("outcomes follow docs/design.md's status mapping")
    func outcomes() {
        #expect(NotificationResult.outcome(forStatus: 200) == .delivered)
        for status in [400, 403, 404, 405, 410, 413] {
            #expect(NotificationResult.outcome(forStatus: status) == .rejected)
        }
    }

    @Test("backoff doubles, is capped, and jitters within [delay/2, delay]")
    func backoff() {
        let policy = RetryPolicy(baseDelayMilliseconds: 100, maxDelayMilliseconds: 1000)
        #expect(policy.delayMilliseconds(afterAttempt: 1, jitter: 1) == 100)
        #expect(policy.delayMilliseconds(afterAttempt: 2, jitter: 1) == 200)
        #expect(policy.delayMilliseconds(afterAttempt: 3, jitter: 0) == 200)
        #expect(policy.delayMilliseconds(afterAttempt: 10, jitter: 1) == 1000)
        #expect(policy.delayMilliseconds(afterAttempt: 100, jitter: 0.5) == 750)
    }
}
