import Foundation

/// An `apns-fleet` subcommand started as its own process, with its output in a log file, as an
/// operator would run it. The demo and the benchmarks build their fleets from these.
final class SpawnedProcess {
    let name: String
    let logPath: String
    private let process = Process()

    /// Starts `apns-fleet <arguments>` (this very executable), logging to `logPath`.
    init(name: String, arguments: [String], logPath: String, environment: [String: String]? = nil) throws {
        self.name = name
        self.logPath = logPath
        guard FileManager.default.createFile(atPath: logPath, contents: nil), let log = FileHandle(forWritingAtPath: logPath) else {
            throw CommandFailure("cannot write the log file \(logPath)")
        }
        process.executableURL = URL(fileURLWithPath: Self.executablePath)
        process.arguments = arguments
        process.standardOutput = log
        process.standardError = log
        process.standardInput = FileHandle.nullDevice
        if let environment { process.environment = environment }
        do {
            try process.run()
        } catch {
            throw CommandFailure("cannot start \(name): \(error)")
        }
    }

    /// The running binary, so children are the same build as the parent.
    static var executablePath: String {
        let selfLink = URL(fileURLWithPath: "/proc/self/exe")
        if FileManager.default.fileExists(atPath: selfLink.path) { return selfLink.resolvingSymlinksInPath().path }
        return Bundle.main.executablePath ?? CommandLine.arguments[0]
    }

    var pid: Int32 { process.processIdentifier }
    var isRunning: Bool { process.isRunning }

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
                throw CommandFailure("\(name) exited (status \(process.terminationStatus)) before it was ready; its log (\(logPath)) ends:\n\(logTail())")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw CommandFailure("\(name) was not ready after \(timeout); its log (\(logPath)) ends:\n\(logTail())")
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; SIGKILL after that. Returns the status.
    @discardableResult
    func stop(timeout: Duration) async -> Int32 {
        guard isRunning else { return process.terminationStatus }
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
            Foundation.kill(pid, SIGKILL)
            process.waitUntilExit()
            return -9
        }
        return process.terminationStatus
    }

    /// Best-effort cleanup for error paths.
    func kill() {
        if isRunning { Foundation.kill(pid, SIGKILL) }
    }
}
