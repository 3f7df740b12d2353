import APNsCore

/// A failure of the legacy binary interface clients themselves (not a gateway verdict):
/// configuration, credentials, connecting, a broken stream, a deadline.
///
/// Descriptions name the endpoint and files, never key or certificate material.
public struct LegacyClientError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case configuration, credentials, connect, protocolError, timeout, shutdown
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A setting that cannot work.
        public static let configuration = Code(.configuration)
        /// A certificate, key or CA file that cannot be read or used.
        public static let credentials = Code(.credentials)
        /// TCP or TLS failed.
        public static let connect = Code(.connect)
        /// The server sent something the interface does not allow.
        public static let protocolError = Code(.protocolError)
        /// The deadline passed.
        public static let timeout = Code(.timeout)
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

    /// Whether trying again later may help (connect failures and timeouts do; bad credentials do not).
    public var isRetryable: Bool { code == .connect || code == .timeout || code == .protocolError }

    public var description: String { "legacy binary interface (\(code)): \(message)" }
}

extension LegacyEndpoint {
    /// `host:port (TLS)` for messages and logs.
    var label: String { "\(host):\(port)\(tls ? "" : " (plain TCP)")" }
}
