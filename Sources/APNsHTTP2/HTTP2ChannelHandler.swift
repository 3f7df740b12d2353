import NIOCore

/// Drives an `HTTP2Session` from a SwiftNIO channel: bytes read go into the session, and what
/// the session produces is written once per read burst (at `channelReadComplete`) or when the
/// session's user calls `HTTP2Session.flush()` outside a read burst.
///
/// Put it last in the pipeline, after TLS if any. The connection preface and initial SETTINGS
/// are sent when the channel becomes active.
public final class HTTP2ChannelHandler: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    public let session: HTTP2Session
    private let initialSettings: [HTTP2Setting]
    private var context: ChannelHandlerContext?
    private var started = false
    private var inReadBurst = false
    private var closed = false
    /// The output buffer, kept between flushes: TLS has encrypted its bytes by the time
    /// `writeAndFlush` returns, so clearing it reuses the storage instead of allocating (if
    /// anything still holds it, copy-on-write allocates anew).
    private var output: ByteBuffer?
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
        session.delegate?.http2SessionDidClose(session)
        context.fireChannelInactive()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        inReadBurst = true
        do {
            try session.receive(buffer)
        } catch {
            fail(error)
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        inReadBurst = false
        flushOutput()
        context.fireChannelReadComplete()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        closeConnection()
    }

    /// Writes whatever the session has ready, unless inside a read burst (then it is written at its end).
    func flushOutput() {
        guard !inReadBurst, !closed, let context else { return }
        session.delegate?.http2SessionWillFlush(session)
        var buffer = output.take() ?? context.channel.allocator.buffer(capacity: 16384)
        buffer.clear()
        do {
            try session.produceOutput(into: &buffer)
        } catch {
            fail(error)
            return
        }
        if buffer.readableBytes > 0 {
            context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        }
        // A buffer grown by a huge burst is not kept.
        if buffer.capacity <= 1 << 20 { output = buffer }
        if !session.wantsRead && !session.wantsWrite {
            closeConnection()
        }
    }

    func closeConnection() {
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
        if let context, !closed {
            var buffer = context.channel.allocator.buffer(capacity: 0)
            try? session.produceOutput(into: &buffer)
            if buffer.readableBytes > 0 { context.writeAndFlush(wrapOutboundOut(buffer), promise: nil) }
        }
        closeConnection()
    }
}
