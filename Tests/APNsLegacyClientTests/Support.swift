import APNsCore
import APNsLegacyClient
import APNsSimulator
import FleetTestSupport
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// Dev credentials (CA, server and client certificates) in a fresh temporary directory.
struct LegacyTestCredentials {
    let directory: String
    let credentials: DevCredentials
    let summary: DevCredentials.Summary

    static func make() throws -> LegacyTestCredentials {
        let directory = temporaryTestPath("apns-legacy-tests")
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        return LegacyTestCredentials(directory: directory, credentials: credentials, summary: summary)
    }

    func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

    var certificate: AppConfiguration.CertificateSource {
        .pem(certificateFile: path(summary.clientCertificateFile), privateKeyFile: path(summary.clientKeyFile), password: nil)
    }

    var serverTLS: APNsSimulatorConfiguration.TLS {
        APNsSimulatorConfiguration.TLS(
            certificateChainPEM: credentials.serverCertificatePEM,
            privateKeyPEM: credentials.serverKeyPEM,
            clientCAPEM: credentials.caCertificatePEM
        )
    }

    func endpoint(port: Int, tls: Bool) -> LegacyEndpoint {
        LegacyEndpoint(host: "127.0.0.1", port: port, tls: tls, caFile: tls ? path(summary.caFile) : nil)
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

enum Fixture {
    /// A distinct 32-byte token per index.
    static func token(_ index: Int) -> [UInt8] {
        (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ index &* 31 &+ 1) }
    }

    static func hex(_ bytes: [UInt8]) -> String { (try? DeviceToken(bytes: bytes).hex) ?? "" }

    static func payload(_ index: Int) -> [UInt8] { Array(#"{"aps":{"alert":"n\#(index)"}}"#.utf8) }

    static var logger: Logger {
        var logger = Logger(label: "apns-legacy-tests")
        logger.logLevel = .error
        return logger
    }
}

/// The simulator's legacy services on 127.0.0.1: gateway and feedback on TLS and plain ports
/// (port 0: any free port).
func startLegacyServices(
    _ credentials: LegacyTestCredentials,
    _ configure: (inout LegacyServicesConfiguration) -> Void = { _ in }
) async throws -> LegacyServices {
    var configuration = LegacyServicesConfiguration()
    configuration.gatewayTLSPort = 0
    configuration.gatewayPlainPort = 0
    configuration.feedbackTLSPort = 0
    configuration.feedbackPlainPort = 0
    configuration.tls = credentials.serverTLS
    configure(&configuration)
    return try await LegacyServices.start(configuration, logger: Fixture.logger, output: { _ in })
}

/// Runs `body` with a running gateway client, then shuts it down and waits for `run()` to end.
func withGatewayClient(
    _ configuration: LegacyGatewayConfiguration,
    _ body: @Sendable (LegacyGatewayClient) async throws -> Void
) async throws {
    let client = try LegacyGatewayClient(configuration: configuration, logger: Fixture.logger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await client.run() }
        // run() must have started before sends are taken.
        try await waitUntil { client.isRunning }
        do {
            try await body(client)
        } catch {
            client.shutdown()
            throw error
        }
        client.shutdown()
        try await group.waitForAll()
    }
}

struct TimedOut: Error, CustomStringConvertible {
    let description: String
}

/// Polls `condition` until it holds, for at most `timeout`.
func waitUntil(timeout: Duration = .seconds(5), _ what: String = "condition", _ condition: @Sendable () -> Bool) async throws {
    let end = ContinuousClock.now + timeout
    while !condition() {
        guard ContinuousClock.now < end else { throw TimedOut(description: "\(what) did not hold within \(timeout)") }
        try await Task.sleep(for: .milliseconds(2))
    }
}

/// A raw TCP server for feedback tests: writes `bytes` to each connection in chunks of the
/// given sizes (cycled), a moment apart so they arrive as separate reads, then closes (or, with
/// `holdOpen`, keeps the connection open, as the reference test server does for a minute).
final class ChunkedFeedbackServer: Sendable {
    let channel: any Channel
    /// Its own thread: on the event loops every suite shares, a busy neighbour could hold its
    /// timed writes back for a second, which the client rightly takes for a service done sending.
    private let group: MultiThreadedEventLoopGroup

    var port: Int { channel.localAddress?.port ?? 0 }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup) {
        self.channel = channel
        self.group = group
    }

    /// With `tls`, the service's side of TLS (client certificate required, as Apple's was).
    static func start(bytes: [UInt8], chunkSizes: [Int], holdOpen: Bool = false, gap: TimeAmount = .microseconds(300), tls: LegacyTestCredentials? = nil) async throws -> ChunkedFeedbackServer {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let sslContext = try tls.map { credentials in
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: try NIOSSLCertificate.fromPEMBytes(Array(credentials.credentials.serverCertificatePEM.utf8)).map { .certificate($0) },
                privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(credentials.credentials.serverKeyPEM.utf8), format: .pem))
            )
            configuration.certificateVerification = .noHostnameVerification
            configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(credentials.credentials.caCertificatePEM.utf8)))
            return try NIOSSLContext(configuration: configuration)
        }
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext)) }
                    try channel.pipeline.syncOperations.addHandler(ChunkWriter(bytes: bytes, chunkSizes: chunkSizes, holdOpen: holdOpen, gap: gap))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return ChunkedFeedbackServer(channel: channel, group: group)
    }

    func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }

    private final class ChunkWriter: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let bytes: [UInt8]
        let chunkSizes: [Int]
        let holdOpen: Bool
        let gap: TimeAmount

        init(bytes: [UInt8], chunkSizes: [Int], holdOpen: Bool, gap: TimeAmount) {
            self.bytes = bytes
            self.chunkSizes = chunkSizes
            self.holdOpen = holdOpen
            self.gap = gap
        }

        func channelActive(context: ChannelHandlerContext) {
            var chunks: [[UInt8]] = []
            var offset = 0
            var turn = 0
            while offset < bytes.count {
                let size = max(1, chunkSizes[turn % chunkSizes.count])
                chunks.append(Array(bytes[offset..<min(offset + size, bytes.count)]))
                offset += size
                turn += 1
            }
            let channel = context.channel
            for (index, chunk) in chunks.enumerated() {
                channel.eventLoop.scheduleTask(in: gap * Int64(index)) {
                    channel.writeAndFlush(channel.allocator.buffer(bytes: chunk), promise: nil)
                }
            }
            if !holdOpen {
                channel.eventLoop.scheduleTask(in: gap * Int64(chunks.count) + .milliseconds(1)) {
                    channel.close(promise: nil)
                }
            }
            context.fireChannelActive()
        }
    }
}

