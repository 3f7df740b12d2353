import NIOCore
import NIOPosix
import Synchronization

/// A TCP proxy in front of the simulator that can go silent: while frozen it keeps every
/// socket open but drops all bytes both ways, the way a dead network path looks to a client.
final class BlackholeProxy: Sendable {
    let port: Int
    private let channel: any Channel
    private let frozen: Frozen

    final class Frozen: Sendable {
        let value = Atomic<Bool>(false)
    }

    private init(port: Int, channel: any Channel, frozen: Frozen) {
        self.port = port
        self.channel = channel
        self.frozen = frozen
    }

    static func start(upstreamPort: Int, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> BlackholeProxy {
        let frozen = Frozen()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                ClientBootstrap(group: inbound.eventLoop)
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
