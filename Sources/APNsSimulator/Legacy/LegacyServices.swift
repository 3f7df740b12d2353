import APNsCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// The legacy binary gateway (Apple's port 2195) and feedback service (port 2196), each on a
/// TLS port and a plain port like the reference test server (2195/2295 and 2196/2296).
public struct LegacyServicesConfiguration: Sendable {
    /// Default: "127.0.0.1".
    public var host = "127.0.0.1"
    /// Gateway over TLS (client certificates are requested and checked against the TLS
    /// configuration's client CA when one is set). Needs `tls`. Default: nil (off).
    public var gatewayTLSPort: Int?
    /// Gateway over plain TCP, for local tests. Default: nil (off).
    public var gatewayPlainPort: Int?
    /// Feedback service over TLS. Needs `tls`. Default: nil (off).
    public var feedbackTLSPort: Int?
    /// Feedback service over plain TCP. Default: nil (off).
    public var feedbackPlainPort: Int?
    public var tls: APNsSimulatorConfiguration.TLS?
    /// Tokens (lowercase hex) whose app is gone, with when (ms): notifications to them are
    /// accepted, as Apple's gateway did, and they appear in the feedback service.
    public var unregisteredTokens: [String: Int64] = [:]
    /// Tokens (lowercase hex) the gateway answers with error-response 8, Invalid token.
    public var invalidTokens: Set<String> = []
    /// Payload limit of the simple and enhanced formats. Default: 256 (the reference's limit).
    public var maximumPayloadBytes = 256
    /// Print every PDU: a hex dump plus its parsed fields. Default: false.
    public var dump = false

    public init() {}
}

/// Exact counts of what the legacy services received and answered.
public struct LegacyCounts: Sendable, Hashable, Codable {
    public var gatewayConnections = 0
    /// Notifications accepted (no error-response), by format.
    public var accepted = 0
    /// Of those, notifications to unregistered tokens (accepted, and reported by feedback).
    public var acceptedForUnregistered = 0
    /// Error-responses sent, by status code.
    public var errorResponses: [String: Int] = [:]
    /// Identifiers of the first ``acceptedIdentifiersKept`` notifications accepted, in arrival
    /// order (tests assert on them; a long run does not grow the list without end).
    public var acceptedIdentifiers: [UInt32] = []
    public static let acceptedIdentifiersKept = 10_000
    public var feedbackConnections = 0
    public var feedbackTuplesSent = 0

    public init() {}
}

/// The running legacy services.
public final class LegacyServices: Sendable {
    public enum Listener: String, Sendable, Hashable, CaseIterable {
        case gatewayTLS = "gateway-tls"
        case gatewayPlain = "gateway"
        case feedbackTLS = "feedback-tls"
        case feedbackPlain = "feedback"
    }

    public let ports: [Listener: Int]
    private let channels: [any Channel]
    private let state: LegacyState

    private init(ports: [Listener: Int], channels: [any Channel], state: LegacyState) {
        self.ports = ports
        self.channels = channels
        self.state = state
    }

    public var counts: LegacyCounts { state.counts.withLock { $0 } }

    public func port(_ listener: Listener) -> Int? { ports[listener] }

