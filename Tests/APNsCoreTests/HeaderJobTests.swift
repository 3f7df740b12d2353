import APNsCore
import Testing

private let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

private func headerJob(_ headers: [(String, String)], value: [UInt8] = payload) throws(JobRejection) -> NotificationJob {
    try JobDecoder().decode(value: value, headers: headers.map { RecordHeader($0.0, $0.1) })
}

private func headerRejection(_ headers: [(String, String)], value: [UInt8] = payload) -> String? {
    do {
        _ = try headerJob(headers, value: value)
        return nil
    } catch {
        return error.reason
    }
}

@Suite("Job in headers plus raw payload")
struct HeaderJobTests {
    @Test("a meta header nests at most 63 levels of its own: every result carries it one level down, as an envelope's")
    func metaHeaderDepth() throws {
        func meta(levels: Int) -> String { String(repeating: #"{"a":"#, count: levels - 1) + "{}" + String(repeating: "}", count: levels - 1) }
        _ = try headerJob([("apns-token", tokenA), ("meta", meta(levels: 63))])
        #expect(headerRejection([("apns-token", tokenA), ("meta", meta(levels: 64))])?.hasSuffix("nested deeper than 63 levels") == true)
    }

    @Test("all docs/design.md headers are read, and the record value is the payload as is")
    func allHeaders() throws {
        let job = try headerJob([
            ("apns-token", tokenA), ("apns-topic", "com.example.app"), ("apns-push-type", "background"),
            ("apns-priority", "5"), ("apns-expiration", "1767225600"), ("apns-collapse-id", "c1"),
            ("apns-id", "123E4567-E89B-12D3-A456-426655440000"), ("job-id", "j-1"), ("app", "example"),
            ("meta", #"{"campaign":"x"}"#), ("unrelated", "ignored"),
        ])
        #expect(job.encoding == .headers)
        #expect(job.tokens.map(\.hex) == [tokenA])
        #expect(job.topic == "com.example.app")
        #expect(job.pushType == .background)
        #expect(job.priority == .powerConsiderate)
        #expect(job.expiration == 1_767_225_600)
        #expect(job.collapseID == "c1")
        #expect(job.apnsID == "123e4567-e89b-12d3-a456-426655440000")
        #expect(job.id == "j-1")
        #expect(job.app == "example")
        #expect(job.meta?.description == #"{"campaign":"x"}"#)
        #expect(Array(job.payload.bytes) == payload)
    }

    @Test(
        "header rules give the same reasons as the envelope, naming the header",
        arguments: [
            ([("apns-token", "zz")], "apns-token header: device token is not hex: character 1 is 'z'"),
            ([("apns-token", tokenA), ("apns-topic", "com.x\r\nX-Evil: 1")], "apns-topic header: topic contains control character U+000D at position 6"),
            ([("apns-token", tokenA), ("apns-collapse-id", "a\nb")], "apns-collapse-id header: collapse_id contains control character U+000A at position 2"),
            ([("apns-token", tokenA), ("apns-priority", "11")], "apns-priority header: priority is 11; it must be 10, 5 or 1"),
            ([("apns-token", tokenA), ("apns-expiration", "soon")], "apns-expiration header: expiration is soon; it must be a non-negative integer (unix seconds, 0 for now-or-never)"),
            ([("apns-token", tokenA), ("apns-id", "not-a-uuid")], "apns-id header: apns-id \"not-a-uuid\" is not a canonical UUID (8-4-4-4-12 hex digits)"),
            ([("apns-token", tokenA), ("apns-push-type", "ALERT")], "apns-push-type header: unknown push type \"ALERT\"; expected one of alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets, controls"),
            ([("apns-token", tokenA), ("apns-topic", "a"), ("apns-topic", "b")], "apns-topic header: header apns-topic appears more than once"),
            ([("apns-token", tokenA), ("x-trace-id", "1"), ("x-trace-id", "2"), ("apns-token", tokenA)], "apns-token header: header apns-token appears more than once"),
            ([("apns-token", tokenA), ("meta", "[1]")], "meta header: meta must be a JSON object: invalid JSON at byte 0: expected a JSON object"),
            // Integers as JSON writes them: what an envelope job could not carry, a header job cannot either.
            ([("apns-token", tokenA), ("apns-priority", "+10")], "apns-priority header: priority is +10; it must be 10, 5 or 1"),
            ([("apns-token", tokenA), ("apns-priority", "0010")], "apns-priority header: priority is 0010; it must be 10, 5 or 1"),
        ]
    )
    func rules(headers: [(String, String)], reason: String) {
        #expect(headerRejection(headers) == reason)
    }

    @Test("the payload must be a JSON object within the limit")
    func payloadRules() {
        #expect(headerRejection([("apns-token", tokenA)], value: Array("{}".utf8)) == nil)
        #expect(headerRejection([("apns-token", tokenA)], value: Array("not json".utf8)) == "payload: invalid JSON at byte 0: expected a JSON object")
        #expect(headerRejection([("apns-token", tokenA)], value: Array(#"{"a":1} {"#.utf8)) == "payload: invalid JSON at byte 8: unexpected data after the JSON value")
        let big = Array((#"{"a":""# + String(repeating: "x", count: 4100) + #""}"#).utf8)
        #expect(headerRejection([("apns-token", tokenA), ("apns-push-type", "alert")], value: big) == "payload: payload is 4108 bytes; at most 4096 are allowed for push type alert")
    }

    @Test("an empty record value is rejected as an empty payload")
    func emptyPayload() {
        #expect(headerRejection([("apns-token", tokenA)], value: []) == "payload: payload is empty: the record value must be the APNs payload JSON object")
    }

    @Test("a header that is not UTF-8 or has no value is rejected")
    func badHeaderValues() {
        let decoder = JobDecoder()
        #expect(throws: JobRejection(field: "apns-topic header", "header apns-topic is not valid UTF-8")) {
            try decoder.decode(value: payload, headers: [RecordHeader("apns-token", tokenA), RecordHeader(key: "apns-topic", value: [0xFF, 0xFE])])
        }
        #expect(throws: JobRejection(field: "apns-topic header", "header apns-topic has no value")) {
            try decoder.decode(value: payload, headers: [RecordHeader("apns-token", tokenA), RecordHeader(key: "apns-topic", value: nil)])
        }
    }
}

@Suite("Resolution against app defaults")
struct ResolutionTests {
    @Test("omitted fields come from the app's defaults")
    func defaultsFill() throws {
        let job = try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":{}}"#.utf8))
        let resolved = try job.resolved(defaults: JobDefaults(topic: "com.example.app", pushType: .background, priority: .powerConsiderate, environment: .sandbox))
        #expect(resolved.topic == "com.example.app")
        #expect(resolved.pushType == .background)
        #expect(resolved.priority == .powerConsiderate)
        #expect(resolved.environment == .sandbox)
    }

    @Test("a job needs a topic from somewhere")
    func missingTopic() throws {
        let job = try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":{}}"#.utf8))
        #expect(throws: JobRejection(field: "topic", "no topic: the job has none and app 'example' has no default topic")) {
            try job.resolved(defaults: JobDefaults(), appName: "example")
        }
    }

    @Test("the payload limit follows the resolved push type")
    func voipDefault() throws {
        let payload = #"{"p":""# + String(repeating: "x", count: 4500) + #""}"#
        let job = try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":\#(payload)}"#.utf8))
        #expect(throws: JobRejection.self) { try job.resolved(defaults: JobDefaults(topic: "t")) }
        #expect(try job.resolved(defaults: JobDefaults(topic: "t", pushType: .voip)).pushType == .voip)
    }

    @Test("a push type that needs its own topic gets the suffix on the app's bundle id; a stated topic without it is refused")
    func topicSuffixOfThePushType() throws {
        func job(_ fields: String) throws -> NotificationJob {
            try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)",\#(fields)"payload":{}}"#.utf8))
        }
        let app = JobDefaults(topic: "com.example.app")
        #expect(try job(#""push_type":"voip","#).resolved(defaults: app).topic == "com.example.app.voip")
        #expect(try job(#""push_type":"liveactivity","#).resolved(defaults: app).topic == "com.example.app.push-type.liveactivity")
        // WidgetKit pushes go to their own topics too; sent to the bare bundle id, APNs refuses them.
        #expect(try job(#""push_type":"widgets","#).resolved(defaults: app).topic == "com.example.app.push-type.widgets")
        #expect(try job(#""push_type":"controls","#).resolved(defaults: app).topic == "com.example.app.push-type.controls")
        #expect(throws: JobRejection.self) { try job(#""topic":"com.example.app","push_type":"widgets","#).resolved(defaults: app) }
        #expect(try job(#""push_type":"alert","#).resolved(defaults: app).topic == "com.example.app")
        // An app whose default push type is VoIP, configured with the suffixed topic already.
        #expect(try job("").resolved(defaults: JobDefaults(topic: "com.example.app.voip", pushType: .voip)).topic == "com.example.app.voip")
        #expect(try job(#""topic":"com.example.app.voip","push_type":"voip","#).resolved(defaults: app).topic == "com.example.app.voip")
        #expect(throws: JobRejection(
            field: "topic", "topic 'com.example.app' does not end in '.voip' after the bundle id, which APNs requires for push type voip (it answers BadTopic)"
        )) {
            try job(#""topic":"com.example.app","push_type":"voip","#).resolved(defaults: app)
        }
        #expect(throws: JobRejection.self, "the suffix alone is no topic") {
            try job(#""topic":".voip","push_type":"voip","#).resolved(defaults: app)
        }
    }

