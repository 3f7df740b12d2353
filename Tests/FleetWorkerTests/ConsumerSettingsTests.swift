import APNsCore
import FleetWorker
import KafkaTransport
import Testing

@Suite("Push worker consumer settings")
struct ConsumerSettingsTests {
    @Test("a retry record waiting out its not-before is not reported as a stalled pipeline")
    func stallWarningOutlastsARetryWait() {
        var fleet = FleetConfiguration(apps: [])
        fleet.worker.drainTimeoutSeconds = 12
        let client = KafkaClientConfiguration(bootstrapServers: ["127.0.0.1:9092"])
        let defaults = KafkaConsumerConfiguration(pushWorker: fleet, client: client)
        #expect(defaults.topics == [fleet.topics.jobs, fleet.topics.retry])
        #expect(defaults.groupID == fleet.kafka.groupID)
        #expect(defaults.drainTimeout == .seconds(12))
        // A wait lasts up to retry.max-delay-ms (60 s by default) plus a minute.
        #expect(defaults.stallWarning == .seconds(150))

        fleet.retry.maxDelayMilliseconds = 3_600_000
        #expect(KafkaConsumerConfiguration(pushWorker: fleet, client: client).stallWarning == .seconds(3690))
        fleet.retry.maxDelayMilliseconds = 1000
        #expect(KafkaConsumerConfiguration(pushWorker: fleet, client: client).stallWarning == .seconds(91))
    }
}
