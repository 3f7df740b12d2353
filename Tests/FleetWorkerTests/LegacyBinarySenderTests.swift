import Testing

@testable import FleetWorker

@Suite("Binary interface: what the job's fields become")
struct LegacyBinarySenderTests {
    @Test("no expiration is stored for 30 days (expiry 0 would mean do not store); a given one is kept, 0 included")
    func expiry() {
        let now: Int64 = 1_767_225_600
        #expect(LegacyBinarySender.expiry(nil, now: now) == UInt32(now + 30 * 86_400))
        #expect(LegacyBinarySender.expiry(0, now: now) == 0)
        #expect(LegacyBinarySender.expiry(now + 60, now: now) == UInt32(now + 60))
        #expect(LegacyBinarySender.expiry(-5, now: now) == 0)
        #expect(LegacyBinarySender.expiry(Int64(UInt32.max) + 10, now: now) == UInt32.max)
    }
}
