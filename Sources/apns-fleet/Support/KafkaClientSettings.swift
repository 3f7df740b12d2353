import APNsCore
import APNsFleetConfig
import FleetWorker
import KafkaTransport

extension KafkaClientConfiguration {
    /// The client settings of the fleet's Kafka configuration, its TLS files checked first: a
    /// file that cannot be read is a configuration error naming its key, not librdkafka's
    /// "ssl.ca.location failed".
    static func checked(_ settings: KafkaSettings, clientID: String) throws(ConfigurationError) -> KafkaClientConfiguration {
        try settings.checkReadableFiles()
        return KafkaClientConfiguration(settings: settings, clientID: clientID)
    }
}
