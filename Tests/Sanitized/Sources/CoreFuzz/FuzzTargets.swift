import APNsCore

/// What one fuzz input is run through. Each target takes arbitrary bytes, must never trap or hang,
/// and checks properties a user relies on; a broken property is reported as a crash
/// (`preconditionFailure`), which libFuzzer records with the input that caused it.
enum FuzzTarget: String, CaseIterable, Sendable {
    /// The bytes are a record value in the JSON envelope encoding, through `JobIntake.accept`.
    case envelope
    /// The bytes are `key: value` header lines, an empty line, then the record value: the header
    /// encoding (and retry headers), through `JobIntake.accept`.
    case headers
    /// The first byte seeds a chunking; the rest is a gateway byte stream for `LegacyGatewayDecoder`.
    case gateway
    /// The first byte seeds a chunking; the rest is a feedback stream for `FeedbackTupleDecoder`.
    case feedback

    func run(_ data: [UInt8]) {
        switch self {
        case .envelope: Self.intake(value: data, headers: [])
        case .headers:
            let (headers, value) = Self.splitHeaders(data)
            Self.intake(value: value, headers: headers)
        case .gateway: Self.gateway(data)
        case .feedback: Self.feedback(data)
        }
    }

    // MARK: - Job intake

    /// Two apps, so that app selection, defaults and the binary interface's limits are reached.
    static let intake: JobIntake = {
        let key = AppConfiguration.Authentication.token(keyFile: "/nonexistent.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        let fleet = FleetConfiguration(apps: [
            AppConfiguration(name: "example", authentication: key, defaults: JobDefaults(topic: "com.example.app")),
            AppConfiguration(
                name: "legacy", authentication: .certificate(.pkcs12(file: "/nonexistent.p12", password: nil)),
                topics: ["com.example.legacy"], transport: .binary
            ),
        ], defaultApp: "example")
        return JobIntake(configuration: fleet, workerID: "fuzz")
    }()

    static func intake(value: [UInt8], headers: [RecordHeader]) {
        let source = SourcePosition(topic: "apns.jobs", partition: 3, offset: 42)
        switch intake.accept(value: value, headers: headers, source: source, now: UnixMillis(1_795_341_600_000)) {
        case .accepted(let job):
            check(!job.tokens.isEmpty, "an accepted job has tokens")
            check(job.tokens.allSatisfy { job.job.job.tokens.contains($0) }, "the tokens to send are the job's own")
            check(!job.jobID.isEmpty, "an accepted job has an id")
            let payload = job.job.job.payload.bytes
            // The payload is sent as the producer's bytes: a slice of the record, and an object.
            check(payload.startIndex >= 0 && payload.endIndex <= value.count && Array(payload) == Array(value[payload.startIndex..<payload.endIndex]), "the payload is the record's own bytes")
            do {
                let bytes = Array(payload)
                try JSONParser.validateObject(bytes, range: 0..<bytes.count)
            } catch {
                preconditionFailure("an accepted payload is not a JSON object: \(error)")
            }
        case .rejected(let rejected):
            let reason = rejected.rejection.reason
            check(!reason.isEmpty, "a rejection has a reason")
            check(!rejected.results.isEmpty, "a rejected record still gets a result")
            check(rejected.results.allSatisfy { $0.outcome == .invalid && $0.reason == reason }, "every result of a rejected record is invalid, with its reason")
            check(rejected.results.allSatisfy { $0.token.isEmpty || (try? DeviceToken(hex: $0.token))?.hex == $0.token }, "result tokens are well-formed or empty")
            check(Set(rejected.results.map(\.token)).count == rejected.results.count, "no token gets two results")
            check(rejected.deadLetterValue == value, "the DLQ copy is the original bytes")
            check(rejected.deadLetterHeaders.text(DeadLetterHeaders.reasonKey) == reason, "the DLQ copy names the reason")
            // The reason travels in a Kafka header and a JSON result: it must be printable text.
            check(!reason.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "the reason has no control characters")
            _ = rejected.results.map { $0.encoded() }
        }
    }

    /// `key: value` lines up to the first empty line; a line without `": "` is a header without a
    /// value. What follows the empty line is the record value.
    static func splitHeaders(_ data: [UInt8]) -> ([RecordHeader], [UInt8]) {
        let newline = UInt8(ascii: "\n")
        var headers: [RecordHeader] = []
        var lineStart = 0
        var index = 0
        while index < data.count {
            guard data[index] == newline else { index += 1; continue }
            if index == lineStart { return (headers, Array(data[(index + 1)...])) }
            headers.append(header(data[lineStart..<index]))
            index += 1
            lineStart = index
        }
        if lineStart < data.count { headers.append(header(data[lineStart...])) }
        return (headers, [])
    }

    private static func header(_ line: ArraySlice<UInt8>) -> RecordHeader {
        let separator: [UInt8] = [UInt8(ascii: ":"), UInt8(ascii: " ")]
        var at = line.startIndex
        while at + 1 < line.endIndex {
            if line[at] == separator[0] && line[at + 1] == separator[1] {
                return RecordHeader(key: String(decoding: line[line.startIndex..<at], as: UTF8.self), value: Array(line[(at + 2)...]))
            }
            at += 1
        }
        return RecordHeader(key: String(decoding: line, as: UTF8.self), value: nil)
    }

    // MARK: - Legacy binary interface

    /// Chunk sizes from a small PRNG seeded by the input's first byte: 1 to 16 bytes, with an
    /// occasional large chunk, so PDUs are cut at arbitrary places.
    static func chunks(seed: UInt8, count: Int) -> [Range<Int>] {
        var state = UInt32(seed) &* 2_654_435_761 | 1
        var ranges: [Range<Int>] = []
        var at = 0
        while at < count {
            state ^= state << 13
            state ^= state >> 17
            state ^= state << 5
            let size = state % 8 == 0 ? Int(state % 512) + 1 : Int(state % 16) + 1
            ranges.append(at..<min(count, at + size))
            at += size
        }
        return ranges
    }

    enum GatewayEnd: Equatable {
        case needMoreBytes
        case malformed(LegacyErrorStatus, identifier: UInt32?)
    }

    /// Feeds the stream in the given chunks; returns what the decoder yielded and how it ended.
    static func decodeGateway(_ stream: ArraySlice<UInt8>, chunks: [Range<Int>]) -> ([LegacyNotification], GatewayEnd) {
        var decoder = LegacyGatewayDecoder()
        var out: [LegacyNotification] = []
        var consumed = 0
        for chunk in chunks {
            decoder.append(stream[(stream.startIndex + chunk.lowerBound)..<(stream.startIndex + chunk.upperBound)])
            while true {
                switch decoder.next() {
                case .notification(let notification, let count):
                    check(count > 0, "a notification consumes bytes")
                    let original = Array(stream[(stream.startIndex + consumed)..<(stream.startIndex + consumed + count)])
                    if notification.format != .frame {
                        check(notification.encoded() == original, "a simple or enhanced PDU re-encodes to its own bytes")
                    }
                    check(notification.token.count == LegacyNotification.tokenBytes, "a decoded token has the interface's length")
                    check(!notification.payload.isEmpty, "a decoded notification has a payload")
                    consumed += count
                    out.append(notification)
                    continue
                case .needMoreBytes:
                    break
                case .malformed(let response, let detail):
                    check(!detail.isEmpty, "a malformed PDU is explained")
                    // The identifier echoed for an unknown command is whatever sits where an
                    // enhanced identifier would; how much of it has arrived depends on the chunking.
                    let identifier: UInt32? = detail.hasPrefix("unknown command") ? nil : response.identifier
                    return (out, .malformed(response.status, identifier: identifier))
                }
                break
            }
        }
        check(decoder.pendingByteCount == stream.count - consumed, "unconsumed bytes are kept")
        return (out, .needMoreBytes)
    }

    static func gateway(_ data: [UInt8]) {
        guard let seed = data.first else { return }
        let stream = data[1...]
        let whole = decodeGateway(stream, chunks: [0..<stream.count])
        let split = decodeGateway(stream, chunks: chunks(seed: seed, count: stream.count))
        check(whole.0 == split.0 && whole.1 == split.1, "the gateway decoder does not depend on how the stream is cut: whole \(whole), split \(split)")
    }

    static func decodeFeedback(_ stream: ArraySlice<UInt8>, chunks: [Range<Int>]) -> ([FeedbackTuple], Int, String?) {
        var decoder = FeedbackTupleDecoder()
        var tuples: [FeedbackTuple] = []
        for chunk in chunks {
            decoder.append(stream[(stream.startIndex + chunk.lowerBound)..<(stream.startIndex + chunk.upperBound)])
            while let tuple = decoder.next() { tuples.append(tuple) }
        }
        return (tuples, decoder.leftoverByteCount, decoder.malformation)
    }

    static func feedback(_ data: [UInt8]) {
        guard let seed = data.first else { return }
        let stream = data[1...]
        let whole = decodeFeedback(stream, chunks: [0..<stream.count])
        let split = decodeFeedback(stream, chunks: chunks(seed: seed, count: stream.count))
        check(whole.0 == split.0 && whole.1 == split.1 && whole.2 == split.2, "the feedback decoder does not depend on how the stream is cut")
        check(whole.0.allSatisfy { FeedbackTupleDecoder.tokenLengths.contains($0.token.count) }, "every tuple has a device token's length")
        let reencoded = whole.0.flatMap { $0.encoded() }
        check(reencoded == Array(stream.prefix(reencoded.count)), "feedback tuples re-encode to the stream's bytes")
        check(reencoded.count + whole.1 == stream.count, "every byte is a tuple or leftover")
    }
}

/// A broken property: a crash that libFuzzer (or the replayer) reports with the input.
func check(_ condition: @autoclosure () -> Bool, _ property: @autoclosure () -> String) {
    if !condition() { preconditionFailure("property violated: \(property())") }
}
