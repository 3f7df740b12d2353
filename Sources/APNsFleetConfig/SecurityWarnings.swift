import APNsCore

/// Settings that weaken security (or, for one, what results can be trusted to say) without
/// being errors: each gets a warning when a worker starts.
public enum SecurityWarnings {
    /// Every warning for `configuration`: key files others can read, Kafka TLS checks turned
    /// off through passed-through librdkafka properties, and the legacy settings below.
    public static func all(for configuration: FleetConfiguration) -> [String] {
        SecretFile.permissionWarnings(for: configuration) + kafkaTLSWarnings(configuration.kafka.properties)
            + unusedKafkaSecurityWarnings(configuration.kafka) + plainLegacyWarnings(configuration.apps)
            + shortQuietPeriodWarnings(configuration.apps)
    }

    /// Below this, a quiet period is shorter than a round trip to a distant gateway.
    static let shortestRemoteQuietPeriodMilliseconds = 500

    /// A binary notification counts as delivered once its quiet period passes without an
    /// error-response. Shorter than the round trip to a remote gateway, its error-responses
    /// (an invalid token, say) arrive too late to be attributed: such notifications are
    /// reported delivered, and their dead tokens never become token events. Short periods suit
    /// a simulator on this host, as the tests use.
    static func shortQuietPeriodWarnings(_ apps: [AppConfiguration]) -> [String] {
        apps.compactMap { app in
            guard app.transport == .binary, app.legacyQuietPeriodMilliseconds < shortestRemoteQuietPeriodMilliseconds,
                let gateway = app.legacyGateway, !isLoopback(gateway.host)
            else { return nil }
            return "app.\(app.name).legacy-quiet-period-ms is \(app.legacyQuietPeriodMilliseconds) ms: an error-response from \(gateway.host) that takes longer to arrive "
                + "comes after the notification was counted delivered, and cannot be attributed (its token is never invalidated); keep it above the round trip (default 1000)"
        }
    }

    /// TLS or SASL settings under a protocol that uses neither are ignored: most likely the
    /// protocol was meant to be ssl or sasl_ssl, and the connection is not what the file says.
    static func unusedKafkaSecurityWarnings(_ kafka: KafkaSettings) -> [String] {
        var warnings: [String] = []
        let protocolName = kafka.securityProtocol.rawValue
        if !kafka.securityProtocol.usesTLS, kafka.sslCAFile != nil || kafka.sslCertificateFile != nil || kafka.sslKeyFile != nil || kafka.sslKeyPassword != nil {
            warnings.append("kafka.ssl.* is set but kafka.security-protocol is \(protocolName), which does not use TLS: those settings are ignored (did you mean ssl or sasl_ssl?)")
        }
        if !kafka.securityProtocol.usesSASL, kafka.saslMechanism != nil || kafka.saslUsername != nil || kafka.saslPassword != nil {
            warnings.append("kafka.sasl.* is set but kafka.security-protocol is \(protocolName), which does not use SASL: those settings are ignored (did you mean sasl_plaintext or sasl_ssl?)")
        }
        // PLAIN sends the password itself; without TLS, anyone on the path to a broker reads it.
        let brokerHosts = (try? KafkaSettings.brokers(kafka.bootstrapServers).get())?.map(\.host) ?? []
        if kafka.securityProtocol == .saslPlaintext, kafka.saslMechanism == .plain, !brokerHosts.allSatisfy(isLoopback) {
            warnings.append("kafka.security-protocol is sasl_plaintext with kafka.sasl.mechanism PLAIN: the SASL password crosses the network in clear; use sasl_ssl, or a SCRAM mechanism")
        }
        return warnings
    }

    /// `legacy-tls: false` is meant for a simulator on this host. Towards any other host,
    /// whoever sits on the path can read notifications and, on the feedback service, inject
    /// tuples that invalidate live tokens.
    static func plainLegacyWarnings(_ apps: [AppConfiguration]) -> [String] {
        var warnings: [String] = []
        for app in apps {
            for (name, endpoint) in [("legacy-gateway", app.legacyGateway), ("legacy-feedback", app.legacyFeedback)] {
                guard let endpoint, !endpoint.tls, !isLoopback(endpoint.host) else { continue }
                warnings.append(
                    "app.\(app.name).\(name): \(endpoint.host):\(endpoint.port) is reached without TLS (legacy-tls is false); "
                        + "whoever sits on the path can read notifications and forge feedback that invalidates tokens"
                )
            }
        }
        return warnings
    }

    static func isLoopback(_ host: String) -> Bool {
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        // 127.0.0.0/8 written as an address (a name such as 127.example.com is not loopback).
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }

    /// librdkafka lets `kafka.properties` switch off what `kafka.ssl.*` sets up; APNs's TLS has no
    /// such switch, but Kafka's is the operator's to use (a test cluster), so it is only warned about.
    static func kafkaTLSWarnings(_ properties: [String: String]) -> [String] {
        var warnings: [String] = []
        // Every spelling librdkafka reads as false.
        if let value = properties["enable.ssl.certificate.verification"]?.lowercased(), ["false", "f", "0", "no", "off"].contains(value) {
            warnings.append(
                "kafka.properties: enable.ssl.certificate.verification=false turns off verification of the brokers' TLS certificates; "
                    + "whoever sits between the workers and Kafka can read and forge jobs and results"
            )
        }
        if let algorithm = properties["ssl.endpoint.identification.algorithm"], algorithm.lowercased() == "none" {
            warnings.append("kafka.properties: ssl.endpoint.identification.algorithm=none accepts a broker certificate issued for any host")
        }
        return warnings
    }
}
