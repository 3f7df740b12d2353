import APNsCore
import APNsHTTP2
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import ServiceLifecycle
import SwiftASN1
import X509

/// The kinds of listener a simulator can host: the HTTP/2 provider API, the admin endpoint, and
/// the legacy binary gateway and feedback service.
public struct SimulatorListener: Sendable, Hashable, CustomStringConvertible {
    public let name: String
    public init(name: String) { self.name = name }

    public static let http2TLS = SimulatorListener(name: "h2")
    public static let http2Cleartext = SimulatorListener(name: "h2c")
    public static let admin = SimulatorListener(name: "admin")
    public static let legacyGatewayTLS = SimulatorListener(name: "gateway-tls")
    public static let legacyGatewayPlain = SimulatorListener(name: "gateway")
    public static let legacyFeedbackTLS = SimulatorListener(name: "feedback-tls")
    public static let legacyFeedbackPlain = SimulatorListener(name: "feedback")

    public var description: String { name }
}

/// An APNs simulator running in this process.
///
/// ```swift
/// var configuration = APNsSimulatorConfiguration()
/// configuration.listeners.http2CleartextPort = 0
/// let simulator = try await APNsSimulator.start(configuration)
/// let port = simulator.port(.http2Cleartext)
/// // ...
/// await simulator.stop()
/// ```
public final class APNsSimulator: Sendable {
    public let configuration: APNsSimulatorConfiguration
    /// Exact counts of what arrived and what was answered.
    public let counters: SimulatorCounters
    /// The bound port of each listener.
    public let ports: [SimulatorListener: Int]

    /// The legacy binary gateway and feedback service, when any of their ports is configured.
    public let legacy: LegacyServices?

    private let context: SimulatorContext
    private let serverChannels: [any Channel]
    private let logger: Logger

    private init(
        configuration: APNsSimulatorConfiguration, context: SimulatorContext, serverChannels: [any Channel],
        ports: [SimulatorListener: Int], legacy: LegacyServices?, logger: Logger
    ) {
        self.configuration = configuration
        self.counters = context.counters
        self.context = context
        self.serverChannels = serverChannels
        self.ports = ports
        self.legacy = legacy
        self.logger = logger
    }

    /// The bound port of `listener`, nil when it is not enabled.
    public func port(_ listener: SimulatorListener) -> Int? { ports[listener] }

