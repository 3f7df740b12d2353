import NIOCore
import Testing

@testable import APNsSimulator

@Suite("Per-device rate limit")
struct DeviceRateLimiterTests {
    @Test("a request whose clock reading comes before the window's start counts in that window")
    func clockReadingsOutOfOrder() {
        // Connections on several event loops read the clock before taking the limiter's lock: the
        // one that read later can get there first. This used to trap on the subtraction.
        let limiter = DeviceRateLimiter(limit: 2, window: .seconds(1))
        let start = NIODeadline.uptimeNanoseconds(10_000_000_000)
        #expect(limiter.admit("device", now: start))
        #expect(limiter.admit("device", now: start - .milliseconds(5)))
        #expect(!limiter.admit("device", now: start - .milliseconds(1)), "the third in the window is over the limit")
        #expect(limiter.admit("device", now: start + .seconds(1)), "a new window")
    }

    @Test("with many devices, windows that are over are dropped")
    func pruning() {
        let limiter = DeviceRateLimiter(limit: 1, window: .seconds(1))
        let start = NIODeadline.uptimeNanoseconds(10_000_000_000)
        for index in 0...DeviceRateLimiter.pruneAbove {
            _ = limiter.admit("device-\(index)", now: start)
        }
        #expect(limiter.trackedDevices == DeviceRateLimiter.pruneAbove + 1)
        #expect(limiter.admit("late", now: start + .seconds(2)))
        #expect(limiter.trackedDevices == 1, "only the device whose window is running is kept")
        #expect(limiter.admit("device-0", now: start + .seconds(2)), "its old window is gone")
    }
}
