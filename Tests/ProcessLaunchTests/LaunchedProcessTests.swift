import Foundation
import ProcessLaunch
import Testing

@Suite("Launched processes: posix_spawn children for the demo, benchmarks and tests", .timeLimit(.minutes(1)))
struct LaunchedProcessTests {
    func shell(_ script: String, environment: [String: String]? = nil, input: LaunchedProcess.Input = .nullDevice, errors: LaunchedProcess.Output = .pipe) throws -> LaunchedProcess {
        try LaunchedProcess(executable: "/bin/sh", arguments: ["-c", script], environment: environment, standardInput: input, standardOutput: .pipe, standardError: errors)
    }

    func text(_ reader: PipeReader?) -> String {
        String(decoding: reader?.readToEnd() ?? [], as: UTF8.self)
    }

    @Test("exit status, output and error output come back separately")
    func exitStatusAndOutput() async throws {
        let child = try shell("echo out; echo err >&2; exit 3")
        #expect(text(child.standardOutput) == "out\n")
        #expect(text(child.standardError) == "err\n")
        #expect(await child.waitForExit() == .exited(3))
        #expect(!child.isRunning && child.termination?.status == 3)
    }

    @Test("stderr can follow stdout into one pipe, in the order written")
    func mergedErrors() async throws {
        let child = try shell("echo one; echo two >&2; echo three", errors: .standardOutput)
        #expect(text(child.standardOutput) == "one\ntwo\nthree\n")
        #expect(await child.waitForExit() == .exited(0))
    }

    @Test("stdin through a pipe; closing it ends the child's input")
    func standardInput() async throws {
        let child = try shell("tr a-z A-Z", input: .pipe)
        #expect(child.standardInput?.write(Array("hello\n".utf8)) == true)
        child.standardInput?.close()
        #expect(text(child.standardOutput) == "HELLO\n")
        #expect(await child.waitForExit() == .exited(0))
        #expect(child.standardInput?.write([1]) == false, "a closed pipe takes nothing")
    }

    @Test("output appended to a file shared by stdout and stderr")
    func appendingToFile() async throws {
        let path = NSTemporaryDirectory() + "launched-\(UUID().uuidString).log"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try Data("before\n".utf8).write(to: URL(fileURLWithPath: path))
        let child = try LaunchedProcess(
            executable: "/bin/sh", arguments: ["-c", "echo a; echo b >&2; echo c"],
            standardOutput: .appending(toFile: path), standardError: .appending(toFile: path)
        )
        #expect(await child.waitForExit() == .exited(0))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "before\na\nb\nc\n")
    }

    @Test("a given environment replaces the parent's")
    func environment() async throws {
        let child = try shell("echo \"$ONLY_THIS:${HOME:-unset}\"", environment: ["ONLY_THIS": "yes"])
        #expect(text(child.standardOutput) == "yes:unset\n")
        _ = await child.waitForExit()
    }

    @Test("the child gets only its three standard descriptors, whatever the parent has open")
    func noInheritedDescriptors() async throws {
        // A descriptor of the parent's without close-on-exec, well away from those `ls` opens.
        let opened = open("/dev/null", O_RDONLY)
        let leaked = fcntl(opened, F_DUPFD, 200)
        close(opened)
        defer { close(leaked) }
        #expect(leaked >= 200)
        let child = try shell("ls /proc/self/fd")
        let descriptors = Set(text(child.standardOutput).split(separator: "\n").compactMap { Int32($0) })
        _ = await child.waitForExit()
        // `ls` itself opens one for the directory it lists.
        #expect(!descriptors.contains(leaked), "\(descriptors.sorted())")
        #expect(descriptors.isSuperset(of: [0, 1, 2]))
        #expect(descriptors.count <= 4, "\(descriptors.sorted())")
    }

    @Test("a signal ends the child; once it has ended, none is sent")
    func signals() async throws {
        let child = try shell("exec sleep 30")
        #expect(child.isRunning)
        #expect(child.signal(SIGTERM))
        #expect(await child.waitForExit() == .signalled(SIGTERM))
        #expect(child.termination?.status == SIGTERM)
        #expect(!child.signal(SIGKILL), "the pid may belong to another process by now")
    }

    @Test("signals the parent ignores are at their defaults in the child, and it runs in its own process group")
    func signalDefaultsAndProcessGroup() async throws {
        // Process-wide, so for parallel tests too: harmless, as every launch resets it.
        let previous = Glibc.signal(SIGTERM, SIG_IGN)
        defer { Glibc.signal(SIGTERM, previous) }
        let child = try shell("cut -d ' ' -f 5 /proc/$$/stat; exec sleep 30 >/dev/null")
        let group = text(child.standardOutput).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(Int32(group) == child.processIdentifier)
        #expect(child.signal(SIGTERM))
        #expect(await child.waitForExit() == .signalled(SIGTERM))
    }

    @Test("no signal is blocked in the child, whatever threads the parent spawns from")
    func noBlockedSignals() async throws {
        // libdispatch's threads, which Swift's concurrency runs tasks on, block some signals; this
        // thread blocks SIGUSR1 for the launch (no suspension point between, so one thread).
        var blocked = sigset_t()
        var previous = sigset_t()
        sigemptyset(&blocked)
        sigaddset(&blocked, SIGUSR1)
        pthread_sigmask(SIG_BLOCK, &blocked, &previous)
        let launched = Result { try shell("exec grep SigBlk /proc/self/status") }
        pthread_sigmask(SIG_SETMASK, &previous, nil)
        let child = try launched.get()
        let line = text(child.standardOutput)
        _ = await child.waitForExit()
        #expect(line.hasPrefix("SigBlk:") && line.dropFirst("SigBlk:".count).allSatisfy { $0 == "0" || $0.isWhitespace }, "\(line)")
    }

    @Test("stderr following stdout is refused for stdout itself")
    func standardOutputForStandardOutput() {
        #expect(throws: LaunchError.self) {
            _ = try LaunchedProcess(executable: "/bin/true", arguments: [], standardOutput: .standardOutput)
        }
    }

    @Test("a program that cannot start is an error naming it")
    func missingExecutable() {
        #expect {
            _ = try LaunchedProcess(executable: "/nonexistent/apns-fleet", arguments: [])
        } throws: { error in
            "\(error)".contains("/nonexistent/apns-fleet")
        }
    }

    @Test("many children at once, from many tasks, all reaped with their own status")
    func manyChildren() async throws {
        try await withThrowingTaskGroup(of: Termination.self) { group in
            for index in 0..<40 {
                group.addTask {
                    let child = try LaunchedProcess(executable: "/bin/sh", arguments: ["-c", "exit \(index % 7)"])
                    let ended = await child.waitForExit()
                    #expect(ended == .exited(Int32(index % 7)))
                    return ended
                }
            }
            var count = 0
            for try await _ in group { count += 1 }
            #expect(count == 40)
        }
    }
}