/// A raw gateway for the cases the simulator does not stage: it records the identifiers each
/// connection carried, and closes the first connection without an error-response once it has
/// read `dropFirstAfter` notifications.
final class DroppingGateway: Sendable {
    /// Identifiers read, per connection, in order.
    final class Seen: Sendable {
        let byConnection = Mutex<[[UInt32]]>([])
    }

    let channel: any Channel
    private let seen: Seen

    var port: Int { channel.localAddress?.port ?? 0 }
    var identifiersByConnection: [[UInt32]] { seen.byConnection.withLock { $0 } }

    private init(channel: any Channel, seen: Seen) {
        self.channel = channel
        self.seen = seen
    }

    static func start(dropFirstAfter: Int) async throws -> DroppingGateway {
        let seen = Seen()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let index = seen.byConnection.withLock { $0.append([]); return $0.count - 1 }
                    try channel.pipeline.syncOperations.addHandler(Reader(index: index, drop: index == 0 ? dropFirstAfter : nil, seen: seen))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return DroppingGateway(channel: channel, seen: seen)
    }

    func stop() async {
        try? await channel.close()
    }

    private final class Reader: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let index: Int
        let drop: Int?
        let seen: Seen
        var decoder = LegacyGatewayDecoder()
        var count = 0
        var closed = false

        init(index: Int, drop: Int?, seen: Seen) {
            self.index = index
            self.drop = drop
            self.seen = seen
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !closed else { return }
            var buffer = unwrapInboundIn(data)
            decoder.append(buffer.readBytes(length: buffer.readableBytes) ?? [])
            while case .notification(let notification, _) = decoder.next() {
                seen.byConnection.withLock { $0[index].append(notification.identifier) }
                count += 1
                if let drop, count >= drop {
                    closed = true
                    context.close(promise: nil)
                    return
                }
            }
        }
    }
}
