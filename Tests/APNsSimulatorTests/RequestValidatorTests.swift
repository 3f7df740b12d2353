import APNsCore
import Testing

@testable import APNsSimulator

@Suite("Request validator")
struct RequestValidatorTests {
    let validator = RequestValidator()
    static let token = String(repeating: "ab", count: 32)
    let tokenGrant = TopicGrant(topics: ["com.example.app"], topicRequired: true)

    func head(
        method: String? = "POST",
        path: String? = "/3/device/\(token)",
        topic: String? = "com.example.app",
        _ change: (inout APNsRequestHead) -> Void = { _ in }
    ) -> APNsRequestHead {
        var head = APNsRequestHead(method: method, path: path, topic: topic)
        change(&head)
        return head
    }

    func reason(_ head: APNsRequestHead, payload: Int = 20, grant: TopicGrant? = nil) -> APNsRejection? {
        switch validator.checkNotification(head, payloadCount: payload, grant: grant ?? tokenGrant) {
        case .success: nil
        case .failure(let rejection): rejection
        }
    }

    @Test("a well-formed request passes with its defaults")
    func accepted() throws {
        let result = try validator.checkNotification(head(), payloadCount: 30, grant: tokenGrant).get()
        #expect(result.deviceToken == Self.token)
        #expect(result.topic == "com.example.app")
        #expect(result.pushType == .alert)
        #expect(result.priority == .immediate)
    }

    @Test("method and path")
    func route() {
        #expect(reason(head(method: "GET")) == APNsRejection(.methodNotAllowed))
        #expect(reason(head(method: "GET"))?.status == 405)
        #expect(reason(head(method: nil))?.status == 405)
        #expect(reason(head(path: "/3/notdevice/abc")) == APNsRejection(.badPath))
        #expect(reason(head(path: "/3/notdevice/abc"))?.status == 404)
        #expect(reason(head(path: "/3/device/")) == APNsRejection(.missingDeviceToken))
        #expect(reason(head(path: "/3/device")) == APNsRejection(.missingDeviceToken))
        #expect(reason(head(path: "/3/device/xyz")) == APNsRejection(.badDeviceToken))
        #expect(reason(head(path: "/3/device/" + String(repeating: "a", count: 63))) == APNsRejection(.badDeviceToken))
        #expect(reason(head(path: "/3/device/" + String(repeating: "AB", count: 32))) == nil)
    }

    @Test("repeated headers")
    func duplicates() {
        #expect(reason(head { $0.duplicateHeader = "apns-topic" }) == APNsRejection(.duplicateHeaders))
    }

    @Test("apns-id, priority, expiration, collapse id")
    func headerRules() {
        #expect(reason(head { $0.apnsID = "not-a-uuid" }) == APNsRejection(.badMessageId))
        #expect(reason(head { $0.apnsID = "123e4567-e89b-12d3-a456-426655440000" }) == nil)
        #expect(reason(head { $0.priority = "7" }) == APNsRejection(.badPriority))
        #expect(reason(head { $0.priority = "ten" }) == APNsRejection(.badPriority))
        for spelled in ["+10", "010", "05", " 5", "1 "] {
            #expect(reason(head { $0.priority = spelled }) == APNsRejection(.badPriority), "apns-priority \(spelled)")
        }
        #expect(reason(head { $0.priority = "5" }) == nil)
        #expect(reason(head { $0.expiration = "-1" }) == APNsRejection(.badExpirationDate))
        #expect(reason(head { $0.expiration = "soon" }) == APNsRejection(.badExpirationDate))
        #expect(reason(head { $0.expiration = "0" }) == nil)
        #expect(reason(head { $0.collapseID = String(repeating: "c", count: 65) }) == APNsRejection(.badCollapseId))
        #expect(reason(head { $0.collapseID = String(repeating: "c", count: 64) }) == nil)
    }

    @Test("push types: unknown, topic suffixes, background priority")
    func pushTypes() {
        #expect(reason(head { $0.pushType = "banana" })?.reason == RequestValidator.invalidPushType)
        #expect(reason(head { $0.pushType = "voip" }) == APNsRejection(.badTopic))
        #expect(reason(head(topic: "com.example.app.voip") { $0.pushType = "voip" }) == nil)
        #expect(reason(head(topic: "com.other.voip") { $0.pushType = "voip" }) == APNsRejection(.topicDisallowed))
        #expect(reason(head { $0.pushType = "widgets" }) == APNsRejection(.badTopic))
        #expect(reason(head(topic: "com.example.app.push-type.widgets") { $0.pushType = "widgets" }) == nil)
        #expect(reason(head { $0.pushType = "controls" }) == APNsRejection(.badTopic))
        #expect(reason(head(topic: "com.example.app.push-type.controls") { $0.pushType = "controls" }) == nil)
        #expect(reason(head { $0.pushType = "background" }) == APNsRejection(.badPriority))
        #expect(reason(head { $0.pushType = "background"; $0.priority = "5" }) == nil)
    }