    public static func start(
        _ configuration: LegacyServicesConfiguration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.simulator.legacy"),
        output: @escaping @Sendable (String) -> Void = { print($0) }
    ) async throws -> LegacyServices {
        let state = LegacyState(configuration: configuration, logger: logger, output: output)
        var sslContext: NIOSSLContext?
        let wantsTLS = configuration.gatewayTLSPort != nil || configuration.feedbackTLSPort != nil
        if wantsTLS {
            guard let tls = configuration.tls else {
                throw SimulatorConfigurationError("the legacy TLS ports need a server certificate and key")
            }
            sslContext = try APNsSimulator.makeTLSContext(tls, http2: false)
        }
        var channels: [any Channel] = []
        var ports: [Listener: Int] = [:]
        let plan: [(Listener, Int?, Bool, Bool)] = [
            (.gatewayTLS, configuration.gatewayTLSPort, true, true),
            (.gatewayPlain, configuration.gatewayPlainPort, false, true),
            (.feedbackTLS, configuration.feedbackTLSPort, true, false),
            (.feedbackPlain, configuration.feedbackPlainPort, false, false),
        ]
        do {
            for (listener, port, tls, gateway) in plan {
                guard let port else { continue }
                let context = tls ? sslContext : nil
                let bootstrap = ServerBootstrap(group: eventLoopGroup)
                    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                    .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                    .childChannelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            guard state.connections.open(channel) else { throw ChannelError.ioOnClosedChannel }
                            if let context {
                                try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                                try channel.pipeline.syncOperations.addHandler(ConnectionDeadline(.tlsHandshake))
                            }
                            if gateway {
                                try channel.pipeline.syncOperations.addHandler(GatewayHandler(state: state, transport: listener.rawValue))
                            } else {
                                try channel.pipeline.syncOperations.addHandler(FeedbackHandler(state: state, waitForHandshake: context != nil))
                            }
                        }
                    }
                let channel = try await listening("legacy \(listener.rawValue) listener", host: configuration.host, port: port) {
                    try await bootstrap.bind(host: configuration.host, port: port).get()
                }
                channels.append(channel)
                ports[listener] = channel.localAddress?.port
            }
        } catch {
            for channel in channels { try? await channel.close() }
            throw error
        }
        logger.debug("legacy services listening", metadata: ["simulator.ports": "\(ports.map { "\($0.key.rawValue)=\($0.value)" }.sorted().joined(separator: " "))"])
        return LegacyServices(ports: ports, channels: channels, state: state)
    }

    /// Stops listening and closes the open connections (a client sees the service go away).
    public func stop() async {
        for channel in channels { try? await channel.close() }
        let open = state.connections.stop()
        for channel in open { try? await channel.close() }
    }

    /// Stops listening without waiting (for `defer` blocks); open connections finish on their own.
    public func shutdown() {
        for channel in channels { channel.close(promise: nil) }
    }
}

/// Shared by every legacy connection: configuration, counters and the dump sink.
final class LegacyState: Sendable {
    let configuration: LegacyServicesConfiguration
    let counts = Mutex(LegacyCounts())
    let logger: Logger
    let output: @Sendable (String) -> Void
    let connections = ConnectionSet<ObjectIdentifier, any Channel>()

    init(configuration: LegacyServicesConfiguration, logger: Logger, output: @escaping @Sendable (String) -> Void) {
        self.configuration = configuration
        self.logger = logger
        self.output = output
    }

    /// The feedback tuples: every unregistered token, oldest first.
    func feedbackTuples() -> [FeedbackTuple] {
        configuration.unregisteredTokens
            .sorted { ($0.value, $0.key) < ($1.value, $1.key) }
            .compactMap { hex, millis in
                guard let token = try? DeviceToken(hex: hex) else { return nil }
                return FeedbackTuple(timestamp: UInt32(clamping: millis / 1000), token: token.bytes)
            }
    }
}

