import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The parent's read end of a child's stdout or stderr. Reads block; meant for one reading
/// thread. Interrupted reads are retried, where Foundation's `FileHandle.availableData` traps.
public final class PipeReader: Sendable {
    private let descriptor: Int32

    init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    deinit {
        close(descriptor)
    }

    /// The next bytes the child wrote (at most `limit`), waiting for some; empty once every
    /// writer has closed the pipe (or on an error, which ends the stream all the same).
    public func read(upTo limit: Int = 65_536) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: limit)
        let count = buffer.withUnsafeMutableBytes { bytes in
            var count: Int
            repeat {
                count = Glibc.read(descriptor, bytes.baseAddress, bytes.count)
            } while count == -1 && errno == EINTR
            return count
        }
        guard count > 0 else { return [] }
        buffer.removeSubrange(count...)
        return buffer
    }

    /// Everything until every writer has closed the pipe.
    public func readToEnd() -> [UInt8] {
        var all: [UInt8] = []
        while case let chunk = read(), !chunk.isEmpty { all += chunk }
        return all
    }

    /// ``readToEnd()`` on a thread of its own: a blocking read must not hold one of the few
    /// threads Swift's concurrency runs every task on.
    public func collect() async -> [UInt8] {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: self.readToEnd()) }.start()
        }
    }
}

/// The parent's write end of a child's stdin.
public final class PipeWriter: Sendable {
    /// -1 once closed.
    private let descriptor: Mutex<Int32>

    init(descriptor: Int32) {
        self.descriptor = Mutex(descriptor)
    }

    deinit {
        close()
    }

    /// Writes every byte, waiting while the pipe is full (and holding up ``close()`` from other
    /// threads meanwhile; a child that stopped reading must be signalled). False if the pipe is
    /// closed, on either side.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return false }
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeBytes { buffer in
                    // As with any pipe, a write after the child has gone raises SIGPIPE unless
                    // the process ignores it (then this returns EPIPE).
                    Glibc.write(descriptor, buffer.baseAddress.map { $0 + offset }, buffer.count - offset)
                }
                if written == -1 && errno == EINTR { continue }
                guard written > 0 else { return false }
                offset += written
            }
            return true
        }
    }

    /// Closes the pipe: the child reads the end of its input.
    public func close() {
        descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return }
            Glibc.close(descriptor)
            descriptor = -1
        }
    }
}
