import APNsCore
import Testing

/// Inputs `make fuzz` found (see Tests/Corpus/fuzz-seeds/*/regression-*), pinned as unit tests.
@Suite("Fuzz regressions")
struct FuzzRegressionTests {
    static let token = String(repeating: "ab", count: 32)
    static let intake = JobIntake(
        configuration: FleetConfiguration(apps: [
            AppConfiguration(
                name: "example", authentication: .token(keyFile: "/k.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ"),
                defaults: JobDefaults(topic: "com.example.app")
            ),
        ]),
        workerID: "w1"
    )

    static func reason(_ value: [UInt8], headers: [RecordHeader] = [], topic: String = "apns.jobs") -> String? {
        let source = SourcePosition(topic: topic, partition: 0, offset: 1)
        guard case .rejected(let rejected) = intake.accept(value: value, headers: headers, source: source, now: UnixMillis(0)) else { return nil }
        return rejected.rejection.reason
    }

    @Test(
        "a backslash as the very last byte ends the record instead of spinning forever",
        arguments: [#"{"token":"\"#, #"{"id":"x","token":"\#(token)","payload":{"aps":{"alert":"x\"#, #"{"a\"#]
    )
    func trailingBackslash(input: String) {
        #expect(Self.reason(Array(input.utf8))?.hasSuffix("unterminated string") == true)
    }

    @Test("a trailing backslash in a header-encoded payload or meta header is rejected too")
    func trailingBackslashInHeaderJob() {
        #expect(Self.reason(Array(#"{"a":"\"#.utf8), headers: [RecordHeader("apns-token", Self.token)]) == "payload: invalid JSON at byte 5: unterminated string")
        #expect(Self.reason(Array("{}".utf8), headers: [RecordHeader("apns-token", Self.token), RecordHeader("meta", #"{"a":"\"#)])?.hasSuffix("unterminated string") == true)
    }

    @Test(
        "header values with CR, LF or NUL are escaped in the reason, never copied raw",
        arguments: [
            ("attempt", "1\r\nX-Forged: 1", "attempt header: must be an integer from 1 to 1000000, got \"1\\u000d\\u000aX-Forged: 1\""),
            ("apns-priority", "10\r\nX-Forged: 1", "apns-priority header: priority is 10\\u000d\\u000aX-Forged: 1; it must be 10, 5 or 1"),
            ("apns-expiration", "0\u{0}1", "apns-expiration header: expiration is 0\\u00001; it must be a non-negative integer (unix seconds, 0 for now-or-never)"),
        ]
    )
    func controlCharactersEscaped(key: String, value: String, reason: String) {
        let headers = [RecordHeader("apns-token", Self.token), RecordHeader(key, value), RecordHeader("not-before", "0")]
        // The retry topic's: the only records whose `attempt` header is read.
        let actual = Self.reason(Array("{}".utf8), headers: headers, topic: "apns.jobs.retry")
        #expect(actual == reason)
        #expect(actual?.unicodeScalars.contains { $0.value < 0x20 } == false)
    }

    @Test("keys that differ only in Unicode normalization are different keys, not a repeat")
    func canonicallyEquivalentKeysAreDistinct() {
        // An unknown key precomposed, then decomposed (as escapes and as raw UTF-8).
        #expect(Self.reason(Array(#"{"token":"\#(Self.token)","payload":{},"caf\u00e9":1,"cafe\u0301":2}"#.utf8)) == nil)
        #expect(Self.reason(Array("{\"token\":\"\(Self.token)\",\"payload\":{},\"caf\u{E9}\":1,\"cafe\u{301}\":2}".utf8)) == nil)
        #expect(Self.reason(Array(#"{"token":"\#(Self.token)","payload":{},"caf\u00e9":1,"café":2}"#.utf8)) != nil, "the same key, escaped or not")
    }

    @Test("a repeated key with a control character names the key escaped, never raw")
    func repeatedKeyWithControlCharacter() {
        let reason = Self.reason(Array(#"{"a\tb":1,"a\tb":2}"#.utf8))
        #expect(reason == #"a\u0009b: key "a\u0009b" appears more than once"#)
        #expect(reason?.unicodeScalars.contains { $0.value < 0x20 } == false)
    }
}