/// One gateway connection: parses PDUs as they arrive, answers the first bad one with an
/// error-response and closes, like Apple's gateway.
final class GatewayHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let state: LegacyState
    private let transport: String
    private var decoder: LegacyGatewayDecoder
    private var failed = false

    init(state: LegacyState, transport: String) {
        self.state = state
        self.transport = transport
        self.decoder = LegacyGatewayDecoder(maximumPayloadBytes: state.configuration.maximumPayloadBytes)
    }

    func channelActive(context: ChannelHandlerContext) {
        state.counts.withLock { $0.gatewayConnections += 1 }
        if state.configuration.dump {
            state.output("Accepted push connection (\(transport)) from \(context.remoteAddress.map { "\($0)" } ?? "?")")
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !failed else { return }
        var buffer = unwrapInboundIn(data)
        let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
        if state.configuration.dump {
            state.output("=== RECEIVED DATA (\(bytes.count) bytes) ===\n" + HexDump.lines(bytes).joined(separator: "\n"))
        }
        decoder.append(bytes)
        while true {
            switch decoder.next() {
            case .needMoreBytes:
                return
            case .notification(let notification, _):
                if let response = judge(notification) {
                    fail(context: context, response: response, detail: "token \(hex(notification.token)) is configured as invalid")
                    return
                }
            case .malformed(let response, let detail):
                fail(context: context, response: response, detail: detail)
                return
            }
        }
    }

    /// Accepts a well-formed notification, or returns the error-response for it.
    private func judge(_ notification: LegacyNotification) -> LegacyErrorResponse? {
        let tokenHex = hex(notification.token)
        if state.configuration.dump {
            var fields = [
                "command: \(notification.format.rawValue)",
                "identifier: \(notification.identifier)",
                "expiry: \(notification.expiry)",
                "token (\(notification.token.count) bytes): \(tokenHex)",
                "payload (\(notification.payload.count) bytes): \(String(decoding: notification.payload, as: UTF8.self))",
            ]
            if let priority = notification.priority { fields.append("priority: \(priority)") }
            state.output("=== PDU ===\n  " + fields.joined(separator: "\n  "))
        }
        if state.configuration.invalidTokens.contains(tokenHex) {
            return LegacyErrorResponse(status: .invalidToken, identifier: notification.identifier)
        }
        let unregistered = state.configuration.unregisteredTokens[tokenHex] != nil
        state.counts.withLock {
            $0.accepted += 1
            if unregistered { $0.acceptedForUnregistered += 1 }
            if $0.acceptedIdentifiers.count < LegacyCounts.acceptedIdentifiersKept { $0.acceptedIdentifiers.append(notification.identifier) }
        }
        return nil
    }

    private func fail(context: ChannelHandlerContext, response: LegacyErrorResponse, detail: String) {
        failed = true
        state.counts.withLock { $0.errorResponses[String(response.status.code), default: 0] += 1 }
        if state.configuration.dump {
            let bytes = response.encoded()
            state.output("=== SEND ERROR: \(bytes.map { String($0, radix: 16, uppercase: true).leftPaddedByte }.joined()) (status \(response.status), identifier \(response.identifier)): \(detail)")
        }
        state.logger.debug("legacy gateway error-response", metadata: ["legacy.status": "\(response.status.code)", "legacy.identifier": "\(response.identifier)"])
        let buffer = context.channel.allocator.buffer(bytes: response.encoded())
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String($0, radix: 16).leftPaddedByte }.joined()
    }
}

/// One feedback connection: streams every tuple, then closes. Nothing needs to be sent first.
final class FeedbackHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let state: LegacyState
    private let waitForHandshake: Bool

    init(state: LegacyState, waitForHandshake: Bool) {
        self.state = state
        self.waitForHandshake = waitForHandshake
    }

    func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        if !waitForHandshake { send(context: context) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if waitForHandshake, let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent {
            send(context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Providers send nothing; anything they do send is ignored.
    }

    private func send(context: ChannelHandlerContext) {
        let tuples = state.feedbackTuples()
        state.counts.withLock {
            $0.feedbackConnections += 1
            $0.feedbackTuplesSent += tuples.count
        }
        var bytes: [UInt8] = []
        for tuple in tuples {
            let encoded = tuple.encoded()
            if state.configuration.dump {
                state.output("SEND: \(encoded.map { String($0, radix: 16, uppercase: true).leftPaddedByte }.joined())")
            }
            bytes += encoded
        }
        let buffer = context.channel.allocator.buffer(bytes: bytes)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

extension String {
    fileprivate var leftPaddedByte: String { count == 1 ? "0" + self : self }
}