    /// Binds every configured listener and starts answering.
    public static func start(
        _ configuration: APNsSimulatorConfiguration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.simulator")
    ) async throws -> APNsSimulator {
        try configuration.validate()
        let context = SimulatorContext(configuration: configuration, counters: SimulatorCounters(), logger: logger)
        var channels: [any Channel] = []
        var ports: [SimulatorListener: Int] = [:]
        let host = configuration.listeners.host
        do {
            if let port = configuration.listeners.http2CleartextPort {
                let channel = try await listening("HTTP/2 cleartext listener (h2c)", host: host, port: port) {
                    try await bindHTTP2(context: context, host: host, port: port, tls: nil, group: eventLoopGroup, logger: logger)
                }
                channels.append(channel)
                ports[.http2Cleartext] = channel.localAddress?.port
            }
            if let port = configuration.listeners.http2TLSPort, let tls = configuration.tls {
                let sslContext = try makeTLSContext(tls)
                let channel = try await listening("HTTP/2 TLS listener (h2)", host: host, port: port) {
                    try await bindHTTP2(context: context, host: host, port: port, tls: sslContext, group: eventLoopGroup, logger: logger)
                }
                channels.append(channel)
                ports[.http2TLS] = channel.localAddress?.port
            }
            if let port = configuration.listeners.adminPort {
                let actions = AdminServer.Actions(
                    goAway: { reason in for handle in context.registry.all { handle.goAway(reason) } },
                    reset: {
                        let handles = context.registry.all
                        for handle in handles { handle.reset() }
                        return handles.count
                    },
                    closeNotify: {
                        let handles = context.registry.all
                        for handle in handles { handle.closeNotify() }
                        return handles.count
                    },
                    faults: context.faults,
                    behaviour: configuration.behaviour
                )
                let channel = try await listening("admin listener", host: host, port: port) {
                    try await AdminServer.bind(host: host, port: port, group: eventLoopGroup, counters: context.counters, actions: actions)
                }
                channels.append(channel)
                ports[.admin] = channel.localAddress?.port
            }
        } catch {
            for channel in channels { try? await channel.close() }
            throw error
        }
        var legacy: LegacyServices?
        let listeners = configuration.listeners
        if listeners.legacyGatewayTLSPort != nil || listeners.legacyGatewayPlainPort != nil
            || listeners.legacyFeedbackTLSPort != nil || listeners.legacyFeedbackPlainPort != nil
        {
            var legacyConfiguration = LegacyServicesConfiguration()
            legacyConfiguration.host = host
            legacyConfiguration.gatewayTLSPort = listeners.legacyGatewayTLSPort
            legacyConfiguration.gatewayPlainPort = listeners.legacyGatewayPlainPort
            legacyConfiguration.feedbackTLSPort = listeners.legacyFeedbackTLSPort
            legacyConfiguration.feedbackPlainPort = listeners.legacyFeedbackPlainPort
            legacyConfiguration.tls = configuration.tls
            legacyConfiguration.unregisteredTokens = configuration.behaviour.unregisteredTokens
            legacyConfiguration.invalidTokens = configuration.behaviour.invalidLegacyTokens
            legacyConfiguration.dump = configuration.dump
            do {
                let services = try await LegacyServices.start(legacyConfiguration, eventLoopGroup: eventLoopGroup, logger: logger, output: configuration.dumpSink)
                let kinds: [(LegacyServices.Listener, SimulatorListener)] = [
                    (.gatewayTLS, .legacyGatewayTLS), (.gatewayPlain, .legacyGatewayPlain),
                    (.feedbackTLS, .legacyFeedbackTLS), (.feedbackPlain, .legacyFeedbackPlain),
                ]
                for (kind, listener) in kinds {
                    if let port = services.port(kind) { ports[listener] = port }
                }
                legacy = services
            } catch {
                for channel in channels { try? await channel.close() }
                throw error
            }
        }
        let simulator = APNsSimulator(configuration: configuration, context: context, serverChannels: channels, ports: ports, legacy: legacy, logger: logger)
        logger.info("APNs simulator listening", metadata: ["simulator.ports": "\(ports.map { "\($0.key)=\($0.value)" }.sorted().joined(separator: " "))"])
        return simulator
    }

    /// Sends GOAWAY with `{"reason": reason}` on every open connection.
    public func goAway(reason: String = APNsReason.shutdown.rawValue) {
        for handle in context.registry.all { handle.goAway(reason) }
    }

    /// Resets every open connection at the TCP level (RST, no GOAWAY or close_notify).
    public func resetConnections() {
        for handle in context.registry.all { handle.reset() }
    }

    /// Closes every open connection with a TLS close_notify (FIN on cleartext ones), no GOAWAY.
    public func closeNotifyConnections() {
        for handle in context.registry.all { handle.closeNotify() }
    }

    /// Faults switched on and off at run time, over the configured behaviour.
    public var faults: RuntimeFaults { context.faults }

    /// Replaces the run-time faults (an empty value clears them).
    public func setFaults(_ overrides: RuntimeFaults.Overrides) throws {
        try overrides.validate(over: configuration.behaviour)
        context.faults.set(overrides)
    }

