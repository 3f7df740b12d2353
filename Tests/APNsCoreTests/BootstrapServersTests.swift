import APNsCore
import Testing

/// `kafka.bootstrap-servers` as librdkafka 2.0.2 reads it: what it can use passes, what it
/// would take silently and never connect to is named.
@Suite("Bootstrap servers")
struct BootstrapServersTests {
    @Test(
        "librdkafka's own forms pass",
        arguments: [
            "kafka:9092", "kafka", "a:9092, b:9092", "a:9092,", " a:9092 ", "[::1]:9092", "[::1]", "[fe80::1%eth0]:9092",
            "PLAINTEXT://h:9092/", "plaintext://h:9092", ":9092",
        ]
    )
    func accepted(list: String) {
        #expect(KafkaSettings.bootstrapServersProblem(list, securityProtocol: .plaintext) == nil)
    }

    @Test("a scheme must be the security protocol's, whatever its case")
    func schemeMatchesProtocol() {
        #expect(KafkaSettings.bootstrapServersProblem("SASL_SSL://h:9093,SASL_SSL://i:9093", securityProtocol: .saslSSL) == nil)
        #expect(KafkaSettings.bootstrapServersProblem("ssl://h:9093", securityProtocol: .saslSSL)?.contains("says ssl, but kafka.security-protocol is sasl_ssl") == true)
    }

    @Test(
        "what librdkafka would never connect to is named",
        arguments: [
            ("a:9092,b:99999", "\"b:99999\" has port \"99999\""), ("h:+80", "\"h:+80\" has port \"+80\""), ("[::1:9092", "no ']'"),
            ("[::1]x", "only :port may follow ']'"), ("a b:9092", "has a space"), (" , ", "names no broker"),
            ("::1:9092", "needs brackets"), ("::1", "needs brackets"),
        ]
    )
    func refused(list: String, problem: String) {
        let found = KafkaSettings.bootstrapServersProblem(list)
        #expect(found?.contains(problem) == true, "\(found ?? "nil")")
    }

    @Test("credentials in a broker entry are refused without being shown")
    func credentialsNotEchoed() {
        for list in ["sasl_ssl://alice:s3cret@broker:9093", "alice:s3cret@broker"] {
            let found = KafkaSettings.bootstrapServersProblem(list, securityProtocol: .saslSSL)
            #expect(found?.contains("brokers take no credentials") == true, "\(found ?? "nil")")
            #expect(found?.contains("s3cret") == false)
        }
    }
}
