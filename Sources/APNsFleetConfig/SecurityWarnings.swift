import APNsCore

/// Settings that weaken security without being errors: each gets a warning when a worker starts.
public enum SecurityWarnings {
    /// Every warning for `configuration`: key files others can read, and Kafka TLS checks turned
    /// off through passed-through librdkafka properties.
    public static func all(for configuration: FleetConfiguration) -> [String] {
        SecretFile.permissionWarnings(for: configuration) + kafkaTLSWarnings(configuration.kafka.properties)
    }

    /// librdkafka lets `kafka.properties` switch off what `kafka.ssl.*` sets up; APNs's TLS has no
    /// such switch, but Kafka's is the operator's to use (a test cluster), so it is only warned about.
    static func kafkaTLSWarnings(_ properties: [String: String]) -> [String] {
        var warnings: [String] = []
        if properties["enable.ssl.certificate.verification"]?.lowercased() == "false" {
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
