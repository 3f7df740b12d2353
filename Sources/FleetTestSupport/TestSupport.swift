import Foundation
import ProcessLaunch
import Synchronization

// Helpers shared by the test suites that start real processes and servers: bounded waits,
// a locked box, and child processes whose output is read line by line.

public struct TestTimeout: Error, CustomStringConvertible {
    public var what: String
    public var seconds: Double
    public init(what: String, seconds: Double) {
        self.what = what
        self.seconds = seconds
    }

    public var description: String { "timed out after \(seconds) s waiting for \(what)" }
}

/// Runs `body`, failing with `TestTimeout` (and cancelling it) if it takes longer than `seconds`.
public func withTimeout<T: Sendable>(
    _ seconds: Double,
    _ what: String,
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw TestTimeout(what: what, seconds: seconds)
        }
        return value
    }
}

/// Re-checks `condition` every 20 ms until it holds, or throws after `seconds`.
public func waitUntil(_ what: String, timeout seconds: Double = 60, _ condition: @Sendable () -> Bool) async throws {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while !condition() {
        guard ContinuousClock.now < deadline else { throw TestTimeout(what: what, seconds: seconds) }
        try await Task.sleep(for: .milliseconds(20))
    }
}

public final class Shared<Value: Sendable>: Sendable {
    private let state: Mutex<Value>

    public init(_ value: Value) { state = Mutex(value) }

    public var value: Value { state.withLock { $0 } }

    public func update(_ body: (inout Value) -> Void) {
        state.withLock { body(&$0) }
    }
}

/// A child process whose stdout is collected line by line on a reader thread.
///
/// Its stderr goes through a pipe of its own, copied to the test's stderr, rather than being
/// inherited: a child left running after the test process crashed would otherwise hold the test
/// runner's stderr open, and `swift test` would wait on it forever instead of failing.
public final class ChildProcess: Sendable {
    private let executable: String
    private let arguments: [String]
    private let environment: [String: String]?
    private let launched = Shared<LaunchedProcess?>(nil)
    public let lines = Shared<[String]>([])
    /// Set once the output pipe reached its end and every line is in `lines`.
    private let outputEnded = Shared(false)

    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil) {
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
    }

    private var name: String { (executable as NSString).lastPathComponent }

    public func start() throws {
        // An apns-fleet child (kafka-dev, the simulator, a worker) stops itself once this
        // process is gone, even if it crashed: a test run that dies leaves nothing running.
        var environment = environment ?? ProcessInfo.processInfo.environment
        environment["APNS_FLEET_PARENT_PID"] = String(getpid())
        let process = try LaunchedProcess(
            executable: executable, arguments: arguments, environment: environment,
            standardInput: .pipe, standardOutput: .pipe, standardError: .pipe
        )
        launched.update { $0 = process }
        let lines = self.lines
        let outputEnded = self.outputEnded
        if let reader = process.standardOutput {
            Thread {
                var pending: [UInt8] = []
                while case let chunk = reader.read(), !chunk.isEmpty {
                    pending += chunk
                    while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                        let line = String(decoding: pending[..<newline], as: UTF8.self)
                        pending.removeSubrange(...newline)
                        lines.update { $0.append(line) }
                    }
                }
                if !pending.isEmpty {
                    let rest = String(decoding: pending, as: UTF8.self)
                    lines.update { $0.append(rest) }
                }
                outputEnded.update { $0 = true }
            }.start()
        }
        if let errors = process.standardError {
            Thread {
                while case let chunk = errors.read(), !chunk.isEmpty {
                    try? FileHandle.standardError.write(contentsOf: chunk)
                }
            }.start()
        }
    }

    /// The child's pid; 0 before ``start()``.
    public var pid: Int32 { launched.value?.processIdentifier ?? 0 }

    /// False before ``start()`` and once the child has ended.
    public var isRunning: Bool { launched.value?.isRunning ?? false }

    /// Sends `signal` unless the child has ended (its pid may be another process's by then).
    public func signal(_ signal: Int32) {
        launched.value?.signal(signal)
    }

    public func terminate() { signal(SIGTERM) }

    public func write(_ text: String) {
        launched.value?.standardInput?.write(Array(text.utf8))
    }

    public func closeInput() {
        launched.value?.standardInput?.close()
    }

    /// Waits for the n-th line of output (1-based) and returns it.
    public func line(_ number: Int, timeout: Double = 60) async throws -> String {
        try await waitUntil("output line \(number) of \(name)", timeout: timeout) {
            lines.value.count >= number
        }
        return lines.value[number - 1]
    }

    /// Waits for the process to exit and then for its last output lines: the exit is seen
    /// before the reader thread has drained the pipe, and a caller reading `lines` at once could
    /// miss the output (a kcat consumer's every line, on a loaded machine). The output ends when
    /// the pipe closes, which a grandchild still holding it could delay: then after 5 s at most.
    /// The status is the exit status, or the number of the signal that ended the child.
    public func waitForExit(timeout: Double = 60) async throws -> Int32 {
        let launched = self.launched
        try await waitUntil("\(name) to exit", timeout: timeout) {
            launched.value?.termination != nil
        }
        try? await waitUntil("the output of \(name) to end", timeout: 5) {
            outputEnded.value
        }
        return launched.value?.termination?.status ?? -1
    }

    /// Best-effort cleanup for `defer`.
    public func kill() {
        signal(SIGKILL)
    }
}

/// The `apns-fleet` executable built next to the test bundle.
public func apnsFleetBinary() throws -> String {
    let candidates = [
        URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent(),
        Bundle.main.bundleURL.deletingLastPathComponent(),
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
    ]
    for directory in candidates {
        let path = directory.appendingPathComponent("apns-fleet").path
        if FileManager.default.isExecutableFile(atPath: path) { return path }
    }
    throw TestSetupError("apns-fleet is not built next to the tests (looked in \(candidates.map(\.path))); run `swift build` first")
}


/// A fresh path (not yet created) for one test's files, under a directory of this test
/// process's own that is removed when the process exits. A test that fails half-way, or a
/// helper that hands its directory to the caller, then leaves nothing behind in /tmp; before
/// this, every `make test` left about 150 directories there.
public func temporaryTestPath(_ prefix: String) -> String {
    (testProcessDirectory as NSString).appendingPathComponent("\(prefix)-\(UUID().uuidString)")
}

private let testProcessDirectory: String = {
    let path = NSTemporaryDirectory() + "apns-fleet-tests-\(getpid())-\(UUID().uuidString.prefix(8))"
    // Created here, once, so a failure shows up as the test's own file error if it cannot be.
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    atexit { try? FileManager.default.removeItem(atPath: testProcessDirectory) }
    return path
}()

/// A test environment that is not as the test needs it.
public struct TestSetupError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
