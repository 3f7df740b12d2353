import NIOCore
import NIOPosix
import Synchronization

/// A TCP proxy in front of the simulator that can go silent: while frozen it keeps every
/// socket open but drops all bytes both ways, the way a dead network path looks to a client.
/// With `maximumConnections`, a connection beyond that many open ones is closed at once (a
/// connect that keeps failing for one slot of a pool while another slot is up).
final class BlackholeProxy: Sendable {
    let port: Int
    private let channel: any Channel
    private let frozen: Frozen

    final class Frozen: Sendable {
        let value = Atomic<Bool>(false)

        final class Count: Sendable {
            let value = Atomic<Int>(0)
        }
    }

    private init(port: Int, channel: any Channel, frozen: Frozen) {
        self.port = port
        self.channel = channel
        self.frozen = frozen
    }

    static func start(upstreamPort: Int, maximumConnections: Int = .max, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> BlackholeProxy {
        let frozen = Frozen()
        let open = Frozen.Count()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                guard open.value.add(1, ordering: .relaxed).newValue <= maximumConnections else {
                    open.value.subtract(1, ordering: .relaxed)
                    return inbound.close()
                }
                inbound.closeFuture.whenComplete { _ in open.value.subtract(1, ordering: .relaxed) }
                return ClientBootstrap(group: inbound.eventLoop)
                    .channelInitializer { outbound in
                        outbound.eventLoop.makeCompletedFuture {
                            try outbound.pipeline.syncOperations.addHandler(Forwarder(target: inbound, frozen: frozen))
                        }
                    }
                    .connect(host: "127.0.0.1", port: upstreamPort)
                    .flatMapThrowing { outbound in
                        try inbound.pipeline.syncOperations.addHandler(Forwarder(target: outbound, frozen: frozen))
                    }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return BlackholeProxy(port: channel.localAddress?.port ?? 0, channel: channel, frozen: frozen)
    }

    func freeze(_ on: Bool = true) {
        frozen.value.store(on, ordering: .relaxed)
    }

    func stop() async {
        try? await channel.close()
    }

    private final class Forwarder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer

        private let target: any Channel
        private let frozen: Frozen

        init(target: any Channel, frozen: Frozen) {
            self.target = target
            self.frozen = frozen
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !frozen.value.load(ordering: .relaxed) else { return }
            target.writeAndFlush(unwrapInboundIn(data), promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            target.close(promise: nil)
            context.fireChannelInactive()
        }
    }
}
