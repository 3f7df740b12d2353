import APNsCore
import Testing

@Suite("Invalidation ledger")
struct InvalidationLedgerTests {
    static let token = String(repeating: "ab", count: 32)

    static func event(_ reason: String = "Unregistered", at time: Int64 = 1000, topic: String = "com.example.app", token: String = token) -> TokenEvent {
        TokenEvent(token: token, topic: topic, app: "example", reason: reason, invalidatedAt: time, source: .http2)
    }

    @Test("a duplicate result does not repeat the event")
    func duplicateIsSuppressed() {
        var ledger = InvalidationLedger(capacity: 100)
        let admitted1 = ledger.admit(Self.event())
        #expect(admitted1)
        let admitted2 = ledger.admit(Self.event())
        #expect(!admitted2)
        let admitted3 = ledger.admit(Self.event(at: 900))
        #expect(!admitted3, "an older timestamp is not news")
    }

    @Test("a 410 dated by its answer (no usable timestamp from APNs) is news again only a minute later")
    func unstatedUnregisteredRepeatsOnceAMinute() {
        var ledger = InvalidationLedger(capacity: 100)
        func answered(at time: Int64) -> TokenEvent {
            var event = Self.event(at: time)
            event.timeIsStated = false
            return event
        }
        let first = ledger.admit(answered(at: 1000))
        let loop = (1...59).map { ledger.admit(answered(at: 1000 + $0 * 1000)) }
        let minuteLater = ledger.admit(answered(at: 61_000))
        #expect(first)
        #expect(!loop.contains(true), "a producer sending to the dead token in a loop gets one event a minute")
        #expect(minuteLater)
    }

    @Test("a later 410, another reason or another topic is a new invalidation")
    func newInvalidations() {
        var ledger = InvalidationLedger(capacity: 100)
        let admitted4 = ledger.admit(Self.event())
        #expect(admitted4)
        let admitted5 = ledger.admit(Self.event(at: 2000))
        #expect(admitted5, "the token came back and died again")
        let admitted6 = ledger.admit(Self.event("BadDeviceToken", at: 2000))
        #expect(admitted6)
        let admitted7 = ledger.admit(Self.event(topic: "com.example.other"))
        #expect(admitted7)
        #expect(ledger.count == 2)
    }

    @Test("a redelivered older result of another reason is no news: the compacted topic keeps the newest event")
    func olderOtherReasonIsARepeat() {
        var ledger = InvalidationLedger(capacity: 100)
        let unregistered = ledger.admit(Self.event("Unregistered", at: 1000))
        let bad = ledger.admit(Self.event("BadDeviceToken", at: 2000))
        let redeliveredUnregistered = ledger.admit(Self.event("Unregistered", at: 1000))
        let redeliveredBad = ledger.admit(Self.event("BadDeviceToken", at: 2000))
        #expect(unregistered && bad)
        #expect(!redeliveredUnregistered && !redeliveredBad)
    }

    @Test("a 410 after a BadDeviceToken event (a wrong-environment job earlier) is news, though APNs dates it before that send")
    func unregisteredAfterSendTimeReason() {
        var ledger = InvalidationLedger(capacity: 100)
        var bad = Self.event("BadDeviceToken", at: 10_000)
        bad.timeIsStated = false
        var gone = Self.event("Unregistered", at: 5_000)
        gone.observedAt = 20_000
        var redeliveredOld = Self.event("Unregistered", at: 5_000)
        redeliveredOld.observedAt = 8_000
        let admittedBad = ledger.admit(bad)
        let admittedOld = ledger.admit(redeliveredOld)
        let admittedGone = ledger.admit(gone)
        #expect(admittedBad)
        #expect(!admittedOld, "a result observed before the published event is still no news")
        #expect(admittedGone, "the compacted topic must end with Unregistered")
    }

    @Test("a feedback tuple (whole seconds) and a 410 for the same invalidation make one event")
    func tupleAndUnregisteredAgree() {
        var ledger = InvalidationLedger(capacity: 100)
        let tuple = TokenEvent(token: Self.token, topic: "com.example.app", app: "example", reason: "Unregistered", invalidatedAt: 7_000, source: .feedbackService)
        let first = ledger.admit(tuple)
        let answer = ledger.admit(Self.event(at: 7_300))
        let reborn = ledger.admit(Self.event(at: 9_000))
        #expect(first && !answer, "the 410 is the tuple's invalidation, to the millisecond")
        #expect(reborn)
    }

