import Foundation
import ProcessLaunch
import Synchronization
import UnixSignals

/// An `apns-fleet` subcommand started as its own process, with its output in a log file, as an
/// operator would run it. The demo and the benchmarks build their fleets from these.
///
/// Each child runs in a process group of its own, so Ctrl-C reaches only the parent: call
/// ``stopChildrenOnSignal()`` first, or an interrupted demo leaves kafka-dev, the simulator and
/// the workers running. A parent that dies without a signal it can catch (SIGKILL, a crash)
/// takes its children with it too: each gets ``parentVariable`` and stops itself once its
/// parent is gone (``stopWhenParentExits()``).
final class SpawnedProcess: Sendable {
    /// The children started (and still running when the last one started), for a signal to stop.
    private static let launched = Mutex<[LaunchedProcess]>([])
    let name: String
    let logPath: String
    private let process: LaunchedProcess

    /// Starts `apns-fleet <arguments>` (this very executable), logging to `logPath`.
    init(name: String, arguments: [String], logPath: String, environment: [String: String]? = nil) throws {
        self.name = name
        self.logPath = logPath
        guard FileManager.default.createFile(atPath: logPath, contents: nil) else {
            throw CommandFailure("cannot write the log file \(logPath)")
        }
        var environment = environment ?? ProcessInfo.processInfo.environment
        environment[Self.parentVariable] = String(getpid())
        do {
            process = try LaunchedProcess(
                executable: Self.executablePath, arguments: arguments, environment: environment,
                standardInput: .nullDevice, standardOutput: .appending(toFile: logPath), standardError: .standardOutput
            )
        } catch {
            throw CommandFailure("cannot start \(name): \(error)")
        }
        Self.launched.withLock { launched in
            launched.removeAll { !$0.isRunning }
            launched.append(process)
        }
    }

    private static var running: [LaunchedProcess] { launched.withLock { $0.filter(\.isRunning) } }

    /// Set by the first SIGINT or SIGTERM: children then end because they were asked to, which
    /// the run must not report as a failure (see ``holdIfInterrupted()``).
    private static let interrupted = Atomic<Bool>(false)

    /// On SIGINT, SIGTERM or SIGHUP (a closed terminal): the children are stopped newest
    /// first, as ``LocalFleet/stop()`` does, so that workers drain into a Kafka and an APNs
    /// still there: SIGTERM to each, the next once it has exited. Whatever is left after
    /// `grace`, or at once on a second signal, gets SIGKILL; then the process exits with
    /// 128 + the signal. The signals are trapped before this returns.
    static func stopChildrenOnSignal(grace: Duration = .seconds(20)) async {
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm, .sighup)
        Task.detached {
            var first: UnixSignal?
            for await signal in signals {
                interrupted.store(true, ordering: .sequentiallyConsistent)
                if first == nil {
                    first = signal
                    try? FileHandle.standardError.write(contentsOf: Data("\n\(signal): stopping the \(running.count) processes started (again to kill them at once)\n".utf8))
                    Task.detached {
                        let deadline = ContinuousClock.now + grace
                        for child in running.reversed() {
                            child.signal(SIGTERM)
                            while child.isRunning, ContinuousClock.now < deadline {
                                try? await Task.sleep(for: .milliseconds(20))
                            }
                        }
                        for child in running { child.signal(SIGKILL) }
                        exitNow(128 + signal.rawValue)
                    }
                } else {
                    for child in running { child.signal(SIGKILL) }
                    exitNow(128 + (first ?? signal).rawValue)
                }
            }
        }
    }

    /// The environment variable naming a child's parent (its pid), set for every child.
    static let parentVariable = "APNS_FLEET_PARENT_PID"

    /// In a child started by ``init(name:arguments:logPath:environment:)``: sends this process
    /// SIGTERM, once, when the parent that started it has gone (the child is then adopted, and
    /// its parent pid changes). Its own graceful stop follows, as on an operator's SIGTERM.
    /// Checked once a second, on a thread of its own. Without the variable, or when it names
    /// another process than the parent (a shell in between, the variable inherited from further
    /// up), nothing happens.
    static func stopWhenParentExits() {
        guard let value = ProcessInfo.processInfo.environment[parentVariable], let parent = Int32(value), parent > 1,
            getppid() == parent
        else { return }
        let thread = Thread {
            while getppid() == parent { sleep(1) }
            Glibc.kill(getpid(), SIGTERM)
        }
        thread.name = "parent-watch"
        thread.start()
    }

    /// After an interruption, never returns: the signal's task ends the process once the
    /// children are gone. Call it where a child found gone (or an error) would be reported.
    static func holdIfInterrupted() async {
        while interrupted.load(ordering: .sequentiallyConsistent) {
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// Without unwinding (or racing the run's own exit): the output so far is flushed first.
    private static func exitNow(_ status: Int32) -> Never {
        fflush(nil)
        _exit(status)
    }

    /// The running binary, so children are the same build as the parent.
    static var executablePath: String {
        let selfLink = URL(fileURLWithPath: "/proc/self/exe")
        if FileManager.default.fileExists(atPath: selfLink.path) { return selfLink.resolvingSymlinksInPath().path }
        return Bundle.main.executablePath ?? CommandLine.arguments[0]
    }

    var pid: Int32 { process.processIdentifier }
    var isRunning: Bool { process.isRunning }
    /// The exit status, or the number of the signal that ended it; nil while it runs.
    private var terminationStatus: Int32? { process.termination?.status }

    var log: String {
        (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
    }

    /// The last lines of the log, for an error message.
    func logTail(_ lines: Int = 15) -> String {
        log.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).map { "    \($0)" }.joined(separator: "\n")
    }

    /// Waits until a log line contains `text`, and returns that line. Fails early, with the log
    /// tail, if the process exits first.
    func waitForLine(containing text: String, timeout: Duration) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let line = log.split(separator: "\n").first(where: { $0.contains(text) }) { return String(line) }
            guard isRunning else {
                await Self.holdIfInterrupted()
                throw CommandFailure("\(name) exited (\(process.termination?.description ?? "status unknown")) before it was ready; its log (\(logPath)) ends:\n\(logTail())")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw CommandFailure("\(name) was not ready after \(timeout); its log (\(logPath)) ends:\n\(logTail())")
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; SIGKILL after that. Returns the status.
    @discardableResult
    func stop(timeout: Duration) async -> Int32 {
        if let terminationStatus { return terminationStatus }
        process.terminate()
        return await wait(timeout: timeout)
    }

    /// Waits for the process to exit by itself; SIGKILL after `timeout`. Returns the status.
    func wait(timeout: Duration) async -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while isRunning, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(50))
        }
        if isRunning {
            process.signal(SIGKILL)
            _ = await process.waitForExit()
            return -9
        }
        return terminationStatus ?? -1
    }

    /// Best-effort cleanup for error paths.
    func kill() {
        process.signal(SIGKILL)
    }
}
