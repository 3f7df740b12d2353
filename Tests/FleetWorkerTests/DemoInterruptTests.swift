import FleetTestSupport
import Foundation
import Testing

/// `apns-fleet demo` started as a user starts it, then interrupted: its processes must not
/// outlive it. Each runs in a process group of its own, so Ctrl-C reaches only the demo.
@Suite("Demo interrupted", .timeLimit(.minutes(2)))
struct DemoInterruptTests {
    @Test("Ctrl-C on the demo stops every process it started, and it exits with 130")
    func interruptStopsTheFleet() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("demo-interrupt-\(UUID().uuidString.prefix(8))").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let metricsPort = try RefusingPort()
        let port = metricsPort.port
        metricsPort.release()
        let demo = ChildProcess("/bin/sh", [
            "-c", #"exec "$0" demo --dir "$1" --jobs 1000000 --rate 2000 --metrics-port "$2" 2>&1"#,
            try apnsFleetBinary(), directory, String(port),
        ])
        try demo.start()
        defer { demo.kill() }
        try await waitUntil("the demo's fleet to be up", timeout: 90) {
            demo.lines.value.contains { $0.contains("While it runs, look at") }
        }
        let started = Self.processes(mentioning: directory)
        #expect(started.count >= 4, "kafka-dev, the simulator, a worker and the feedback worker: \(started)")
        kill(demo.process.processIdentifier, SIGINT)
        let status = try await demo.waitForExit(timeout: 60)
        #expect(status == 130, "exit status \(status); output ends: \(demo.lines.value.suffix(5))")
        let left = Self.processes(mentioning: directory)
        #expect(left.isEmpty, "still running after the demo exited: \(left)")
        for pid in left { kill(pid, SIGKILL) }
    }

    /// Processes whose command line names `text` (the demo's directory is in every child's).
    static func processes(mentioning text: String) -> [Int32] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(Int32.init).filter { pid in
            guard pid != getpid(), let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
            let command = String(decoding: data.map { $0 == 0 ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
            return command.contains(text) && !command.contains(" demo ")
        }
    }
}
