import APNsCore
import Foundation
import NIOCore
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOSSL

/// A failure of the client itself (not an APNs answer): configuration, credentials, connecting.
///
/// Descriptions name files and settings, never key or certificate material.
public struct APNsClientError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case configuration, credentials, connect, protocolError, providerTokenRejected, credentialsRejected, shutdown
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A setting that cannot work.
        public static let configuration = Code(.configuration)
        /// A key, certificate or CA file that cannot be read or used.
        public static let credentials = Code(.credentials)
        /// TCP, TLS or ALPN failed.
        public static let connect = Code(.connect)
        /// The server broke HTTP/2.
        public static let protocolError = Code(.protocolError)
        /// APNs keeps rejecting freshly made provider tokens: the key id, team id or key is wrong.
        public static let providerTokenRejected = Code(.providerTokenRejected)
        /// APNs keeps answering 403 for the credentials themselves (see `configurationError`).
        public static let credentialsRejected = Code(.credentialsRejected)
        /// The client is shutting down.
        public static let shutdown = Code(.shutdown)

        public var description: String { base.rawValue }
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// Whether trying again later may help (connect failures do; bad credentials do not).
    public var isRetryable: Bool { code == .connect || code == .protocolError }

    public var description: String { "APNs client (\(code)): \(message)" }
}

/// The time sources for provider tokens: `now` (unix seconds) for their `iat`, and `elapsed`
/// (seconds on a clock that is never stepped, and counts a suspend) for their age, so that a
/// wall clock stepped by NTP neither replaces a token early (APNs answers
/// TooManyProviderTokenUpdates) nor keeps one past its hour. Injectable so that tests can age
/// tokens without waiting.
public struct APNsClock: Sendable {
    public let now: @Sendable () -> Int64
    public let elapsed: @Sendable () -> Int64

    /// A clock whose `elapsed` is `now` unless given (a test's clock moves both at once).
    public init(now: @escaping @Sendable () -> Int64, elapsed: (@Sendable () -> Int64)? = nil) {
        self.now = now
        self.elapsed = elapsed ?? now
    }

    public static let system = APNsClock(
        now: { Int64(Date().timeIntervalSince1970) },
        // ContinuousClock keeps counting while the machine is suspended (CLOCK_BOOTTIME on
        // Linux), and is never stepped.
        elapsed: { (ContinuousClock.now - start).components.seconds }
    )
    private static let start = ContinuousClock.now
}

/// How a connection authenticates.
public enum APNsAuthentication: Sendable {
    /// ES256 provider tokens (one per connection, refreshed by age).
    case token(ProviderTokenSigner)
    /// A TLS client certificate (mTLS).
    case certificate(chain: [NIOSSLCertificate], privateKey: NIOSSLPrivateKey)

    public var isToken: Bool {
        if case .token = self { return true }
        return false
    }

    /// Reads the credentials an `AppConfiguration` names (a .p8 key, PEM certificate and key,
    /// or a PKCS#12 bundle).
    public static func load(_ authentication: AppConfiguration.Authentication) throws(APNsClientError) -> APNsAuthentication {
        switch authentication {
        case .token(let keyFile, let keyID, let teamID):
            return try loadToken(keyFile: keyFile, keyID: keyID, teamID: teamID)
        case .certificate(.pem(let certificateFile, let privateKeyFile, let password)):
            return try loadPEM(certificateFile: certificateFile, privateKeyFile: privateKeyFile, password: password?.revealed)
        case .certificate(.pkcs12(let file, let password)):
            return try loadPKCS12(file: file, password: password?.revealed)
        }
    }

    /// The most a key, certificate or bundle file may hold: real ones are a few kilobytes, and a
    /// path mistyped to a large file (or `/dev/zero`) must not be read whole.
    static let largestCredentialFile = 1 << 20

