import APNsCore
import Testing

let tokenA = String(repeating: "ab", count: 32)
let tokenB = String(repeating: "cd", count: 32)

private func decode(_ text: String, limits: JobDecoder.Limits = .init()) throws(JobRejection) -> NotificationJob {
    try JobDecoder(limits: limits).decodeEnvelope(Array(text.utf8))
}

/// The reason an envelope is rejected with, or nil when it is accepted.
private func rejection(_ text: String) -> String? {
    do {
        _ = try decode(text)
        return nil
    } catch {
        return error.reason
    }
}

private func rejection(bytes: [UInt8]) -> String? {
    do {
        _ = try JobDecoder().decodeEnvelope(bytes)
        return nil
    } catch {
        return error.reason
    }
}

@Suite("Job envelope")
struct JobEnvelopeTests {
    @Test("a minimal job needs only a token and a payload")
    func minimal() throws {
        let job = try decode(#"{"token":"\#(tokenA)","payload":{"aps":{"alert":"hi"}}}"#)
        #expect(job.tokens.map(\.hex) == [tokenA])
        #expect(job.payload.description == #"{"aps":{"alert":"hi"}}"#)
        #expect(job.topic == nil && job.pushType == nil && job.priority == nil && job.id == nil)
        #expect(job.encoding == .envelope)
    }

    @Test("every field of the docs/design.md example is read")
    func fullExample() throws {
        let text = """
            {
              "id": "order-4711-shipped",
              "tokens": ["\(tokenA)", "\(tokenB.uppercased())"],
              "topic": "com.example.app",
              "push_type": "alert",
              "priority": 10,
              "expiration": 0,
              "collapse_id": "order-4711",
              "payload": {"aps": {"alert": "Your order shipped"}},
              "environment": "production",
              "app": "example",
              "deadline": 1767225600,
              "meta": {"campaign": "shipping-updates"},
              "some_future_field": [1, 2, {"x": null}]
            }
            """
        let job = try decode(text)
        #expect(job.id == "order-4711-shipped")
        #expect(job.tokens.map(\.hex) == [tokenA, tokenB])  // upper-case hex is normalised
        #expect(job.topic == "com.example.app")
        #expect(job.pushType == .alert)
        #expect(job.priority == .immediate)
        #expect(job.expiration == 0)
        #expect(job.collapseID == "order-4711")
        #expect(job.environment == .production)
        #expect(job.app == "example")
        #expect(job.deadline == 1_767_225_600)
        #expect(job.meta?.description == #"{"campaign": "shipping-updates"}"#)
    }

    @Test("the payload is the producer's exact bytes, whitespace and key order included")
    func payloadBytesUntouched() throws {
        let payload = #"{ "z" : 1,"aps":{"alert":"caf\u00e9 ☕","sound" :"default"} ,"a":[1e3, -0.5]}"#
        let job = try decode(#"{"payload":\#(payload),"token":"\#(tokenA)"}"#)
        #expect(Array(job.payload.bytes) == Array(payload.utf8))
    }

    @Test("null fields count as absent")
    func nullsAreAbsent() throws {
        let job = try decode(#"{"token":"\#(tokenA)","payload":{},"topic":null,"meta":null,"priority":null}"#)
        #expect(job.topic == nil && job.meta == nil && job.priority == nil)
    }

    @Test(
        "each rule rejects with a reason naming the field",
        arguments: [
            (#"{"payload":{}}"#, "tokens: no device token: give token (a string) or tokens (an array of strings)"),
            (#"{"token":"\#(tokenA)"}"#, "payload: payload is missing"),
            (#"{"token":"\#(tokenA)","payload":[1]}"#, "payload: payload must be a JSON object"),
            (#"{"token":"\#(tokenA)","payload":"{}"}"#, "payload: payload must be a JSON object"),
            (#"{"token":"\#(tokenA)","tokens":["\#(tokenB)"],"payload":{}}"#, "tokens: both token and tokens are given; use one"),
            (#"{"tokens":[],"payload":{}}"#, "tokens: tokens is empty"),
            (#"{"tokens":"\#(tokenA)","payload":{}}"#, "tokens: tokens must be an array of strings, got a string"),
            (#"{"tokens":["\#(tokenA)",7],"payload":{}}"#, "tokens[1]: token must be a string, got a number"),
            (#"{"tokens":["\#(tokenA)","\#(tokenA)"],"payload":{}}"#, "tokens[1]: token repeats tokens[0]"),
            (#"{"token":"xyz","payload":{}}"#, "token: device token is not hex: character 1 is 'x'"),
            (#"{"token":"abc","payload":{}}"#, "token: device token has an odd number of hex digits (3)"),
            (#"{"token":"abcd","payload":{}}"#, "token: device token is 2 bytes; it must be 32 to 100 bytes (64 to 200 hex digits)"),
            (#"{"token":"\#(tokenA)","payload":{},"topic":""}"#, "topic: topic is empty"),
            (#"{"token":"\#(tokenA)","payload":{},"topic":"com.x\napp"}"#, "topic: topic contains control character U+000A at position 6"),
            (#"{"token":"\#(tokenA)","payload":{},"topic":42}"#, "topic: topic must be a string, got a number"),
            (#"{"token":"\#(tokenA)","payload":{},"push_type":"banner"}"#, "push_type: unknown push type \"banner\"; expected one of alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets, controls"),
            (#"{"token":"\#(tokenA)","payload":{},"priority":7}"#, "priority: priority is 7; it must be 10, 5 or 1"),
            (#"{"token":"\#(tokenA)","payload":{},"priority":"10"}"#, "priority: priority must be an integer, got a string"),
            (#"{"token":"\#(tokenA)","payload":{},"priority":10.0}"#, "priority: priority is 10.0; it must be 10, 5 or 1"),
            (#"{"token":"\#(tokenA)","payload":{},"priority":1e400}"#, "priority: priority is 1e400; it must be 10, 5 or 1"),
            (#"{"token":"\#(tokenA)","payload":{},"expiration":-1}"#, "expiration: expiration is -1; it must be a non-negative integer (unix seconds, 0 for now-or-never)"),
            (#"{"token":"\#(tokenA)","payload":{},"expiration":99999999999999999999999}"#, "expiration: expiration is 99999999999999999999999; it must be a non-negative integer (unix seconds, 0 for now-or-never)"),
            (#"{"token":"\#(tokenA)","payload":{},"collapse_id":"\#(String(repeating: "c", count: 65))"}"#, "collapse_id: collapse id is 65 bytes; at most 64 are allowed"),
            (#"{"token":"\#(tokenA)","payload":{},"collapse_id":"a\u0000b"}"#, "collapse_id: collapse_id contains control character U+0000 at position 2"),
            (#"{"token":"\#(tokenA)","payload":{},"environment":"staging"}"#, "environment: unknown environment \"staging\"; expected production or sandbox"),
            (#"{"token":"\#(tokenA)","payload":{},"meta":[]}"#, "meta: meta must be a JSON object"),
            (#"{"token":"\#(tokenA)","payload":{},"deadline":"tomorrow"}"#, "deadline: deadline must be an integer, got a string"),
            (#"{"token":"\#(tokenA)","payload":{},"token":"\#(tokenB)"}"#, "token: key \"token\" appears more than once"),
            // A key written with escapes is the same key: a repeat is caught either way round.
            (#"{"token":"\#(tokenA)","payload":{},"to\u006ben":"\#(tokenB)"}"#, "token: key \"token\" appears more than once"),
            (#"{"x\u0079":1,"token":"\#(tokenA)","payload":{},"xy":2}"#, "xy: key \"xy\" appears more than once"),
            // A key's bad escape is reported before its missing ':'.
            (#"{"\ud800" 1}"#, "invalid JSON at byte 2: unpaired UTF-16 surrogate in \\u escape"),
        ]
    )
    func rules(input: String, reason: String) {
        #expect(rejection(input) == reason)
    }

    @Test("keys are read by their text: escaped known keys count, near-misses are unknown keys")
    func keysByText() throws {
        let job = try decode(#"{"to\u006Ben":"\#(tokenA)","p\u0061yload":{"aps":{}},"\u0074opic":"com.example.app","tokenx":1,"toke":2}"#)
        #expect(job.tokens.map(\.hex) == [tokenA])
        #expect(job.topic == "com.example.app")
        #expect(job.payload.description == #"{"aps":{}}"#)
    }

    @Test("a collapse id of exactly 64 bytes is accepted; multi-byte characters count as bytes")
    func collapseIDBoundary() throws {
        #expect(try decode(#"{"token":"\#(tokenA)","payload":{},"collapse_id":"\#(String(repeating: "c", count: 64))"}"#).collapseID?.utf8.count == 64)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{},"collapse_id":"\#(String(repeating: "é", count: 33))"}"#) == "collapse_id: collapse id is 66 bytes; at most 64 are allowed")
    }

    @Test("payload limits: 4096 bytes, 5120 for voip")
    func payloadLimits() throws {
        func job(payloadBytes: Int, pushType: String) -> String {
            let filler = String(repeating: "x", count: payloadBytes - #"{"p":""}"#.utf8.count)
            return #"{"token":"\#(tokenA)","push_type":"\#(pushType)","payload":{"p":"\#(filler)"}}"#
        }
        #expect(rejection(job(payloadBytes: 4096, pushType: "alert")) == nil)
        #expect(rejection(job(payloadBytes: 4097, pushType: "alert")) == "payload: payload is 4097 bytes; at most 4096 are allowed for push type alert")
        #expect(rejection(job(payloadBytes: 5120, pushType: "voip")) == nil)
        #expect(rejection(job(payloadBytes: 5121, pushType: "voip")) == "payload: payload is 5121 bytes; at most 5120 are allowed for push type voip")
    }

    @Test("meta is limited to 1 KB")
    func metaLimit() {
        let big = String(repeating: "m", count: 1100)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{},"meta":{"k":"\#(big)"}}"#) == "meta: meta is 1108 bytes; at most 1024 are allowed")
    }

    @Test("tokens per job are limited by configuration")
    func tokenLimit() {
        let tokens = (0..<3).map { String(repeating: "0", count: 63) + String($0) }
        let text = #"{"tokens":[\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))],"payload":{}}"#
        #expect(throws: JobRejection(field: "tokens", "3 tokens in one job; at most 2 are allowed")) {
            try decode(text, limits: .init(maximumTokensPerJob: 2))
        }
        #expect((try? decode(text, limits: .init(maximumTokensPerJob: 3)))?.tokens.count == 3)
    }
}

@Suite("Hostile input")
struct HostileInputTests {
    @Test(
        "malformed records are rejected with a reason, never a crash",
        arguments: [
            ("", "empty record: expected a JSON job envelope (or an apns-token header with a raw payload)"),
            ("   ", "invalid JSON at byte 3: empty input, expected a JSON object"),
            (#"{"token":"abc"#, "invalid JSON at byte 9: unterminated string"),
            (#"{"token":"\#(tokenA)","payload":{"aps":{}"#, "invalid JSON at byte 95: unexpected end of input (expected ',' or '}' in object)"),
            ("[1,2,3]", "invalid JSON at byte 0: expected a JSON object"),
            ("null", "invalid JSON at byte 0: expected a JSON object"),
            (#"{"token":"\#(tokenA)","payload":{}} trailing"#, "invalid JSON at byte 90: unexpected data after the JSON value"),
            (#"{"token":"\#(tokenA)","payload":{"a":01}}"#, "invalid JSON at byte 91: leading zero in number"),
            (#"{'token':1}"#, "invalid JSON at byte 1: expected a string key in object"),
            (#"{"token":tru}"#, "invalid JSON at byte 9: invalid literal"),
        ]
    )
    func malformed(input: String, reason: String) {
        #expect(rejection(input) == reason)
    }

    @Test("deep nesting is bounded")
    func deepNesting() {
        let deep = String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000)
        let reason = rejection(#"{"token":"\#(tokenA)","payload":{"x":\#(deep)}}"#)
        #expect(reason?.hasSuffix("nested deeper than 64 levels") == true)
    }

    @Test("an envelope may nest 64 levels in all, counting itself, as a header-encoded job's payload may")
    func nestingLimitCountsTheEnvelope() {
        // The envelope is level 1, the payload object level 2: `levels` arrays inside reach level 2 + levels.
        func envelope(levels: Int) -> String {
            #"{"token":"\#(tokenA)","payload":{"x":\#(String(repeating: "[", count: levels) + String(repeating: "]", count: levels))}}"#
        }
        #expect(rejection(envelope(levels: 62)) == nil)
        #expect(rejection(envelope(levels: 63))?.hasSuffix("nested deeper than 64 levels") == true)
    }

    @Test("invalid UTF-8 anywhere is rejected")
    func invalidUTF8() {
        var bytes = Array(#"{"token":"\#(tokenA)","payload":{"aps":{"alert":"x"}}}"#.utf8)
        let x = bytes.count - 5  // the "x" of the alert
        #expect(bytes[x] == UInt8(ascii: "x"))
        bytes[x] = 0xC3  // a truncated two-byte sequence
        #expect(rejection(bytes: bytes)?.contains("UTF-8") == true)
        var overlong = Array(#"{"token":"\#(tokenA)","payload":{},"topic":"ab"}"#.utf8)
        overlong.replaceSubrange((overlong.count - 3)..<(overlong.count - 2), with: [0xC0, 0xAF])
        #expect(rejection(bytes: overlong)?.contains("invalid UTF-8") == true)
    }

    @Test("a lone surrogate escape in a decoded field is rejected")
    func loneSurrogate() {
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{},"topic":"\ud800x"}"#)?.contains("unpaired UTF-16 surrogate") == true)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{},"topic":"\ud83d\ude00"}"#) == nil)
        // Also inside values that are only checked, not decoded: the payload goes to APNs and
        // meta into every result, where strict parsers refuse a lone surrogate.
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{"aps":{"alert":"\ud800"}}}"#)?.contains("unpaired UTF-16 surrogate") == true)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{},"meta":{"x":"\udc00"}}"#)?.contains("unpaired UTF-16 surrogate") == true)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{"aps":{"alert":"\ud83d\ude00"}}}"#) == nil)
    }

    @Test("a reason stays short however long the value it quotes, combining marks included")
    func reasonsAreBounded() {
        let marks = "a" + String(repeating: "\u{0301}", count: 100_000)
        let reason = rejection(#"{"token":"\#(tokenA)","payload":{},"push_type":"\#(marks)"}"#)
        #expect(reason?.hasPrefix("push_type: unknown push type") == true)
        #expect((reason?.utf8.count ?? .max) < 1100, "\(reason?.utf8.count ?? 0) bytes")
    }

    @Test("huge strings and 1 MB values are refused by size, not parsed forever")
    func hugeValues() {
        let huge = String(repeating: "a", count: 1_048_576)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{"big":"\#(huge)"}}"#) == "record is 1048673 bytes; at most 524288 are accepted")
        let big = String(repeating: "a", count: 300_000)
        #expect(rejection(#"{"token":"\#(tokenA)","payload":{"big":"\#(big)"}}"#) == "payload: payload is 300010 bytes; at most 5120 are allowed for push type voip")
    }

    @Test("raw control characters inside strings are rejected")
    func rawControlCharacters() {
        #expect(rejection("{\"token\":\"\(tokenA)\",\"payload\":{\"a\":\"x\ty\"}}")?.contains("raw control character 0x9") == true)
    }
}
