import APNsCore
import KafkaTransport

/// The two job encodings of docs/design.md, as a producer writes them.
public enum JobEncodingChoice: String, Sendable, CaseIterable {
    /// The JSON envelope, sent exactly as written.
    case json
    /// The payload as the record value, everything else in headers (one token per record).
    case headers
}

/// Turns JSON envelopes (a line of a file, or one built from flags) into Kafka records.
public enum JobRecords {
    /// The record for one envelope. With `validate`, the job is decoded first and a problem is
    /// thrown naming its field; without, the bytes go out as they are (to test the DLQ, say).
    public static func record(
        envelope: [UInt8], topic: String, encoding: JobEncodingChoice, validate: Bool = true
    ) throws(JobRejection) -> KafkaOutgoingMessage {
        guard validate || encoding == .headers else {
            return KafkaOutgoingMessage(topic: topic, key: nil, value: envelope)
        }
        let job = try JobDecoder().decode(value: envelope)
        // Kafka key: the device token, so one device's jobs stay in order on one partition.
        let key = job.tokens.count == 1 ? job.tokens.first.map { Array($0.hex.utf8) } : job.id.map { Array($0.utf8) }
        switch encoding {
        case .json:
            return KafkaOutgoingMessage(topic: topic, key: key, value: envelope)
        case .headers:
            return KafkaOutgoingMessage(topic: topic, key: key, value: Array(job.payload.bytes), headers: try headers(for: job))
        }
    }

    /// The header form of a job; the fields it cannot carry are refused by name.
    public static func headers(for job: NotificationJob) throws(JobRejection) -> [RecordHeader] {
        guard job.tokens.count == 1, let token = job.tokens.first else {
            throw JobRejection(field: "tokens", "the header encoding carries one token per record; publish a fan-out job as json")
        }
        if job.deadline != nil { throw JobRejection(field: "deadline", "the header encoding has no deadline; publish this job as json") }
        if job.environment != nil { throw JobRejection(field: "environment", "the header encoding has no environment; publish this job as json") }
        var headers = [RecordHeader(JobDecoder.tokenHeader, token.hex)]
        func add(_ name: String, _ value: String?) {
            if let value { headers.append(RecordHeader(name, value)) }
        }
        add("apns-topic", job.topic)
        add("apns-push-type", job.pushType?.rawValue)
        add("apns-priority", job.priority.map { String($0.rawValue) })
        add("apns-expiration", job.expiration.map(String.init))
        add("apns-collapse-id", job.collapseID)
        add("apns-id", job.apnsID)
        add("job-id", job.id)
        add("app", job.app)
        add("meta", job.meta?.description)
        return headers
    }

    /// An envelope from flags.
    public static func envelope(
        id: String?, tokens: [String], topic: String?, pushType: String?, priority: Int?,
        app: String?, collapseID: String?, expiration: Int64?, payload: String
    ) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("id", id)
        if tokens.count == 1 {
            writer.field("token", tokens[0])
        } else {
            writer.beginArray("tokens")
            for token in tokens { writer.element(token) }
            writer.endArray()
        }
        writer.field("topic", topic)
        writer.field("push_type", pushType)
        writer.field("priority", priority)
        writer.field("app", app)
        writer.field("collapse_id", collapseID)
        writer.field("expiration", expiration)
        writer.field("payload", raw: RawJSON(payload))
        writer.endObject()
        return writer.bytes
    }
}