    @Test("topics: missing, malformed, not granted, certificate default")
    func topics() {
        #expect(reason(head(topic: nil)) == APNsRejection(.missingTopic))
        #expect(reason(head(topic: "has space")) == APNsRejection(.badTopic))
        #expect(reason(head(topic: "")) == APNsRejection(.badTopic))
        #expect(reason(head(topic: "com.other.app")) == APNsRejection(.topicDisallowed))
        #expect(reason(head(topic: "com.other.app"), grant: TopicGrant(topics: [], topicRequired: true)) == nil)
        let single = TopicGrant(topics: ["com.example.app"], topicRequired: false)
        #expect(reason(head(topic: nil), grant: single) == nil)
        let several = TopicGrant(topics: ["a.b", "c.d"], topicRequired: true)
        #expect(reason(head(topic: nil), grant: several) == APNsRejection(.missingTopic))
    }

    @Test("payload size: empty, 4096, 5120 for VoIP")
    func payloads() {
        #expect(reason(head(), payload: 0) == APNsRejection(.payloadEmpty))
        #expect(reason(head(), payload: 4096) == nil)
        #expect(reason(head(), payload: 4097) == APNsRejection(.payloadTooLarge))
        #expect(reason(head(), payload: 4097)?.status == 413)
        let voip = head(topic: "com.example.app.voip") { $0.pushType = "voip" }
        #expect(reason(voip, payload: 5120) == nil)
        #expect(reason(voip, payload: 5121) == APNsRejection(.payloadTooLarge))
    }

    @Test("without apns-push-type the topic's suffix says the push type, as before the header existed")
    func pushTypeFromTopic() throws {
        let voip = head(topic: "com.example.app.voip")
        #expect(reason(voip, payload: 5120) == nil, "a .voip topic is a VoIP push, with its 5120 bytes")
        #expect(try validator.checkNotification(voip, payloadCount: 20, grant: tokenGrant).get().pushType == .voip)
        #expect(try validator.checkNotification(head(topic: "com.example.app.voip-ptt"), payloadCount: 20, grant: tokenGrant).get().pushType == .pushtotalk)
        #expect(reason(head(), payload: 4097) == APNsRejection(.payloadTooLarge), "a plain topic is an alert")
    }

    @Test("a certificate's topics extension grants whole topics: a VoIP-only certificate sends VoIP, not alerts")
    func certificateTopicsAreExact() throws {
        let voipOnly = TopicGrant(topics: ["com.example.app.voip"], topicRequired: false, exact: true)
        #expect(reason(head(topic: "com.example.app.voip") { $0.pushType = "voip" }, grant: voipOnly) == nil)
        #expect(reason(head(topic: "com.example.app"), grant: voipOnly) == APNsRejection(.topicDisallowed))
        // Its one topic is the default, as it is: not com.example.app.voip.voip.
        let implied = try validator.checkNotification(head(topic: nil) { $0.pushType = "voip" }, payloadCount: 20, grant: voipOnly).get()
        #expect(implied.topic == "com.example.app.voip" && implied.pushType == .voip)
        let appOnly = TopicGrant(topics: ["com.example.app"], topicRequired: false, exact: true)
        #expect(reason(head(topic: "com.example.app.voip") { $0.pushType = "voip" }, grant: appOnly) == APNsRejection(.topicDisallowed))
    }

    @Test("rejections carry Table 8-6 statuses")
    func statuses() {
        #expect(APNsRejection(.unregistered, timestamp: 1).status == 410)
        #expect(APNsRejection(.tooManyRequests).status == 429)
        #expect(APNsRejection(.invalidProviderToken).status == 403)
        #expect(APNsRejection(.shutdown).status == 503)
        #expect(APNsRejection(.internalServerError).status == 500)
    }

    @Test("a GOAWAY's reason is escaped into valid JSON, whatever text the library is given")
    func goAwayBodyEscapes() throws {
        let reason = "Main\"tenance\\\n"
        let body = SimulatorConnection.goAwayBody(reason: reason)
        #expect(try JSONParser.parse(body)["reason"]?.string == reason)
        #expect(String(decoding: SimulatorConnection.goAwayBody(reason: "Shutdown"), as: UTF8.self) == #"{"reason":"Shutdown"}"#)
    }
}
