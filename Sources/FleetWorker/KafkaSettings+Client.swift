import APNsCore
import KafkaTransport

extension KafkaClientConfiguration {
    /// The librdkafka client settings for the fleet's Kafka configuration.
    public init(settings: KafkaSettings, clientID: String) {
        self.init(bootstrapServers: KafkaSettings.bootstrapEntries(settings.bootstrapServers).map(String.init))
        self.clientID = clientID
        var security = Security.plaintext
        if settings.securityProtocol.usesTLS {
            security.tls = KafkaClientConfiguration.TLS(
                caLocation: settings.sslCAFile, certificateLocation: settings.sslCertificateFile,
                keyLocation: settings.sslKeyFile, keyPassword: settings.sslKeyPassword
            )
        }
        if settings.securityProtocol.usesSASL, let mechanism = settings.saslMechanism,
            let username = settings.saslUsername, let password = settings.saslPassword,
            let saslMechanism = KafkaClientConfiguration.SASL.Mechanism(rawValue: mechanism.rawValue)
        {
            security.sasl = KafkaClientConfiguration.SASL(mechanism: saslMechanism, username: username, password: password)
        }
        self.security = security
        self.properties = settings.properties
    }
}
