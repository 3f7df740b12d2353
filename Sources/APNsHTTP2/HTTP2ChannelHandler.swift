import NIOCore

/// Drives an `HTTP2Session` from a SwiftNIO channel: bytes read go into the session, and what
/// the session produces is written after every 4 KiB of input, at the end of a read burst
/// (`channelReadComplete`), or when the session's user calls `HTTP2Session.flush()` outside a
/// read burst.
///
/// Put it last in the pipeline, after TLS if any. The connection preface and initial SETTINGS
/// are sent when the channel becomes active.
///
/// Output is produced only while the channel is writable: a peer that stops reading leaves the
/// frames queued in the session instead of growing the channel's outbound buffer without end.
/// A server session also stops reading until the channel is writable again, because every
/// request it reads adds to what it must write (an answer, or a RST_STREAM refusing a stream
/// above the limit, which libnghttp2's flood guard does not count). A client keeps reading:
/// answers free its memory, and two peers that both stopped reading would wait for each other.
public final class HTTP2ChannelHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    public let session: HTTP2Session
    private let initialSettings: [HTTP2Setting]
    private var context: ChannelHandlerContext?
    private var started = false
    @exclusivity(unchecked) private var inReadBurst = false
    @exclusivity(unchecked) private var closed = false
    /// The last frames are being written; the close follows their write (`writeThenClose`).
    @exclusivity(unchecked) private var closing = false
    /// Closes the connection if the last frames are not written in time.
    private var closeDeadline: Scheduled<Void>?
    /// A `read` held back while a server's channel is not writable.
    @exclusivity(unchecked) private var readHeld = false
    /// Set while the session produces output: libnghttp2 can close a stream from inside
    /// `mem_send`, and a delegate that asks for a flush then must not re-enter it.
    @exclusivity(unchecked) private var producing = false
    @exclusivity(unchecked) private var flushAgain = false
    /// The output buffer, kept between flushes: TLS has encrypted its bytes by the time
    /// `writeAndFlush` returns, so clearing it reuses the storage instead of allocating (if
    /// anything still holds it, copy-on-write allocates anew).
    @exclusivity(unchecked) private var output: ByteBuffer?
    /// Called with a description when the session fails and the connection is closed.
    public var onError: ((HTTP2Error) -> Void)?

    public init(session: HTTP2Session, initialSettings: [HTTP2Setting]) {
        self.session = session
        self.initialSettings = initialSettings
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        session.driver = self
        if context.channel.isActive { start() }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        // Breaks the handler <-> session reference cycle.
        session.driver = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        start()
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        closed = true
        cancelCloseDeadline()
        session.delegate?.http2SessionDidClose(session)
        context.fireChannelInactive()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        // A big read is fed in slices, and what each slice produced is written before the next:
        // the peer then works on the first answers while the rest are made, instead of the two
        // sides taking turns over whole bursts.
        while !closed, !closing, let slice = buffer.readSlice(length: min(buffer.readableBytes, Self.inputSliceBytes)), slice.readableBytes > 0 {
            inReadBurst = true
            do {
                try session.receive(slice)
            } catch {
                fail(error)
                return
            }
            if buffer.readableBytes > 0, session.wantsWrite {
                inReadBurst = false
                flushOutput()
            }
        }
        inReadBurst = true
    }

    /// About 15 notification requests, or 100 responses, per slice: a write per slice costs
    /// less than the peer waiting for the whole read.
    static let inputSliceBytes = 4096

    public func channelReadComplete(context: ChannelHandlerContext) {
        inReadBurst = false
        flushOutput()
        context.fireChannelReadComplete()
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        // What was held back while the peer was not reading goes out now.
        if context.channel.isWritable {
            // The peer reads again: an ending session's deadline for not writing is lifted (a
            // last write's stands).
            if !closing { cancelCloseDeadline() }
            flushOutput()
            if readHeld, context.channel.isWritable {
                readHeld = false
                context.read()
            }
        } else if isEnding {
            // A write of the last frames (or of answers after a GOAWAY) filled the channel: the
            // peer gets the same deadline to read them.
            armCloseDeadline(context: context)
        }
        context.fireChannelWritabilityChanged()
    }

    public func read(context: ChannelHandlerContext) {
        if session.role == .server, !context.channel.isWritable {
            readHeld = true
            return
        }
        context.read()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        closeConnection()
    }

    /// Writes whatever the session has ready, unless inside a read burst (then it is written at
    /// its end) or the channel is not writable (then when it becomes writable).
    func flushOutput() {
        guard !inReadBurst, !closed, !closing, let context else { return }
        guard !producing else {
            flushAgain = true
            return
        }
        // The delegate's per-burst bookkeeping runs even when nothing can be written yet.
        session.delegate?.http2SessionWillFlush(session)
        guard context.channel.isWritable else {
            // A session on its way out (GOAWAY sent or queued) whose peer does not read might
            // never write its last frames: the connection closes unless it can write within
            // the same deadline as a last write's.
            if isEnding { armCloseDeadline(context: context) }
            return
        }
        var buffer = output.take() ?? context.channel.allocator.buffer(capacity: 16384)
        buffer.clear()
        do {
            try produce(into: &buffer)
        } catch {
            fail(error)
            return
        }
        let finished = !session.wantsRead && !session.wantsWrite
        if finished {
            // The session's last frames (a GOAWAY, the last answers) go out before the close.
            writeThenClose(buffer, context: context)
            return
        }
        if buffer.readableBytes > 0 {
            context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        }
        // A buffer grown by a huge burst is not kept.
        if buffer.capacity <= 1 << 20 { output = buffer }
    }

    /// Cancelled on every close, or the handler and its session would live on for its 5 s.
    private func cancelCloseDeadline() {
        closeDeadline?.cancel()
        closeDeadline = nil
    }

    /// Writes `buffer`, then closes once the socket has taken it: a close drops writes still
    /// pending in the channel, which over cleartext HTTP/2 (no TLS close to wait on) would lose
    /// the GOAWAY and answers that ended the session.
    private func writeThenClose(_ buffer: ByteBuffer, context: ChannelHandlerContext) {
        guard buffer.readableBytes > 0 else { return closeConnection() }
        // Nothing more is written meanwhile: a later flush must not close before this write.
        closing = true
        let written = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: written)
        written.futureResult.assumeIsolated().whenComplete { _ in self.closeConnection() }
        armCloseDeadline(context: context)
    }

    /// The session is on its way out: this side sent or queued a GOAWAY, or libnghttp2 ended it
    /// after a connection error (it then reads nothing more, yet reports no error).
    private var isEnding: Bool { session.isEnding || !session.wantsRead }

    /// A peer that stopped reading must not keep the connection open: it closes 5 s after the
    /// last write began, or after an ending session found the channel not writable (an earlier
    /// deadline stands).
    private func armCloseDeadline(context: ChannelHandlerContext) {
        guard closeDeadline == nil else { return }
        closeDeadline = context.eventLoop.assumeIsolated().scheduleTask(in: .seconds(5)) { self.closeConnection() }
    }

    /// What the session has ready, with flushes asked for meanwhile (from inside libnghttp2's
    /// `mem_send`) served by going round again rather than re-entering it.
    private func produce(into buffer: inout ByteBuffer) throws(HTTP2Error) {
        producing = true
        defer { producing = false }
        repeat {
            flushAgain = false
            try session.produceOutput(into: &buffer)
        } while flushAgain
    }

    func closeConnection() {
        cancelCloseDeadline()
        guard !closed, let context else { return }
        closed = true
        context.close(promise: nil)
    }

    private func start() {
        guard !started else { return }
        started = true
        do {
            try session.submitSettings(initialSettings)
        } catch {
            fail(error)
            return
        }
        flushOutput()
    }

    private func fail(_ error: HTTP2Error) {
        onError?(error)
        // Whatever the session queued (a GOAWAY for a protocol error) goes out before closing.
        inReadBurst = false
        guard let context, !closed, !closing else { return closeConnection() }
        var buffer = context.channel.allocator.buffer(capacity: 0)
        try? produce(into: &buffer)
        writeThenClose(buffer, context: context)
    }
}