    /// Refuses what cannot be a credential file before anything reads it: a device, a FIFO or a
    /// directory, or a file above `largestCredentialFile`. A missing file passes, for the
    /// reader's own "cannot read".
    static func checkCredentialFile(_ path: String, _ what: String) throws(APNsClientError) {
        // stat(2), which follows symbolic links: a Kubernetes secret volume mounts each key as a
        // link to the real file.
        var info = stat()
        guard stat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw APNsClientError(.credentials, "the \(what) \(path) is not a regular file")
        }
        let size = Int(info.st_size)
        guard size <= largestCredentialFile else {
            throw APNsClientError(.credentials, "the \(what) \(path) is \(size) bytes; such files hold a few kilobytes (at most \(largestCredentialFile / 1024) KiB)")
        }
    }

    public static func loadToken(keyFile: String, keyID: String, teamID: String) throws(APNsClientError) -> APNsAuthentication {
        try checkCredentialFile(keyFile, "provider token key file")
        guard let data = FileManager.default.contents(atPath: keyFile) else {
            throw APNsClientError(.credentials, "cannot read the provider token key file \(keyFile)")
        }
        do {
            return .token(try ProviderTokenSigner(privateKeyPEM: String(decoding: data, as: UTF8.self), keyID: keyID, teamID: teamID))
        } catch {
            throw APNsClientError(.credentials, "\(keyFile): \(error.message)")
        }
    }

    public static func loadPEM(certificateFile: String, privateKeyFile: String, password: String?) throws(APNsClientError) -> APNsAuthentication {
        try checkCredentialFile(certificateFile, "certificate file")
        try checkCredentialFile(privateKeyFile, "private key file")
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(certificateFile)
        } catch {
            throw APNsClientError(.credentials, "cannot read a PEM certificate from \(certificateFile)")
        }
        guard !chain.isEmpty else { throw APNsClientError(.credentials, "\(certificateFile) holds no certificate") }
        let key: NIOSSLPrivateKey
        do {
            if let password {
                let bytes = Array(password.utf8)
                key = try NIOSSLPrivateKey(file: privateKeyFile, format: .pem) { (setter: ([UInt8]) -> Void) in setter(bytes) }
            } else {
                key = try NIOSSLPrivateKey(file: privateKeyFile, format: .pem)
            }
        } catch {
            throw APNsClientError(.credentials, "cannot read a PEM private key from \(privateKeyFile) (wrong password?)")
        }
        return .certificate(chain: chain, privateKey: key)
    }

    public static func loadPKCS12(file: String, password: String?) throws(APNsClientError) -> APNsAuthentication {
        try checkCredentialFile(file, "PKCS#12 bundle")
        do {
            let bundle = try NIOSSLPKCS12Bundle(file: file, passphrase: Array((password ?? "").utf8))
            return .certificate(chain: bundle.certificateChain, privateKey: bundle.privateKey)
        } catch {
            throw APNsClientError(.credentials, "cannot read the PKCS#12 bundle \(file) (wrong password?)")
        }
    }
}

/// Everything one pool (one app and environment) needs. Start with
/// `APNsClientConfiguration(endpoint:authentication:)` and adjust.
public struct APNsClientConfiguration: Sendable {
    /// Exponential backoff with jitter between reconnects.
    public struct Backoff: Sendable, Hashable {
        /// Default: 100 ms.
        public var base: Duration = .milliseconds(100)
        /// Default: 30 s.
        public var maximum: Duration = .seconds(30)

        public init(base: Duration = .milliseconds(100), maximum: Duration = .seconds(30)) {
            self.base = base
            self.maximum = maximum
        }
    }

    /// A name for logs and metrics (the app). Default: "default".
    public var name: String = "default"
    /// Where APNs is. Production and sandbox verify against the system roots; a custom endpoint
    /// against its CA file (or the system roots without one). There is no way to turn
    /// verification off.
    public var endpoint: AppConfiguration.Endpoint
    public var authentication: APNsAuthentication
    /// Long-lived connections in the pool. Default: 2.
    public var connections: Int = 2
    /// Streams the client opens on one connection at most, whatever the server allows. Default: 1000.
    public var maximumStreamsPerConnection: Int = 1000
    /// TCP connect plus TLS handshake plus the server's first SETTINGS. Default: 10 s.
    public var connectTimeout: Duration = .seconds(10)
    /// A connection that read nothing for this long is sent a PING. Default: 30 s.
    public var pingInterval: Duration = .seconds(30)
    /// A PING unanswered for this long marks the connection dead. Default: 10 s.
    public var pingTimeout: Duration = .seconds(10)
    /// How often deadlines of in-flight requests are checked. Default: 20 ms.
    public var deadlineCheckInterval: Duration = .milliseconds(20)
    /// Age (seconds) at which a provider token is replaced, clamped to 21…55 minutes. Default: 50 minutes.
    public var tokenRefreshAge: Int64 = 50 * 60
    /// Fresh tokens in a row that APNs may reject (Expired/InvalidProviderToken) before the pool
    /// reports a configuration error. Default: 2.
    public var tokenRejectionsBeforeError = 2
    /// Times a request that APNs certainly did not process (refused stream, GOAWAY) is sent
    /// again on another connection within one `send`. Default: 3.
    public var unprocessedRetries = 3
    /// Default: 100 ms up to 30 s.
    public var reconnectBackoff = Backoff()
    /// On shutdown, how long in-flight requests may take to finish. Default: 5 s.
    public var drainTimeout: Duration = .seconds(5)
    /// The clock for provider tokens. Default: the system clock.
    public var clock: APNsClock = .system

