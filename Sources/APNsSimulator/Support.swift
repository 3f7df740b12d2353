import APNsCore
import NIOCore
import NIOTLS
import Synchronization

/// The per-device rate limit, shared by every connection (APNs counts per device, not per connection).
final class DeviceRateLimiter: Sendable {
    private struct Window { var start: UInt64; var count: Int }
    private struct State {
        var windows: [String: Window] = [:]
        var prunedAt: UInt64 = 0
    }
    /// Past this many devices, windows that are over are dropped, at most once per window.
    static let pruneAbove = 100_000
    private let limit: Int
    private let window: UInt64
    private let state = Mutex(State())

    init(limit: Int, window: Duration) {
        self.limit = limit
        let (seconds, attoseconds) = window.components
        self.window = max(1, UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000))
    }

    /// Devices with a window in force or not yet dropped.
    var trackedDevices: Int { state.withLock { $0.windows.count } }

    /// Counts one request for `token` at `now` (read by the caller, so possibly a little before a
    /// request of another connection that took the lock first); false when it is over the limit.
    func admit(_ token: String, now: NIODeadline = .now()) -> Bool {
        let nanoseconds = now.uptimeNanoseconds
        let window = self.window
        // Clocks read on several threads arrive out of order: a window that started "later" than
        // `now` is simply still running.
        func elapsed(since start: UInt64) -> UInt64 { nanoseconds > start ? nanoseconds - start : 0 }
        return state.withLock { state in
            if state.windows.count > Self.pruneAbove, elapsed(since: state.prunedAt) >= window {
                state.windows = state.windows.filter { elapsed(since: $0.value.start) < window }
                state.prunedAt = nanoseconds
            }
            var entry = state.windows[token] ?? Window(start: nanoseconds, count: 0)
            if elapsed(since: entry.start) >= window { entry = Window(start: nanoseconds, count: 0) }
            entry.count += 1
            state.windows[token] = entry
            return entry.count <= limit
        }
    }
}

/// Readable dumps of requests (`--dump`): headers, a hex dump of the payload and the payload parsed.
enum RequestDump {
    static func hexDump(_ bytes: [UInt8]) -> String {
        var lines: [String] = []
        var offset = 0
        while offset < bytes.count {
            let row = bytes[offset..<min(offset + 16, bytes.count)]
            var line = String(offset, radix: 16).leftPad(4) + "  "
            for (index, byte) in row.enumerated() {
                line += String(byte, radix: 16).leftPad(2) + (index == 7 ? "  " : " ")
            }
            line += String(repeating: " ", count: (16 - row.count) * 3 + (row.count <= 8 ? 1 : 0))
            line += " |" + String(row.map { $0 >= 0x20 && $0 < 0x7F ? Character(UnicodeScalar($0)) : "." }) + "|"
            lines.append(line)
            offset += 16
        }
        return lines.joined(separator: "\n")
    }
}

extension String {
    func leftPad(_ width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}

/// Closes a connection whose client has not spoken in time: a client that connects and never
/// says anything (a port scanner, a plain-TCP health check, a stuck client) would otherwise hold
/// its socket for good. Gone once the client has done what it waits for:
/// - `.tlsHandshake`, placed right after the TLS handler: the handshake completed;
/// - `.http2Preface`, placed right before the HTTP/2 handler: the 24 bytes of the connection
///   preface arrived (real clients send it at once).
final class ConnectionDeadline: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    enum Awaiting {
        case tlsHandshake
        case http2Preface
    }

    /// Long enough for any real client on a loaded machine.
    static let timeout = TimeAmount.seconds(10)
    private static let prefaceLength = 24

    private let awaiting: Awaiting
    private var received = 0
    private var deadline: Scheduled<Void>?

    init(_ awaiting: Awaiting) {
        self.awaiting = awaiting
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        deadline = context.eventLoop.scheduleTask(in: Self.timeout) { channel.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        context.fireUserInboundEventTriggered(event)
        if awaiting == .tlsHandshake, let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent { met(context) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if awaiting == .http2Preface { received += unwrapInboundIn(data).readableBytes }
        context.fireChannelRead(data)
        if awaiting == .http2Preface, received >= Self.prefaceLength { met(context) }
    }

    private func met(_ context: ChannelHandlerContext) {
        guard deadline != nil else { return }
        deadline?.cancel()
        deadline = nil
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }
}

/// A server's open connections, so that stopping can reach every one. Once stopped it takes no
/// more: a connection accepted before the stop whose setup finishes after it (a TLS handshake)
/// is refused, and closes rather than outlive the stop.
final class ConnectionSet<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private let state = Mutex<(values: [Key: Value], stopped: Bool)>(([:], false))

    /// False once stopped: the caller closes the connection.
    func add(_ key: Key, _ value: Value) -> Bool {
        state.withLock { state in
            guard !state.stopped else { return false }
            state.values[key] = value
            return true
        }
    }

    func remove(_ key: Key) { state.withLock { _ = $0.values.removeValue(forKey: key) } }

    var all: [Value] { state.withLock { Array($0.values.values) } }

    /// Takes no more from now on; returns the connections open.
    @discardableResult
    func stop() -> [Value] {
        state.withLock { state in
            state.stopped = true
            return Array(state.values.values)
        }
    }
}

extension ConnectionSet where Key == ObjectIdentifier, Value == any Channel {
    /// Tracks `channel` until it closes; false once stopped.
    func open(_ channel: any Channel) -> Bool {
        let id = ObjectIdentifier(channel)
        guard add(id, channel) else { return false }
        channel.closeFuture.whenComplete { _ in self.remove(id) }
        return true
    }
}
