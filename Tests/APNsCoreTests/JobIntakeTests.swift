import APNsCore
import Testing

@Suite("Job intake: records become work or invalid results")
struct JobIntakeTests {
    static let key = AppConfiguration.Authentication.token(keyFile: "/k.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
    let intake = JobIntake(
        configuration: FleetConfiguration(apps: [
            AppConfiguration(name: "example", authentication: key, defaults: JobDefaults(topic: "com.example.app")),
            AppConfiguration(name: "other", authentication: key, topics: ["com.other"]),
        ], defaultApp: "example"),
        workerID: "w1"
    )
    let source = SourcePosition(topic: "apns.jobs", partition: 2, offset: 40)
    let now = UnixMillis(1_795_341_600_000)

    func accept(_ text: String, headers: [RecordHeader] = []) -> IntakeDecision {
        intake.accept(value: Array(text.utf8), headers: headers, source: source, now: now)
    }

    /// As consumed from the retry topic, the only one whose retry headers are the worker's.
    func acceptRetry(_ text: String, headers: [RecordHeader]) -> IntakeDecision {
        intake.accept(value: Array(text.utf8), headers: headers, source: SourcePosition(topic: "apns.jobs.retry", partition: 2, offset: 40), now: now)
    }

    @Test("a good job is accepted with the app's defaults and a derived id")
    func accepted() throws {
        guard case .accepted(let job) = accept(#"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{"aps":{}}}"#) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(job.jobID == "apns.jobs-2-40")
        #expect(job.appName == "example")
        #expect(job.job.topic == "com.example.app")
        #expect(job.tokens.map(\.hex) == [tokenA, tokenB])
        #expect(job.previousAttempts == 0 && job.notBefore == nil)
    }

    @Test("an unknown app gives one invalid result per token and a DLQ copy of the original bytes")
    func unknownApp() throws {
        let text = #"{"id":"j9","tokens":["\#(tokenA)","\#(tokenB)"],"payload":{},"app":"ghost","meta":{"c":1}}"#
        guard case .rejected(let rejected) = accept(text, headers: [RecordHeader("trace", "t1")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.token) == [tokenA, tokenB])
        #expect(rejected.results.allSatisfy { $0.outcome == .invalid && $0.jobID == "j9" && $0.status == nil })
        #expect(rejected.results.first?.reason == "app: unknown app \"ghost\"; configured apps: example, other")
        #expect(rejected.results.first?.meta?.description == #"{"c":1}"#)
        #expect(rejected.deadLetterValue == Array(text.utf8))
        let dlq = try DeadLetterHeaders(headers: rejected.deadLetterHeaders)
        #expect(dlq.reason == rejected.rejection.reason)
        #expect(dlq.source == source)
        #expect(rejected.deadLetterHeaders.first == RecordHeader("trace", "t1"))
    }

    @Test("an undecodable record still gets a result: per readable token, or one with an empty token")
    func undecodable() {
        guard case .rejected(let broken) = accept("{not json") else {
            Issue.record("expected a rejection")
            return
        }
        #expect(broken.results.map(\.token) == [""])
        #expect(broken.results.first?.jobID == "apns.jobs-2-40")
        guard case .rejected(let badPayload) = accept(#"{"tokens":["\#(tokenA)","zz"],"payload":{}}"#) else {
            Issue.record("expected a rejection")
            return
        }
        // The unreadable entry gets its result too, under an empty token.
        #expect(badPayload.results.map(\.token) == [tokenA, ""])
        guard case .rejected(let withID) = accept(#"{"id":"order-1","token":"\#(tokenA)","payload":[]}"#) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(withID.results.first?.jobID == "order-1", "a readable id survives a failed validation")
        #expect(badPayload.results.first?.reason == "tokens[1]: device token is not hex: character 1 is 'z'")
    }

    @Test("an unusable header-encoded job keeps its job-id header; a null token or tokens adds no result")
    func unusableHeaderJobAndNulls() {
        guard case .rejected(let header) = accept("{}", headers: [RecordHeader("apns-token", "zz"), RecordHeader("job-id", "order-9")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(header.results.map(\.jobID) == ["order-9"])
        guard case .rejected(let nulls) = accept(#"{"id":"n1","token":null,"tokens":["\#(tokenA)","\#(tokenA)"],"payload":[]}"#) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(nulls.results.map(\.token) == [tokenA], "null is absent, a repeat is one token")
    }

    @Test("a syntax error deep in the payload costs no device its result and keeps the producer's id")
    func syntaxErrorAfterTokens() {
        // A Latin-1 byte in the payload: the record is not JSON, but what came before stands.
        var bytes = Array(#"{"id":"order-1","tokens":["\#(tokenA)","\#(tokenB)","nope"],"payload":{"aps":{"alert":"caf"#.utf8)
        bytes += [0xE9] + Array(#""}}}"#.utf8)
        guard case .rejected(let rejected) = intake.accept(value: bytes, headers: [], source: source, now: now) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.token) == [tokenA, tokenB, ""])
        #expect(rejected.results.allSatisfy { $0.jobID == "order-1" })
        #expect(rejected.rejection.reason.contains("UTF-8"), "\(rejected.rejection.reason)")
    }

    @Test("a job that does not decode keeps its app, topic and meta in its invalid results, each where it is valid on its own")
    func undecodableKeepsItsContext() {
        func results(_ text: String, headers: [RecordHeader] = []) -> [NotificationResult] {
            guard case .rejected(let rejected) = accept(text, headers: headers) else { return [] }
            return rejected.results
        }
        // A bad token (the most common invalid job): the campaign is still known.
        let badToken = results(#"{"tokens":["\#(tokenA)","abc"],"app":"shop","topic":"com.shop","meta":{ "campaign" : "x" },"payload":{}}"#)
        #expect(badToken.map(\.token) == [tokenA, ""])
        #expect(badToken.first?.meta?.description == #"{ "campaign" : "x" }"#, "the producer's bytes, verbatim")
        #expect(badToken.first?.app == "shop" && badToken.first?.topic == "com.shop")
        // Cut short after meta: what came before the syntax error stands.
        let truncated = results(#"{"meta":{"campaign":"y"},"app":"shop","tokens":["\#(tokenA)""#)
        #expect(truncated.first?.meta?.description == #"{"campaign":"y"}"#)
        #expect(truncated.first?.app == "shop")
        // Fields that are not valid on their own are left out.
        let bad = results(#"{"tokens":["zz"],"app":"","topic":"bad\u0001topic","meta":[1],"payload":{}}"#)
        #expect(bad.first?.meta == nil && bad.first?.app == nil && bad.first?.topic == nil)
        // A header job whose token is bad keeps its meta header.
        let header = results(#"{"aps":{}}"#, headers: [RecordHeader("apns-token", "not-hex"), RecordHeader("meta", #"{"campaign":"z"}"#), RecordHeader("app", "shop")])
        #expect(header.first?.meta?.description == #"{"campaign":"z"}"#)
        #expect(header.first?.app == "shop")
        // A JSON job's retry record carries a job-id header: still an envelope, its fields still read.
        let retried = results(#"{"tokens":["zz"],"app":"shop","meta":{"campaign":"r"},"payload":{}}"#, headers: [RecordHeader("job-id", "j7")])
        #expect(retried.first?.meta?.description == #"{"campaign":"r"}"# && retried.first?.app == "shop")
        // Header-encoded but missing apns-token: the value is still an APNs payload, whose own keys are not the job's.
        let noToken = results(#"{"aps":{},"meta":{"campaign":"payload's"},"topic":"com.payload"}"#, headers: [RecordHeader("apns-topic", "com.shop")])
        #expect(noToken.first?.meta == nil && noToken.first?.topic == "com.shop")
    }

    @Test("a header-encoded job refused is named by its record, not by keys of its APNs payload")
    func refusedHeaderJobKeepsItsOwnIdentity() {
        // The payload is the app's own JSON: its `id` and `tokens` keys say nothing about the job.
        let payload = #"{"aps":{},"id":"promo-1","tokens":["\#(tokenB)"]}"#
        guard case .rejected(let badPriority) = accept(payload, headers: [RecordHeader("apns-token", tokenA), RecordHeader("apns-priority", "7")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(badPriority.results.map(\.jobID) == ["apns.jobs-2-40"])
        #expect(badPriority.results.map(\.token) == [tokenA])
        guard case .rejected(let emptyToken) = accept(payload, headers: [RecordHeader("apns-token", "")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(emptyToken.results.map(\.token) == [""], "one result, under no token: the payload's tokens are not the job's")
        #expect(emptyToken.results.map(\.jobID) == ["apns.jobs-2-40"])
    }

    @Test("a record over the size limit still gets its results under its own id and tokens")
    func oversizeRecordKeepsItsIdentity() {
        let filler = String(repeating: "x", count: 600 * 1024)
        guard case .rejected(let rejected) = accept(#"{"id":"huge","tokens":["\#(tokenA)","\#(tokenB)"],"payload":{"f":"\#(filler)"}}"#) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.jobID) == ["huge", "huge"])
        #expect(rejected.results.map(\.token) == [tokenA, tokenB])
        #expect(rejected.rejection.reason.contains("at most 524288 are accepted"), "\(rejected.rejection.reason)")
    }

    @Test("a job with as many tokens as the largest token limit allows fits in a record, beside a full payload")
    func largestFanOutFits() throws {
        let count = JobDecoder.Limits.tokensThatFit
        let tokens = (0..<count).map { index in
            let digits = String(index, radix: 16)
            return "\"" + String(repeating: "0", count: 64 - digits.count) + digits + "\""
        }.joined(separator: ",")
        let payload = #"{"aps":{"alert":""# + String(repeating: "x", count: 4070) + #""}}"#
        let text = #"{"id":"big","topic":"com.example.app","tokens":[\#(tokens)],"payload":\#(payload)}"#
        #expect(text.utf8.count <= 512 * 1024, "\(text.utf8.count) bytes")
        let intake = JobIntake(configuration: FleetConfiguration(
            apps: [AppConfiguration(name: "example", authentication: Self.key, defaults: JobDefaults(topic: "com.example.app"))],
            worker: WorkerSettings(maxTokensPerJob: count)
        ), workerID: "w1")
        guard case .accepted(let job) = intake.accept(value: Array(text.utf8), headers: [], source: source, now: now) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(job.tokens.count == count)
    }

    @Test("a retry record keeps its job id, attempt count, not-before time and remaining tokens")
    func retryRecord() {
        let retry = RetryHeaders(attempt: 3, notBefore: UnixMillis(now.value + 500), lastReason: "ServiceUnavailable")
        let headers = retry.applied(to: [RecordHeader("job-id", "apns.jobs-0-7"), RecordHeader(JobIntake.retryTokensKey, tokenB)])
        guard case .accepted(let job) = intake.accept(
            value: Array(#"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{}}"#.utf8), headers: headers,
            source: SourcePosition(topic: "apns.jobs.retry", partition: 0, offset: 1), now: now
        ) else {
            Issue.record("expected the retry to be accepted")
            return
        }
        #expect(job.jobID == "apns.jobs-0-7")
        #expect(job.previousAttempts == 3)
        #expect(job.notBefore == UnixMillis(now.value + 500))
        #expect(job.tokens.map(\.hex) == [tokenB])
    }

    @Test("a job on a topic with a 249-character name gets a derived id within 256 bytes, which its retry keeps")
    func derivedIDOfLongTopic() {
        // Kafka's longest topic name: `<topic>-<partition>-<offset>` would not fit in a job id.
        let longTopic = String(repeating: "t", count: 240) + ".jobs.ab"
        let sibling = String(repeating: "t", count: 240) + ".jobs.ac"
        let first = SourcePosition(topic: longTopic, partition: 11, offset: 9_000_000_000)
        let derived = first.derivedJobID
        #expect(derived.utf8.count <= JobRules.maximumIdentifierBytes)
        #expect(derived.hasPrefix(String(repeating: "t", count: 200)) && derived.hasSuffix("-11-9000000000"))
        #expect(derived != SourcePosition(topic: sibling, partition: 11, offset: 9_000_000_000).derivedJobID)
        #expect(derived == SourcePosition(topic: longTopic, partition: 11, offset: 9_000_000_000).derivedJobID)
        // Topics that fit keep the plain form.
        #expect(SourcePosition(topic: "apns.jobs", partition: 2, offset: 40).derivedJobID == "apns.jobs-2-40")

        // A header-encoded job names its id in the same `job-id` header the retry record carries,
        // where it is held to the 256-byte limit.
        let headers = [RecordHeader(JobDecoder.tokenHeader, tokenA)]
        let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)
        guard case .accepted(let job) = intake.accept(value: payload, headers: headers, source: first, now: now) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(job.jobID == derived)
        let retry = RetryHeaders(attempt: 1, notBefore: UnixMillis(now.value), lastReason: "ServiceUnavailable")
        guard case .accepted(let again) = intake.accept(
            value: payload, headers: retry.applied(to: headers + [RecordHeader("job-id", job.jobID)]),
            source: SourcePosition(topic: "apns.jobs.retry", partition: 0, offset: 5), now: now
        ) else {
            Issue.record("expected the retry record to be accepted")
            return
        }
        #expect(again.jobID == derived)
        #expect(again.previousAttempts == 1)
    }

    @Test("a retry record that has become unusable gives failed results, with its attempts, for its own tokens only")
    func unusableRetryRecord() {
        // The app was removed from the configuration while the record waited: tokenA was
        // delivered on the first attempt, only tokenB was left to retry.
        let retry = RetryHeaders(attempt: 2, notBefore: UnixMillis(now.value), lastReason: "ServiceUnavailable")
        let headers = retry.applied(to: [RecordHeader("job-id", "j7"), RecordHeader(JobIntake.retryTokensKey, tokenB)])
        guard case .rejected(let rejected) = intake.accept(
            value: Array(#"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{},"app":"gone"}"#.utf8), headers: headers,
            source: SourcePosition(topic: "apns.jobs.retry", partition: 0, offset: 3), now: now
        ) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.token) == [tokenB])
        #expect(rejected.results.map(\.jobID) == ["j7"])
        // Sent twice already (APNs may have delivered it): not `invalid`, which says "never sent".
        #expect(rejected.results.map(\.outcome) == [.failed])
        #expect(rejected.results.map(\.attempts) == [2])
        #expect(rejected.results.first?.reason?.hasSuffix("(the retry record became unusable after 2 attempts)") == true, "\(rejected.results.first?.reason ?? "")")
        #expect(rejected.deadLetterValue.isEmpty == false, "still copied to the DLQ")
    }

    @Test("malformed retry headers make the record invalid instead of stopping the partition")
    func badRetryHeaders() {
        guard case .rejected(let rejected) = acceptRetry(#"{"token":"\#(tokenA)","payload":{}}"#, headers: [RecordHeader("attempt", "-4")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.first?.reason == "attempt header: must be an integer from 1 to 1000000, got \"-4\"")
        #expect(rejected.results.first?.outcome == .invalid, "no valid attempt: nothing says it was ever sent")

        // A valid attempt beside a damaged not-before: it was sent before, so failed, with its attempts.
        guard case .rejected(let damaged) = acceptRetry(#"{"token":"\#(tokenA)","payload":{}}"#, headers: [RecordHeader("attempt", "2"), RecordHeader("not-before", "soon")]) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(damaged.results.map(\.outcome) == [.failed])
        #expect(damaged.results.map(\.attempts) == [2])
    }

    @Test("a retry record whose job no longer decodes answers only for the tokens it names, each once")
    func undecodableRetryRecord() {
        // tokenA was delivered; the record retries tokenB, but its body no longer decodes (a
        // limit lowered since, say): tokenA must not get a second, invalid, result.
        let retry = RetryHeaders(attempt: 1, notBefore: UnixMillis(now.value), lastReason: "ServiceUnavailable")
        let headers = retry.applied(to: [RecordHeader("job-id", "j8"), RecordHeader(JobIntake.retryTokensKey, "\(tokenB),\(tokenB)")])
        guard case .rejected(let rejected) = acceptRetry(#"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{},"priority":7}"#, headers: headers) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.token) == [tokenB])

        // The same record with a body that decodes: naming a token twice is refused, not sent twice.
        guard case .rejected(let twice) = acceptRetry(#"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{}}"#, headers: headers) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(twice.results.map(\.token) == [tokenB])
        #expect(twice.results.first?.reason?.contains("is named twice") == true)
    }

    @Test("deadlines and expirations past year 9999 are refused as probably milliseconds, not wrapped")
    func farFutureTimestamps() {
        guard case .rejected(let rejected) = accept(#"{"token":"\#(tokenA)","payload":{},"deadline":1152921504606846976}"#) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.first?.reason?.contains("it must be unix seconds, at most 253402300799") == true)
        guard case .accepted = accept(#"{"token":"\#(tokenA)","payload":{},"expiration":253402300799}"#) else {
            Issue.record("the last second of year 9999 is accepted")
            return
        }
    }

    @Test("a retry record with malformed retry headers keeps its job id and answers only for the tokens it was retrying")
    func badRetryHeadersOfAFanOut() {
        let text = #"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{}}"#
        let headers = [RecordHeader("attempt", "x"), RecordHeader("job-id", "job-7"), RecordHeader("retry-tokens", tokenB)]
        guard case .rejected(let rejected) = acceptRetry(text, headers: headers) else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.results.map(\.token) == [tokenB], "tokenA already has its result")
        #expect(rejected.results.allSatisfy { $0.jobID == "job-7" })
    }
}

extension JobIntakeTests {
    @Test("retry headers a producer puts on a job topic are its own: they skip no token, fail nothing unsent and set no id")
    func retryHeadersOnAJobTopicIgnored() {
        let text = #"{"tokens":["\#(tokenA)","\#(tokenB)"],"payload":{}}"#
        let headers = [
            RecordHeader("attempt", "12"), RecordHeader("not-before", "0"), RecordHeader("last-reason", "mine"),
            RecordHeader("retry-tokens", tokenA), RecordHeader("job-id", "producer-header"),
        ]
        guard case .accepted(let job) = accept(text, headers: headers) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(job.tokens.map(\.hex) == [tokenA, tokenB], "every token is sent")
        #expect(job.previousAttempts == 0 && job.notBefore == nil && job.previousReason == nil)
        #expect(job.jobID == source.derivedJobID)
        // Headers that would make a retry record invalid are no reason to refuse a job.
        guard case .accepted = accept(text, headers: [RecordHeader("attempt", "1")]) else {
            Issue.record("a job with an attempt header of its own is accepted")
            return
        }
        // On the retry topic the same headers are the worker's.
        guard case .accepted(let retry) = acceptRetry(text, headers: headers) else {
            Issue.record("expected the retry record to be accepted")
            return
        }
        #expect(retry.tokens.map(\.hex) == [tokenA] && retry.previousAttempts == 12 && retry.jobID == "producer-header")
    }

    @Test("a retry record's job-id header that is no valid id is replaced by the derived one, not copied into every result")
    func badInheritedJobID() {
        let text = #"{"token":"\#(tokenA)","payload":{}}"#
        let retry = RetryHeaders(attempt: 1, notBefore: UnixMillis(now.value), lastReason: "ServiceUnavailable")
        guard case .accepted(let job) = acceptRetry(text, headers: retry.applied(to: [RecordHeader("job-id", String(repeating: "x", count: 300))])) else {
            Issue.record("expected the retry record to be accepted")
            return
        }
        #expect(job.jobID == "apns.jobs.retry-2-40")
    }
}

@Suite("Job intake for binary-interface apps")
struct BinaryIntakeTests {
    @Test("a payload the legacy interface cannot carry is invalid, with the limit named")
    func oversizeForBinary() {
        let app = AppConfiguration(
            name: "legacy", authentication: .certificate(.pkcs12(file: "/dev/null", password: nil)),
            defaults: JobDefaults(topic: "com.example.legacy"), transport: .binary
        )
        let intake = JobIntake(configuration: FleetConfiguration(apps: [app]), workerID: "w")
        let token = String(repeating: "ab", count: 32)
        let small = Array(#"{"token":"\#(token)","payload":{"aps":{"alert":"hi"}}}"#.utf8)
        let big = Array(#"{"token":"\#(token)","payload":{"aps":{"alert":"\#(String(repeating: "x", count: 300))"}}}"#.utf8)
        let source = SourcePosition(topic: "apns.jobs", partition: 0, offset: 7)
        guard case .accepted = intake.accept(value: small, headers: [], source: source, now: UnixMillis(0)) else {
            Issue.record("a small payload must be accepted")
            return
        }
        guard case .rejected(let rejected) = intake.accept(value: big, headers: [], source: source, now: UnixMillis(0)) else {
            Issue.record("an oversize payload must be rejected")
            return
        }
        #expect(rejected.rejection.reason == "payload: payload is 320 bytes; the legacy binary interface (protocol binary) allows at most 256")
        #expect(rejected.results.map(\.outcome) == [.invalid])
    }

    @Test("a VoIP job stating its app's topic with the .voip suffix is routed to that app")
    func suffixedTopicRoutesToItsApp() throws {
        let intake = JobIntake(configuration: FleetConfiguration(apps: [
            AppConfiguration(name: "a", authentication: JobIntakeTests.key, defaults: JobDefaults(topic: "com.a")),
            AppConfiguration(name: "b", authentication: JobIntakeTests.key, defaults: JobDefaults(topic: "com.b")),
        ]), workerID: "w1")
        let value = Array(#"{"token":"\#(tokenA)","topic":"com.b.voip","push_type":"voip","payload":{}}"#.utf8)
        guard case .accepted(let job) = intake.accept(value: value, headers: [], source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 7), now: UnixMillis(0)) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(job.appName == "b" && job.job.topic == "com.b.voip")

        // An app that names the topic outright wins, whatever the order of apps.
        let split = JobIntake(configuration: FleetConfiguration(apps: [
            AppConfiguration(name: "main", authentication: JobIntakeTests.key, defaults: JobDefaults(topic: "com.b")),
            AppConfiguration(name: "voip", authentication: JobIntakeTests.key, defaults: JobDefaults(topic: "com.b.voip", pushType: .voip)),
        ]), workerID: "w1")
        guard case .accepted(let routed) = split.accept(value: value, headers: [], source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 7), now: UnixMillis(0)) else {
            Issue.record("expected the job to be accepted")
            return
        }
        #expect(routed.appName == "voip")
    }

    @Test("apps on the legacy binary interface, which sends no topic, keep their topic whatever the push type")
    func binaryAppsKeepTheirTopic() throws {
        let app = AppConfiguration(
            name: "legacy", authentication: .certificate(.pkcs12(file: "/dev/null", password: nil)),
            defaults: JobDefaults(topic: "com.example.legacy", pushType: .voip), transport: .binary
        )
        let intake = JobIntake(configuration: FleetConfiguration(apps: [app]), workerID: "w")
        for text in [#"{"token":"\#(tokenA)","payload":{}}"#, #"{"token":"\#(tokenA)","topic":"com.example.legacy","payload":{}}"#] {
            guard case .accepted(let job) = intake.accept(value: Array(text.utf8), headers: [], source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 7), now: UnixMillis(0)) else {
                Issue.record("expected \(text) to be accepted")
                continue
            }
            // Its results and token events carry the topic the feedback service's events carry.
            #expect(job.job.topic == "com.example.legacy")
        }
    }
}