    @Test("a token still bad a minute after its event is invalidated again; closer repeats are duplicates")
    func badTokenRepeats() {
        // Readers take a token back when the app registers it after the event's time (every
        // launch): without a new event they would keep a bad token for good.
        var ledger = InvalidationLedger(capacity: 100)
        let first = ledger.admit(Self.event("BadDeviceToken", at: 1000))
        let soon = ledger.admit(Self.event("BadDeviceToken", at: 50_000))
        let minuteLater = ledger.admit(Self.event("BadDeviceToken", at: 61_000))
        let notForTopicSoon = ledger.admit(Self.event("DeviceTokenNotForTopic", at: 100_000))
        let notForTopicLater = ledger.admit(Self.event("DeviceTokenNotForTopic", at: 121_000))
        #expect(first && !soon && minuteLater)
        #expect(!notForTopicSoon, "the other send-time reason within a minute is a duplicate too")
        #expect(notForTopicLater)
    }

    @Test("answers alternating between BadDeviceToken and DeviceTokenNotForTopic still make one event a minute")
    func alternatingSendTimeReasons() {
        var ledger = InvalidationLedger(capacity: 100)
        var published = 0
        for second in 0..<120 {
            let reason = second.isMultiple(of: 2) ? "BadDeviceToken" : "DeviceTokenNotForTopic"
            if ledger.admit(Self.event(reason, at: Int64(second) * 1000)) { published += 1 }
        }
        #expect(published == 2, "at 0 s and 60 s")
        let unregistered = ledger.admit(Self.event("Unregistered", at: 119_500))
        #expect(unregistered, "a 410 is another kind of news")
    }

    @Test("memory is bounded; the oldest key is forgotten first")
    func bounded() {
        var ledger = InvalidationLedger(capacity: 3)
        let tokens = (0..<5).map { String(repeating: "0", count: 62) + "0\($0)" }
        for token in tokens {
            let admitted = ledger.admit(Self.event(token: token))
            #expect(admitted)
        }
        #expect(ledger.count == 3)
        let admitted9 = ledger.admit(Self.event(token: tokens[4]))
        #expect(!admitted9, "recent keys are remembered")
        let admitted10 = ledger.admit(Self.event(token: tokens[0]))
        #expect(admitted10, "the oldest was forgotten")
    }

    @Test("an event whose publish failed can be admitted again")
    func forget() {
        var ledger = InvalidationLedger(capacity: 10)
        let event = Self.event()
        let first = ledger.admit(event)
        ledger.forget(event)
        let again = ledger.admit(event)
        #expect(first && again)
    }

    @Test("events at the ends of the time range are compared without overflow: one bad result must not trap the feedback worker on every restart")
    func extremeTimes() {
        var ledger = InvalidationLedger(capacity: 100)
        let first = ledger.admit(Self.event(at: .max))
        let older = ledger.admit(Self.event(at: .min))
        let olderOther = ledger.admit(Self.event("BadDeviceToken", at: .min))
        #expect(first)
        #expect(!older, "far older: a repeat")
        #expect(!olderOther, "another reason, far older: no news")
        var other = InvalidationLedger(capacity: 100)
        let bad = other.admit(Self.event("BadDeviceToken", at: .min))
        let later = other.admit(Self.event("BadDeviceToken", at: .max))
        #expect(bad)
        #expect(later, "far later: news")
    }

    @Test("a feedback tuple becomes an Unregistered event at the tuple's time, unless that is later than the poll can explain")
    func feedbackTuple() throws {
        let polledAt = UnixMillis(1_767_300_000_000)
        let tuple = FeedbackTuple(timestamp: 1_767_225_600, token: Array(repeating: 0xAB, count: 32))
        let event = try #require(TokenEvent(feedback: tuple, topic: "com.example.app", app: "legacy", polledAt: polledAt))
        #expect(event.token == Self.token)
        #expect(event.invalidatedAt == 1_767_225_600_000)
        #expect(event.source == .feedbackService && event.reason == "Unregistered")
        #expect(event.key == "com.example.app/\(Self.token)")
        #expect(TokenEvent(feedback: FeedbackTuple(timestamp: 1, token: [1, 2]), topic: "t", app: nil, polledAt: polledAt) == nil, "not a device token")
        // 2106, from a skewed clock: readers would keep the token dead over every registration.
        let far = try #require(TokenEvent(feedback: FeedbackTuple(timestamp: .max, token: tuple.token), topic: "t", app: nil, polledAt: polledAt))
        #expect(far.invalidatedAt == polledAt.value)
        let withinADay = try #require(TokenEvent(feedback: FeedbackTuple(timestamp: 1_767_300_000 + 3600, token: tuple.token), topic: "t", app: nil, polledAt: polledAt))
        #expect(withinADay.invalidatedAt == (1_767_300_000 + 3600) * 1000, "clock skew of an hour is kept")
    }
}