    /// Stops listening, sends GOAWAY Shutdown to every connection, lets in-flight streams finish
    /// for up to `gracePeriod`, then closes what is left.
    public func stop(gracePeriod: Duration = .seconds(2)) async {
        for channel in serverChannels { try? await channel.close() }
        // Connections accepted before the listeners closed may finish their TLS handshake later.
        context.registry.stop()
        await legacy?.stop()
        goAway(reason: APNsReason.shutdown.rawValue)
        let deadline = ContinuousClock.now + gracePeriod
        while !context.registry.all.isEmpty, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        for handle in context.registry.all { try? await handle.channel.close() }
    }

    // MARK: Bootstrap

    /// The server TLS context of the HTTP/2 listeners (ALPN h2; client certificates optional,
    /// since token-auth clients present none) or of the legacy ones (no ALPN; a client
    /// certificate is the only provider authentication there).
    static func makeTLSContext(_ tls: APNsSimulatorConfiguration.TLS, http2: Bool = true) throws -> NIOSSLContext {
        let chain = try NIOSSLCertificate.fromPEMBytes(Array(tls.certificateChainPEM.utf8))
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(bytes: Array(tls.privateKeyPEM.utf8), format: .pem)
        } catch {
            throw SimulatorConfigurationError("the server private key is not a PEM private key")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        configuration.minimumTLSVersion = .tlsv12
        if http2 { configuration.applicationProtocols = ["h2"] }
        if let caPEM = tls.clientCAPEM {
            configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(caPEM.utf8)))
            configuration.certificateVerification = http2 ? .optionalVerification : .noHostnameVerification
        }
        return try NIOSSLContext(configuration: configuration)
    }

    private static func bindHTTP2(
        context: SimulatorContext, host: String, port: Int, tls: NIOSSLContext?, group: any EventLoopGroup, logger: Logger
    ) async throws -> any Channel {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                        try channel.pipeline.syncOperations.addHandler(ConnectionDeadline(.tlsHandshake))
                        try channel.pipeline.syncOperations.addHandler(TLSConnectionStarter(context: context, logger: logger))
                    } else {
                        try installHTTP2(on: channel, context: context, transport: "h2c", authentication: makeTokenAuthentication(context))
                    }
                }
            }
        return try await bootstrap.bind(host: host, port: port).get()
    }

    static func makeTokenAuthentication(_ context: SimulatorContext) -> ConnectionAuthentication {
        .token(TokenAuthenticator(verifier: context.verifier, minimumChangeInterval: context.configuration.authentication.minimumTokenChangeInterval))
    }

    static func installHTTP2(on channel: any Channel, context: SimulatorContext, transport: String, authentication: ConnectionAuthentication) throws {
        let connection = SimulatorConnection(context: context, channel: channel, transport: transport, authentication: authentication)
        let session = try HTTP2Session(role: .server, delegate: connection)
        connection.session = session
        let handler = HTTP2ChannelHandler(session: session, initialSettings: connection.initialSettings)
        // A client that connects and says nothing (a port scanner, a stuck client) would hold
        // the socket for good: real clients send the preface at once.
        try channel.pipeline.syncOperations.addHandler(ConnectionDeadline(.http2Preface))
        // A client's protocol error ends its connection; say why, for whoever is debugging it.
        handler.onError = { [logger = context.logger, id = connection.id] error in
            logger.notice("HTTP/2 session with a client failed; connection closed", metadata: ["simulator.connection": "\(id)", "error": "\(error)"])
        }
        try channel.pipeline.syncOperations.addHandler(handler)
        connection.activate()
    }
}

