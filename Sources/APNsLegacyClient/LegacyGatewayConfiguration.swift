import APNsClient
import APNsCore
import NIOCore
import NIOSSL

/// Everything one legacy gateway client (one app) needs. Start with
/// `LegacyGatewayConfiguration(endpoint:certificate:)` or `load(app:)` and adjust.
public struct LegacyGatewayConfiguration: Sendable {
    /// A name for logs and metrics (the app). Default: "default".
    public var name = "default"
    /// The gateway (Apple's is port 2195). With `tls` the server certificate is verified against
    /// the endpoint's CA file, or the system roots without one; plain TCP only for local tests.
    public var endpoint: LegacyEndpoint
    /// The client certificate the gateway authenticates the provider by. Nil only for plain TCP.
    public var certificate: AppConfiguration.CertificateSource?
    /// Long-lived connections. Default: 1.
    public var connections = 1
    /// `.enhanced` (command 1, identifiers and expiry) by default; `.simple` (command 0) carries no
    /// identifier, so an error-response cannot be tied to its notification (see `maximumResends`);
    /// `.frame` (command 2) also carries the priority. Default: `.enhanced`.
    public var format: LegacyNotification.Format = .enhanced
    /// Payloads above this are refused before sending. Default: nil, the format's own limit:
    /// 256 bytes for `.simple` and `.enhanced`, 2048 for `.frame`.
    public var maximumPayloadBytes: Int?

    /// The payload limit in force: `maximumPayloadBytes`, or the format's.
    var payloadLimit: Int {
        maximumPayloadBytes ?? (format == .frame ? LegacyNotification.maximumFramePayloadBytes : LegacyNotification.maximumPayloadBytes)
    }
    /// The token size the interface takes; other sizes are refused before sending. Default: 32.
    public var tokenBytes = LegacyNotification.tokenBytes
    /// A written notification with no error-response for this long counts as accepted. Also the
    /// least latency of an `accepted` verdict. Default: 1 s.
    public var quietPeriod: Duration = .seconds(1)
    /// Written, unconfirmed notifications per connection at most; further callers wait
    /// (back-pressure). One connection carries at most `windowSize / quietPeriod` per second.
    /// Default: 5000.
    public var windowSize = 5000
    /// A write pass writes (and flushes) at most this many bytes at once. Default: 64 KiB.
    public var batchBytes = 64 * 1024
    /// Times one notification is written again after connections closed before its quiet
    /// period ended (or after error-responses that could not be tied to it). Default: 3.
    public var maximumResends = 3
    /// Deadline of one `send` when the caller gives none. Default: 10 s.
    public var sendTimeout: Duration = .seconds(10)
    /// TCP connect plus TLS handshake. Default: 10 s.
    public var connectTimeout: Duration = .seconds(10)
    /// Default: 100 ms up to 30 s, with jitter.
    public var reconnectBackoff = APNsClientConfiguration.Backoff()
    /// The pace of reconnects after error-responses that blame a notification (an invalid token,
    /// say), per connection slot: the protocol closes the connection after each, and a stale
    /// token list, or a certificate for the other environment that makes every token invalid,
    /// would otherwise reconnect once per notification, which Apple treats as an attack.
    /// Default: 10 at once, then one per 200 ms (5 a second; `app.<name>.legacy-error-reconnects-per-second`).
    public var errorReconnects = ReconnectPacer.Rate(burst: 10, interval: .milliseconds(200))
    /// On shutdown, how long written notifications may wait for their quiet period. Default: 5 s.
    public var drainTimeout: Duration = .seconds(5)

    public init(endpoint: LegacyEndpoint, certificate: AppConfiguration.CertificateSource?) {
        self.endpoint = endpoint
        self.certificate = certificate
    }

    /// The configuration of `app`'s legacy gateway (its `legacyGateway`, certificate and connections).
    public static func load(app: AppConfiguration) throws(LegacyClientError) -> LegacyGatewayConfiguration {
        guard let endpoint = app.legacyGateway else {
            throw LegacyClientError(.configuration, "app '\(app.name)' uses the binary interface but configures no legacy gateway")
        }
        var certificate: AppConfiguration.CertificateSource?
        switch app.authentication {
        case .certificate(let source):
            certificate = source
        case .token:
            // Plain TCP (a local simulator) needs no identity; the real gateway takes only certificates.
            guard !endpoint.tls else {
                throw LegacyClientError(.configuration, "app '\(app.name)': the binary interface authenticates with a client certificate, not a provider token")
            }
        }
        var configuration = LegacyGatewayConfiguration(endpoint: endpoint, certificate: certificate)
        configuration.name = app.name
        configuration.connections = app.connections
        configuration.format = app.legacyFormat
        configuration.quietPeriod = .milliseconds(app.legacyQuietPeriodMilliseconds)
        configuration.errorReconnects.interval = .seconds(1) / max(1, app.legacyErrorReconnectsPerSecond)
        // A drain shorter than the quiet period would re-send every written notification.
        configuration.drainTimeout = max(configuration.drainTimeout, configuration.quietPeriod + .seconds(1))
        return configuration
    }

    /// Checks values that cannot work.
    public func validate() throws(LegacyClientError) {
        guard connections >= 1 else { throw LegacyClientError(.configuration, "connections must be at least 1, got \(connections)") }
        guard windowSize >= 1 else { throw LegacyClientError(.configuration, "the window must hold at least 1 notification, got \(windowSize)") }
        if let maximumPayloadBytes, !(1...Int(UInt16.max)).contains(maximumPayloadBytes) {
            throw LegacyClientError(.configuration, "maximum payload bytes must be 1…65535, got \(maximumPayloadBytes)")
        }
        guard tokenBytes >= 1, tokenBytes <= Int(UInt16.max) else { throw LegacyClientError(.configuration, "token bytes must be 1…65535, got \(tokenBytes)") }
        guard quietPeriod > .zero else { throw LegacyClientError(.configuration, "the quiet period must be positive") }
        guard maximumResends >= 0 else { throw LegacyClientError(.configuration, "maximum resends cannot be negative") }
        guard endpoint.port > 0, endpoint.port < 65536 else { throw LegacyClientError(.configuration, "port \(endpoint.port) of \(endpoint.host) is out of range") }
        guard !endpoint.host.isEmpty else { throw LegacyClientError(.configuration, "the legacy gateway host is empty") }
    }
}

/// TLS for both legacy clients: full verification (the endpoint's CA file or the system roots),
/// the client certificate, no ALPN. Built by the HTTP/2 client's code so both verify alike.
enum LegacyTLS {
    static func context(endpoint: LegacyEndpoint, certificate: AppConfiguration.CertificateSource?) throws(LegacyClientError) -> NIOSSLContext? {
        guard endpoint.tls else { return nil }
        do {
            let authentication = try certificate.map { source throws(APNsClientError) in try APNsAuthentication.load(.certificate(source)) }
            return try APNsClientConfiguration.makeClientTLSContext(caFile: endpoint.caFile, authentication: authentication, applicationProtocols: [])
        } catch {
            throw LegacyClientError(.credentials, "\(endpoint.label): \(error.message)")
        }
    }

    /// SNI and name verification use the host name; for an IP address NIOSSL checks the
    /// certificate's IP SAN against the peer address instead.
    static func serverHostname(_ host: String) -> String? {
        (try? SocketAddress(ipAddress: host, port: 0)) == nil ? host : nil
    }
}