    @Test("a background push is sent at priority 5 unless the job says 1; 10 is refused")
    func backgroundPriority() throws {
        func job(_ fields: String) throws -> NotificationJob {
            try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","push_type":"background",\#(fields)"payload":{"aps":{"content-available":1}}}"#.utf8))
        }
        let app = JobDefaults(topic: "com.example.app")
        #expect(try job("").resolved(defaults: app).priority == .powerConsiderate, "the app's default of 10 is for alerts")
        #expect(try job("").resolved(defaults: JobDefaults(topic: "t", priority: .low)).priority == .low)
        #expect(try job(#""priority":1,"#).resolved(defaults: app).priority == .low)
        #expect(throws: JobRejection(field: "priority", "priority 10 is not allowed for push type background (APNs answers BadPriority); use 5 or 1")) {
            try job(#""priority":10,"#).resolved(defaults: app)
        }
        // Alerts keep the app's default.
        let alert = try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":{}}"#.utf8))
        #expect(try alert.resolved(defaults: app).priority == .immediate)
    }

    @Test("a header-encoded job's rule violations name the header the producer wrote, an envelope's the field")
    func ruleViolationsNameTheHeader() throws {
        let app = JobDefaults(topic: "com.example.app")
        func reason(_ job: NotificationJob) -> String? {
            do { _ = try job.resolved(defaults: app); return nil } catch { return error.reason }
        }
        let background = try headerJob([("apns-token", tokenA), ("apns-push-type", "background"), ("apns-priority", "10")])
        #expect(reason(background)?.hasPrefix("apns-priority header: priority 10 is not allowed") == true, "\(reason(background) ?? "")")
        let voip = try headerJob([("apns-token", tokenA), ("apns-push-type", "voip"), ("apns-topic", "com.example.app")])
        #expect(reason(voip)?.hasPrefix("apns-topic header: topic 'com.example.app' does not end in '.voip'") == true, "\(reason(voip) ?? "")")
        let noTopic = try headerJob([("apns-token", tokenA)])
        #expect((try? noTopic.resolved(defaults: JobDefaults())) == nil)
        do { _ = try noTopic.resolved(defaults: JobDefaults()) } catch { #expect(error.reason.hasPrefix("apns-topic header: no topic")) }
        // The same rule in an envelope names the envelope's field.
        let envelope = try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","push_type":"background","priority":10,"payload":{}}"#.utf8))
        #expect(reason(envelope)?.hasPrefix("priority: priority 10") == true, "\(reason(envelope) ?? "")")
    }

    @Test("apps are chosen by name, then by topic, then by default; unknown apps are named")
    func appSelection() throws {
        let key = AppConfiguration.Authentication.token(keyFile: "/k.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        let fleet = FleetConfiguration(apps: [
            AppConfiguration(name: "one", authentication: key, defaults: JobDefaults(topic: "com.one")),
            AppConfiguration(name: "two", authentication: key, topics: ["com.two", "com.two.voip"]),
        ], defaultApp: "one")
        func job(_ extra: String) throws -> NotificationJob {
            try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":{}\#(extra)}"#.utf8))
        }
        #expect(try fleet.app(for: job(#","app":"two""#)).name == "two")
        #expect(try fleet.app(for: job(#","topic":"com.two.voip""#)).name == "two")
        #expect(try fleet.app(for: job("")).name == "one")
        #expect(throws: JobRejection(field: "app", "unknown app \"three\"; configured apps: one, two")) {
            try fleet.app(for: job(#","app":"three""#))
        }
    }

    @Test("a topic two apps share (production and sandbox) goes to the default app if it is one of them, never by the order of apps")
    func sharedTopicSelection() throws {
        let key = AppConfiguration.Authentication.token(keyFile: "/k.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        let apps = [
            AppConfiguration(name: "prod", authentication: key, defaults: JobDefaults(topic: "com.shared")),
            AppConfiguration(name: "sandbox", authentication: key, defaults: JobDefaults(topic: "com.shared")),
            AppConfiguration(name: "other", authentication: key, defaults: JobDefaults(topic: "com.other")),
        ]
        func job(_ extra: String) throws -> NotificationJob {
            try JobDecoder().decodeEnvelope(Array(#"{"token":"\#(tokenA)","payload":{}\#(extra)}"#.utf8))
        }
        let shared = try job(#","topic":"com.shared""#)
        let voip = try job(#","topic":"com.shared.voip","push_type":"voip""#)
        #expect(try FleetConfiguration(apps: apps, defaultApp: "sandbox").app(for: shared).name == "sandbox")
        #expect(try FleetConfiguration(apps: apps, defaultApp: "prod").app(for: shared).name == "prod")
        #expect(try FleetConfiguration(apps: apps, defaultApp: "sandbox").app(for: voip).name == "sandbox", "a topic derived from the shared bundle")
        let ambiguous = "topic \"com.shared\" belongs to apps prod, sandbox, and the job names none of them; give the job's app, or make one of them default-app"
        #expect(throws: JobRejection(field: "app", ambiguous)) { try FleetConfiguration(apps: apps, defaultApp: "other").app(for: shared) }
        #expect(throws: JobRejection(field: "app", ambiguous)) { try FleetConfiguration(apps: apps).app(for: shared) }
        // Naming the app, or a topic only one app has, needs no default.
        #expect(try FleetConfiguration(apps: apps).app(for: job(#","topic":"com.shared","app":"sandbox""#)).name == "sandbox")
        #expect(try FleetConfiguration(apps: apps).app(for: job(#","topic":"com.other""#)).name == "other")
    }
}
