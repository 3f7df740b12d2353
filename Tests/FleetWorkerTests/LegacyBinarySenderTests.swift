import APNsCore
import Foundation
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

@Suite("A request's time is bounded by its job's deadline")
struct RequestTimeoutTests {
    static func notification(_ fields: String) throws -> OutgoingNotification {
        let key = AppConfiguration.Authentication.token(keyFile: "/k.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        let intake = JobIntake(configuration: FleetConfiguration(apps: [AppConfiguration(name: "example", authentication: key, defaults: JobDefaults(topic: "com.example.app"))]), workerID: "w")
        let token = String(repeating: "ab", count: 32)
        let now = UnixMillis(Int64(Date().timeIntervalSince1970 * 1000))
        let decision = intake.accept(
            value: Array(#"{"token":"\#(token)","payload":{}\#(fields)}"#.utf8), headers: [],
            source: SourcePosition(topic: "apns.jobs", partition: 0, offset: 1), now: now
        )
        guard case .accepted(let job) = decision else { throw CancellationError() }
        return OutgoingNotification(token: try #require(job.tokens.first), of: JobInFlight(job), apnsID: "00000000-0000-0000-0000-000000000001")
    }

    @Test("a request queued for a stream cannot go out after its job's deadline or expiration")
    func boundedByCutoff() throws {
        let now = Int64(Date().timeIntervalSince1970)
        #expect(try Self.notification("").timeout(.seconds(10)) == .seconds(10))
        #expect(try Self.notification(#","expiration":0"#).timeout(.seconds(10)) == .seconds(10), "0 means do not store, not a time")
        let soon = try Self.notification(#","deadline":\#(now + 3)"#).timeout(.seconds(10))
        #expect(soon <= .seconds(3) && soon > .seconds(1))
        let expiring = try Self.notification(#","deadline":\#(now + 600),"expiration":\#(now + 2)"#).timeout(.seconds(10))
        #expect(expiring <= .seconds(2))
    }
}