    public init(endpoint: AppConfiguration.Endpoint, authentication: APNsAuthentication) {
        self.endpoint = endpoint
        self.authentication = authentication
    }

    /// The configuration of `app` for `environment` (a custom endpoint serves both). A credential
    /// that cannot be used names the configuration keys that point at it.
    public static func load(app: AppConfiguration, environment: APNsEnvironment? = nil) throws(APNsClientError) -> APNsClientConfiguration {
        var endpoint = app.endpoint
        switch (endpoint, environment) {
        case (.production, .sandbox?): endpoint = .sandbox
        case (.sandbox, .production?): endpoint = .production
        default: break
        }
        let authentication: APNsAuthentication
        do {
            authentication = try APNsAuthentication.load(app.authentication)
        } catch {
            let keys = switch app.authentication {
            case .token: "app.\(app.name).key-file, key-id, team-id"
            case .certificate(.pem): "app.\(app.name).certificate-file, private-key-file"
            case .certificate(.pkcs12): "app.\(app.name).pkcs12-file"
            }
            throw APNsClientError(error.code, "\(error.message) (configured by \(keys))")
        }
        var configuration = APNsClientConfiguration(endpoint: endpoint, authentication: authentication)
        configuration.name = app.name
        configuration.connections = app.connections
        return configuration
    }

    /// Checks values that cannot work.
    public func validate() throws(APNsClientError) {
        guard connections >= 1 else { throw APNsClientError(.configuration, "connections must be at least 1, got \(connections)") }
        guard maximumStreamsPerConnection >= 1 else { throw APNsClientError(.configuration, "maximum streams per connection must be at least 1") }
        guard endpoint.port > 0, endpoint.port < 65536 else { throw APNsClientError(.configuration, "port \(endpoint.port) is out of range") }
        guard !endpoint.host.isEmpty else { throw APNsClientError(.configuration, "the APNs host is empty") }
    }

    /// The TLS context: TLS 1.2+, ALPN h2, full verification.
    func makeTLSContext() throws(APNsClientError) -> NIOSSLContext {
        var caFile: String?
        if case .custom(_, _, let file?) = endpoint { caFile = file }
        return try Self.makeClientTLSContext(caFile: caFile, authentication: authentication, applicationProtocols: ["h2"])
    }

    /// A client TLS context with full verification against `caFile` (or the system roots without
    /// one), TLS 1.2+, and the client certificate when `authentication` is one. Shared with the
    /// legacy binary interface client (no ALPN there).
    public static func makeClientTLSContext(caFile: String?, authentication: APNsAuthentication?, applicationProtocols: [String]) throws(APNsClientError) -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = applicationProtocols
        tls.certificateVerification = .fullVerification
        // Closing waits at most this long for the server's close_notify.
        tls.shutdownTimeout = .seconds(1)
        if let caFile {
            do {
                tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(caFile))
            } catch {
                throw APNsClientError(.credentials, "cannot read the CA certificates in \(caFile)")
            }
        } else {
            tls.trustRoots = .default
        }
        if case .certificate(let chain, let key)? = authentication {
            tls.certificateChain = chain.map { .certificate($0) }
            tls.privateKey = .privateKey(key)
        }
        do {
            return try NIOSSLContext(configuration: tls)
        } catch {
            throw APNsClientError(.credentials, "TLS setup failed (the client certificate and key may not match): \(type(of: error))")
        }
    }
}
