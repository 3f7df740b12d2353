import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn`, reaped by a thread of its own.
///
/// The demo, the benchmarks and the test suites start many children. Foundation's `Process.run()`
/// on Linux (swift-corelibs-foundation up to 6.3.3) copies 256 bytes out of each `/proc/self/fd`
/// entry that `readdir` returned, past the end of glibc's buffer when the entry sits at its end,
/// and crashes the parent now and then (swiftlang/swift-corelibs-foundation#5472). This does what
/// the project needs of it directly.
///
/// The child runs in a process group of its own (so a Ctrl-C reaches only the parent, which
/// decides what to stop), with every signal at its default and none blocked (a parent that
/// traps SIGINT and SIGTERM would otherwise pass that on), and with no descriptors but its
/// standard three.
///
/// ``signal(_:)`` is safe against pid reuse: a child is reaped only under the lock that sending a
/// signal takes, after it was seen to have ended.
public final class LaunchedProcess: Sendable {
    public enum Input: Sendable {
        case nullDevice
        /// A pipe the parent writes through ``standardInput``.
        case pipe
    }

    public enum Output: Sendable {
        case nullDevice
        /// The parent's own stdout or stderr.
        case inherit
        /// A pipe the parent reads through ``standardOutput`` or ``standardError``.
        case pipe
        /// Appended to this file (created if missing); stdout and stderr may share one.
        case appending(toFile: String)
        /// For stderr: wherever stdout goes (one pipe or file for both, in the order written).
        case standardOutput
    }

    public let processIdentifier: Int32
    /// The write end of the child's stdin, with ``Input/pipe``.
    public let standardInput: PipeWriter?
    /// The read ends of the child's stdout and stderr, with ``Output/pipe``.
    public let standardOutput: PipeReader?
    public let standardError: PipeReader?

    private struct State {
        var termination: Termination?
        var waiters: [CheckedContinuation<Termination, Never>] = []
    }

    private let state = Mutex(State())
    private static let launching = Mutex(())

    /// Starts `executable` (a path; no `PATH` search) with `arguments`. `environment` replaces
    /// the parent's when given.
    public init(
        executable: String,
        arguments: [String],
        environment: [String: String]? = nil,
        standardInput input: Input = .nullDevice,
        standardOutput output: Output = .inherit,
        standardError error: Output = .inherit
    ) throws(LaunchError) {
        if case .standardOutput = output {
            throw LaunchError(description: "stdout cannot follow stdout: .standardOutput is for stderr only")
        }
        // One launch at a time from here to the spawn: a pipe end is not close-on-exec for an
        // instant after `pipe()`, and another launch's child must not inherit it.
        let launched: (Int32, Int32?, Int32?, Int32?) = try Self.launching.withLock { _ throws(LaunchError) in
            var plan = SpawnPlan()
            defer { plan.closeChildEnds() }
            do throws(LaunchError) {
                let stdin = try plan.input(input)
                let stdout = try plan.output(output, into: STDOUT_FILENO)
                let stderr = try plan.output(error, into: STDERR_FILENO)
                let pid = try plan.spawn(executable: executable, arguments: arguments, environment: environment)
                return (pid, stdin, stdout, stderr)
            } catch {
                plan.closeParentEnds()
                throw error
            }
        }
        processIdentifier = launched.0
        standardInput = launched.1.map(PipeWriter.init(descriptor:))
        standardOutput = launched.2.map(PipeReader.init(descriptor:))
        standardError = launched.3.map(PipeReader.init(descriptor:))
        startReaper()
    }

    /// How the child ended; nil while it runs.
    public var termination: Termination? { state.withLock { $0.termination } }

    public var isRunning: Bool { termination == nil }

    /// Sends `signal` unless the child has already ended (and may have been reaped, its pid free
    /// for another process). True when it was sent.
    @discardableResult
    public func signal(_ signal: Int32) -> Bool {
        state.withLock { state in
            guard state.termination == nil else { return false }
            return kill(processIdentifier, signal) == 0
        }
    }

    /// SIGTERM, as `Process.terminate()`.
    public func terminate() { signal(SIGTERM) }

    /// Waits until the child has ended.
    public func waitForExit() async -> Termination {
        await withCheckedContinuation { continuation in
            let ended: Termination? = state.withLock { state in
                if let termination = state.termination { return termination }
                state.waiters.append(continuation)
                return nil
            }
            if let ended { continuation.resume(returning: ended) }
        }
    }

    private func startReaper() {
        let pid = processIdentifier
        let thread = Thread { [self] in
            // Wait without reaping: the pid stays the child's until the lock below is held.
            var info = siginfo_t()
            var waited: Int32
            repeat {
                waited = waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT)
            } while waited == -1 && errno == EINTR
            let (termination, waiters) = state.withLock { state in
                var status: Int32 = 0
                var reaped: Int32 = -1
                // The child has ended (it is a zombie now), so this returns at once. If `waitid`
                // failed, something else reaped it (a `waitpid(-1)` elsewhere): its status is lost.
                while waited == 0 {
                    reaped = waitpid(pid, &status, WNOHANG)
                    if reaped != -1 || errno != EINTR { break }
                }
                let termination: Termination = reaped == pid ? Termination(waitStatus: status) : .unknown
                state.termination = termination
                defer { state.waiters = [] }
                return (termination, state.waiters)
            }
            for waiter in waiters { waiter.resume(returning: termination) }
        }
        thread.name = "reaper-\(pid)"
        thread.start()
    }
}

/// How a child process ended.
public enum Termination: Sendable, Hashable, CustomStringConvertible {
    case exited(Int32)
    case signalled(Int32)
    /// Reaped by someone else; the status is lost.
    case unknown

    init(waitStatus status: Int32) {
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import.
        let signal = status & 0x7F
        self = signal == 0 ? .exited((status >> 8) & 0xFF) : .signalled(signal)
    }

    /// As Foundation's `terminationStatus`: the exit status, or the number of the signal that
    /// ended it (-1 when unknown).
    public var status: Int32 {
        switch self {
        case .exited(let code): code
        case .signalled(let signal): signal
        case .unknown: -1
        }
    }

    public var description: String {
        switch self {
        case .exited(let code): "exit status \(code)"
        case .signalled(let signal): "killed by signal \(signal)"
        case .unknown: "ended (status unknown)"
        }
    }
}

public struct LaunchError: Error, CustomStringConvertible {
    public var description: String
}

/// The descriptors and `posix_spawn` settings of one launch.
private struct SpawnPlan {
    /// Given to the child by dup2; the parent closes its copies once the child has started.
    private var childEnds: [Int32] = []
    /// Pipe ends the parent keeps; closed if the launch fails.
    private var parentEnds: [Int32] = []
    /// (descriptor in the parent, the standard descriptor it becomes in the child)
    private var dups: [(Int32, Int32)] = []
    /// (standard descriptor, open flags) to open on /dev/null in the child.
    private var nullDevices: [(Int32, Int32)] = []
    /// stderr is a copy of stdout.
    private var mergesErrors = false

    mutating func input(_ input: LaunchedProcess.Input) throws(LaunchError) -> Int32? {
        switch input {
        case .nullDevice:
            nullDevices.append((STDIN_FILENO, O_RDONLY))
            return nil
        case .pipe:
            let (read, write) = try makePipe()
            childEnds.append(read)
            parentEnds.append(write)
            dups.append((read, STDIN_FILENO))
            return write
        }
    }

    mutating func output(_ output: LaunchedProcess.Output, into target: Int32) throws(LaunchError) -> Int32? {
        switch output {
        case .inherit:
            return nil
        case .nullDevice:
            nullDevices.append((target, O_WRONLY))
            return nil
        case .pipe:
            let (read, write) = try makePipe()
            childEnds.append(write)
            parentEnds.append(read)
            dups.append((write, target))
            return read
        case .standardOutput:
            mergesErrors = true
            return nil
        case .appending(let path):
            // O_APPEND: stdout and stderr each get a descriptor, and neither overwrites the other.
            let opened = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
            guard opened >= 0 else { throw LaunchError(description: "cannot open \(path) for the child's output: \(Self.errorText(errno))") }
            let descriptor = try Self.aboveStandardDescriptors(opened)
            childEnds.append(descriptor)
            dups.append((descriptor, target))
            return nil
        }
    }

    private mutating func makePipe() throws(LaunchError) -> (read: Int32, write: Int32) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw LaunchError(description: "cannot make a pipe: \(Self.errorText(errno))") }
        // `pipe2` (with O_CLOEXEC at once) is not imported; launches are serialised instead.
        // A descriptor that cannot be moved is closed by the move; the other end is closed here.
        let read: Int32
        do throws(LaunchError) {
            read = try Self.aboveStandardDescriptors(ends[0])
        } catch {
            close(ends[1])
            throw error
        }
        do throws(LaunchError) {
            return (read, try Self.aboveStandardDescriptors(ends[1]))
        } catch {
            close(read)
            throw error
        }
    }

    /// `descriptor` itself, close-on-exec, if it is above stderr; otherwise (the parent has
    /// closed a standard descriptor, and `open` or `pipe` handed it out) a close-on-exec copy
    /// above stderr, the original closed. Otherwise the child's file actions, which set up
    /// 0, 1 and 2 one after another, could overwrite it before it is copied.
    private static func aboveStandardDescriptors(_ descriptor: Int32) throws(LaunchError) -> Int32 {
        guard descriptor <= STDERR_FILENO else {
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
            return descriptor
        }
        let moved = fcntl(descriptor, F_DUPFD_CLOEXEC, STDERR_FILENO + 1)
        let failure = errno
        close(descriptor)
        guard moved >= 0 else { throw LaunchError(description: "cannot move a descriptor above stderr: \(errorText(failure))") }
        return moved
    }

    mutating func spawn(executable: String, arguments: [String], environment: [String: String]?) throws(LaunchError) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, flags) in nullDevices {
            posix_spawn_file_actions_addopen(&actions, target, "/dev/null", flags, 0)
        }
        for (parent, child) in dups {
            posix_spawn_file_actions_adddup2(&actions, parent, child)
        }
        if mergesErrors { posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO) }
        // Everything else the parent has open (sockets of libraries that do not set
        // close-on-exec, say) stays out of the child.
        if let closeFrom = Self.addCloseFrom {
            let failure = closeFrom(&actions, STDERR_FILENO + 1)
            guard failure == 0 else { throw LaunchError(description: "cannot start \(executable): \(Self.errorText(failure))") }
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        // Every signal the parent ignores or handles starts at its default in the child.
        var defaults = sigset_t()
        sigfillset(&defaults)
        sigdelset(&defaults, SIGKILL)
        sigdelset(&defaults, SIGSTOP)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = CStringArray([executable] + arguments)
        defer { argv.free() }
        var pid: pid_t = 0
        let result: Int32
        if let environment {
            let envp = CStringArray(environment.map { "\($0.key)=\($0.value)" })
            defer { envp.free() }
            result = posix_spawn(&pid, executable, &actions, &attributes, argv.pointers, envp.pointers)
        } else {
            result = posix_spawn(&pid, executable, &actions, &attributes, argv.pointers, environ)
        }
        guard result == 0 else { throw LaunchError(description: "cannot start \(executable): \(Self.errorText(result))") }
        return pid
    }

    func closeChildEnds() {
        for descriptor in Set(childEnds) { close(descriptor) }
    }

    func closeParentEnds() {
        for descriptor in Set(parentEnds) { close(descriptor) }
    }

    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32

    /// glibc 2.34's `posix_spawn_file_actions_addclosefrom_np`, which Swift's Glibc module does
    /// not import; nil on an older libc (children then keep descriptors not marked close-on-exec).
    private static let addCloseFrom: AddCloseFrom? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: AddCloseFrom.self)
    }()

    static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }
}

/// A NULL-terminated array of C strings, as `posix_spawn` takes its arguments and environment.
private struct CStringArray {
    let pointers: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>
    private let count: Int

    init(_ strings: [String]) {
        count = strings.count
        pointers = .allocate(capacity: strings.count + 1)
        for (index, string) in strings.enumerated() { pointers[index] = strdup(string) }
        pointers[strings.count] = nil
    }

    func free() {
        for index in 0..<count { Glibc.free(pointers[index]) }
        pointers.deallocate()
    }
}