/// Waits for the TLS handshake, then installs HTTP/2 with the authentication the handshake
/// decided: a verified client certificate means certificate auth, none means token auth.
final class TLSConnectionStarter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let context: SimulatorContext
    private let logger: Logger

    init(context: SimulatorContext, logger: Logger) {
        self.context = context
        self.logger = logger
    }

    func userInboundEventTriggered(context channelContext: ChannelHandlerContext, event: Any) {
        guard let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tlsEvent else {
            channelContext.fireUserInboundEventTriggered(event)
            return
        }
        let channel = channelContext.channel
        do {
            let tls = try channel.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self)
            let authentication: ConnectionAuthentication
            if let peer = tls.peerCertificate {
                authentication = .certificate(certificateGrant(peer, remoteAddress: channel.remoteAddress))
            } else {
                authentication = APNsSimulator.makeTokenAuthentication(context)
            }
            // Without ALPN the client speaks HTTP/2 with prior knowledge, as some Java clients do.
            let transport = negotiated == "h2" ? "h2" : "h2-prior-knowledge"
            try APNsSimulator.installHTTP2(on: channel, context: context, transport: transport, authentication: authentication)
            channelContext.pipeline.syncOperations.removeHandler(context: channelContext, promise: nil)
        } catch {
            channelContext.close(promise: nil)
        }
    }
}

extension TLSConnectionStarter {
    /// The topics a verified client certificate grants, in order of precedence:
    /// 1. the certificate's topics extension (1.2.840.113635.100.6.3.6), as APNs reads it;
    /// 2. else its subject UID (older certificates: the bundle id is the single topic);
    /// 3. else the configured `certificate_topics` (empty: any topic).
    /// A malformed topics extension fails every request of the connection with 403 BadCertificate.
    func certificateGrant(_ peer: NIOSSLCertificate, remoteAddress: SocketAddress?) -> Result<TopicGrant, APNsRejection> {
        let configured = context.configuration.authentication.certificateTopics
        let fallback = TopicGrant(topics: configured, topicRequired: configured.count != 1)
        let remote = remoteAddress?.description ?? "?"
        let certificate: Certificate
        do {
            certificate = try Certificate(derEncoded: try peer.toDERBytes())
        } catch {
            logger.warning(
                "client certificate not readable for its topics; using the configured certificate_topics",
                metadata: ["simulator.remote": "\(remote)", "error": "\(error)"]
            )
            return .success(fallback)
        }
        do {
            guard let found = try CertificateTopics.read(from: certificate) else {
                logger.debug("client certificate names no topics; using the configured certificate_topics", metadata: ["simulator.remote": "\(remote)"])
                return .success(fallback)
            }
            logger.debug(
                "client certificate topics",
                metadata: ["simulator.remote": "\(remote)", "simulator.topics": "\(found.topics.joined(separator: ","))", "simulator.source": "\(found.source.rawValue)"]
            )
            // Both name whole topics: the extension lists each (`com.example.app.voip`), and a
            // subject UID is the one topic of an older single-topic certificate, which grants
            // its bundle id and not the `.voip` or `.complication` topics beside it.
            return .success(TopicGrant(topics: found.topics, topicRequired: found.topics.count != 1, exact: true))
        } catch {
            logger.warning(
                "client certificate rejected: its requests get 403 BadCertificate",
                metadata: ["simulator.remote": "\(remote)", "simulator.subject": "\(certificate.subject)", "error": "\(error)"]
            )
            return .failure(APNsRejection(.badCertificate))
        }
    }
}

/// `APNsSimulator` as a ServiceLifecycle service: starts on `run()`, stops on graceful shutdown.
public struct APNsSimulatorService: Service {
    public let configuration: APNsSimulatorConfiguration
    private let onStart: @Sendable (APNsSimulator) -> Void
    private let onStop: @Sendable (APNsSimulator) -> Void

    public init(
        configuration: APNsSimulatorConfiguration,
        onStart: @escaping @Sendable (APNsSimulator) -> Void = { _ in },
        onStop: @escaping @Sendable (APNsSimulator) -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.onStart = onStart
        self.onStop = onStop
    }

    public func run() async throws {
        let simulator = try await APNsSimulator.start(configuration)
        onStart(simulator)
        // Returns on graceful shutdown (SIGTERM/SIGINT) or throws on cancellation; both stop.
        try? await gracefulShutdown()
        await simulator.stop()
        onStop(simulator)
    }
}
