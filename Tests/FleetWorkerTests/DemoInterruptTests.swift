import FleetTestSupport
import Foundation
import NIOCore
import NIOPosix
import Testing

/// `apns-fleet demo` started as a user starts it, then interrupted: its processes must not
/// outlive it. Each runs in a process group of its own, so Ctrl-C reaches only the demo.
@Suite("Demo interrupted", .timeLimit(.minutes(2)))
struct DemoInterruptTests {
    @Test("Ctrl-C on the demo stops every process it started, and it exits with 130")
    func interruptStopsTheFleet() async throws {
        let directory = temporaryTestPath("demo-interrupt")
        let demo = try await Self.startDemo(in: directory)
        defer { demo.kill() }
        // A demo pointed at a fleet's brokers must not join its consumer groups.
        let workers = Self.processes(mentioning: directory).map(Self.commandLine).filter { $0.contains(" worker ") || $0.contains(" feedback ") }
        #expect(workers.count == 2 && workers.allSatisfy { $0.contains("kafka.group-id=apns-fleet-demo-") }, "\(workers)")
        demo.signal(SIGINT)
        let status = try await demo.waitForExit(timeout: 60)
        #expect(status == 130, "exit status \(status); output ends: \(demo.lines.value.suffix(5))")
        // The processes it stopped on purpose are not reported as having failed.
        #expect(!demo.lines.value.contains { $0.contains("exited") || $0.contains("FAIL") }, "\(demo.lines.value.suffix(8))")
        let left = Self.processes(mentioning: directory)
        #expect(left.isEmpty, "still running after the demo exited: \(left)")
        for pid in left { kill(pid, SIGKILL) }
    }

    @Test("a demo killed outright (SIGKILL, a crash) leaves nothing behind: its processes stop once their parent is gone")
    func killedDemoTakesItsFleetWithIt() async throws {
        let directory = temporaryTestPath("demo-killed")
        let demo = try await Self.startDemo(in: directory)
        defer { demo.kill() }
        demo.signal(SIGKILL)
        _ = try await demo.waitForExit(timeout: 30)
        // Each notices within a second, then stops as on SIGTERM (a worker drains first).
        let stopped = await (try? waitUntil("the demo's processes to stop", timeout: 60) { Self.processes(mentioning: directory).isEmpty }) != nil
        let left = Self.processes(mentioning: directory)
        #expect(stopped, "still running a minute after the demo was killed: \(left)")
        for pid in left { kill(pid, SIGKILL) }
    }

    /// `apns-fleet demo` as a user starts it, once its fleet (at least four processes) is up.
    static func startDemo(in directory: String) async throws -> ChildProcess {
        let port = try await Self.twoFreePorts()
        let demo = ChildProcess("/bin/sh", [
            "-c", #"exec "$0" demo --dir "$1" --jobs 1000000 --rate 2000 --metrics-port "$2" 2>&1"#,
            try apnsFleetBinary(), directory, String(port),
        ])
        try demo.start()
        do {
            try await waitUntil("the demo's fleet to be up (or the demo to exit)", timeout: 90) {
                demo.lines.value.contains { $0.contains("While it runs, look at") } || !demo.isRunning
            }
            try #require(demo.isRunning, "the demo exited before its fleet was up: \(demo.lines.value.suffix(8))")
            let started = Self.processes(mentioning: directory)
            try #require(started.count >= 4, "kafka-dev, the simulator, a worker and the feedback worker: \(started)")
        } catch {
            demo.kill()
            throw error
        }
        return demo
    }

    /// A port whose next one is free too (the push worker's admin port and the feedback
    /// worker's), below the ephemeral range, where a parallel test's connection would take
    /// the next port soon after.
    static func twoFreePorts() async throws -> Int {
        for _ in 0..<50 {
            let port = Int.random(in: 20_000..<32_000)
            var bound: [any Channel] = []
            for candidate in [port, port + 1] {
                if let channel = try? await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: candidate).get() {
                    bound.append(channel)
                }
            }
            for channel in bound { try? await channel.close() }
            if bound.count == 2 { return port }
        }
        throw TestSetupError("no two consecutive free ports found between 20000 and 32000")
    }

    /// Processes whose command line names `text` (the demo's directory is in every child's).
    static func processes(mentioning text: String) -> [Int32] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(Int32.init).filter { pid in
            guard pid != getpid() else { return false }
            let command = commandLine(pid)
            return command.contains(text) && !command.contains(" demo ")
        }
    }

    /// A process's arguments, joined by spaces; empty once it is gone.
    static func commandLine(_ pid: Int32) -> String {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return "" }
        return String(decoding: data.map { $0 == 0 ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
    }
}
