import APNsCore
import APNsFleetConfig
import ArgumentParser
import FleetLoad
import FleetWorker
import Foundation
import KafkaTransport
import Logging

/// `apns-fleet publish`: produce notification jobs to any Kafka, for testing and load tests.
struct PublishCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "publish",
        abstract: "Publish notification jobs to Kafka: from flags, a JSON-lines file, or a generator.",
        discussion: """
            Exactly one source: --token (with --payload), --file (one JSON envelope per line, - \
            for standard input), or --generate N (a deterministic mix of jobs, paced with --rate). \
            Envelopes are validated first and a bad one is refused with its line and field, unless \
            --no-validate (to exercise the DLQ). --encoding headers sends the payload as the record \
            value and the rest as headers. Kafka settings (SASL, TLS, topics) come from --config, \
            APNS_FLEET_* and --set, as for the worker; --brokers is a shortcut for \
            kafka.bootstrap-servers. Progress goes to standard error; with --json a summary line \
            goes to standard output.

            Examples:
              apns-fleet publish --brokers 127.0.0.1:9092 --token <64 hex> --payload '{"aps":{"alert":"hi"}}'
              apns-fleet publish --brokers 127.0.0.1:9092 --file jobs.jsonl --encoding headers
              apns-fleet publish --brokers kafka:9092 --generate 1000000 --rate 20000 --mix good=95,fanout=5
            """
    )

    @Option(help: "Kafka brokers (sets kafka.bootstrap-servers).")
    var brokers: String?

    @Option(help: "Configuration file (YAML or JSON) for Kafka settings and topic names.")
    var config: String?

    @Option(name: .customLong("set"), help: ArgumentHelp("Override a configuration key. Not for secrets: arguments are visible to every process on the host.", valueName: "key=value"))
    var overrides: [String] = []

    @Option(name: .customLong("to"), help: "Topic to publish to. Default: topics.jobs (apns.jobs).")
    var kafkaTopic: String?

    @Option(help: "Job encoding: json (the envelope) or headers (payload as value, the rest as headers).")
    var encoding: JobEncodingChoice = .json

    // Source 1: flags.
    @Option(help: "Device token (hex). Repeat for a fan-out job.")
    var token: [String] = []

    @Option(help: "The APNs payload JSON, for --token.")
    var payload: String?

    @Option(name: .customLong("id"), help: "Job id, for --token.")
    var jobID: String?

    @Option(name: .customLong("topic"), help: "apns-topic (bundle id), for --token.")
    var apnsTopic: String?

    @Option(name: .customLong("push-type"), help: "apns-push-type, for --token.")
    var pushType: String?

    @Option(help: "apns-priority (10, 5 or 1), for --token.")
    var priority: Int?

    @Option(help: "The configured app that sends the job, for --token and --generate.")
    var app: String?

    @Option(name: .customLong("collapse-id"), help: "apns-collapse-id, for --token.")
    var collapseID: String?

    @Option(help: "apns-expiration (unix seconds), for --token.")
    var expiration: Int64?

    // Source 2: a file.
    @Option(help: "JSON-lines file of job envelopes (- for standard input).")
    var file: String?

    @Flag(name: .customLong("no-validate"), help: "Send file lines without checking them (json encoding only).")
    var noValidate = false

    // Source 3: the generator.
    @Option(help: "Generate this many jobs.")
    var generate: Int?

    @Option(help: "Generated job mix, kind=weight,… (kinds: \(JobMix.Kind.allCases.map(\.rawValue).joined(separator: ", "))). Default: \(JobMix.realistic.description).")
    var mix: String?

    @Option(help: "Jobs per second (default: as fast as Kafka takes them).")
    var rate: Double?

    @Option(name: .customLong("fanout-size"), help: "Tokens per generated fan-out job. Default: \(Generated.fanoutSize).")
    var fanoutSize: Int?

    @Option(name: .customLong("dead-tokens"), help: "Size of the pool of unregistered tokens the generator uses. Default: \(Generated.deadTokens).")
    var deadTokens: Int?

    @Option(help: "Generator seed, for repeatable runs. Default: \(Generated.seed).")
    var seed: UInt64?

    @Option(name: .customLong("generated-topic"), help: "apns-topic of generated jobs. Default: \(Generated.topic).")
    var generatedTopic: String?

    /// The generator's settings when not given. (Optional options, so that one given without
    /// --generate can be refused; their defaults live here, once.)
    enum Generated {
        static let fanoutSize = 10
        static let deadTokens = 100
        static let seed: UInt64 = 0x5EED
        static let topic = "com.example.app"
    }

    @Flag(help: "Print a JSON summary line on standard output.")
    var json = false

    func validate() throws {
        let sources = [!token.isEmpty, file != nil, generate != nil].filter { $0 }.count
        guard sources == 1 else {
            throw ValidationError("give exactly one source: --token (with --payload), --file or --generate")
        }
        if !token.isEmpty, payload == nil { throw ValidationError("--token needs --payload (the APNs payload JSON)") }
        if let generate, generate <= 0 { throw ValidationError("--generate must be positive") }
        // An option of another source would be ignored: say so rather than publish something else.
        let generatorOnly = [("--rate", rate != nil), ("--mix", mix != nil), ("--seed", seed != nil), ("--fanout-size", fanoutSize != nil), ("--dead-tokens", deadTokens != nil), ("--generated-topic", generatedTopic != nil)]
        if generate == nil, let given = generatorOnly.first(where: \.1) {
            throw ValidationError("\(given.0) is for generated jobs (--generate)")
        }
        let flagsOnly = [("--payload", payload != nil), ("--id", jobID != nil), ("--topic", apnsTopic != nil), ("--push-type", pushType != nil), ("--priority", priority != nil), ("--collapse-id", collapseID != nil), ("--expiration", expiration != nil)]
        if token.isEmpty, let given = flagsOnly.first(where: \.1) {
            throw ValidationError("\(given.0) is for a job given by flags (--token)")
        }
        if noValidate, file == nil { throw ValidationError("--no-validate is for --file") }
        if app != nil, file != nil { throw ValidationError("--app is for --token and --generate; a file's jobs name their own app") }
        guard (2...JobDecoder.Limits.tokensThatFit).contains(fanoutSize ?? Generated.fanoutSize) else {
            throw ValidationError("--fanout-size must be 2 to \(JobDecoder.Limits.tokensThatFit) (the most worker.max-tokens-per-job allows)")
        }
        guard (1...1_000_000).contains(deadTokens ?? Generated.deadTokens) else { throw ValidationError("--dead-tokens must be 1 to 1,000,000") }
        try checkRate(rate)
        if noValidate, encoding == .headers { throw ValidationError("--no-validate works with --encoding json only") }
        if generate != nil, encoding == .headers {
            throw ValidationError("--generate mixes both encodings itself (the headers kind); leave --encoding out")
        }
        if let mix { _ = try parseMix(mix) }
    }

    func run() async throws {
        var settings = overrides
        if let brokers { settings.append("kafka.bootstrap-servers=\(brokers)") }
        let fleet = try await ConfigurationLoader(filePath: config, environment: ProcessInfo.processInfo.environment, overrides: settings).load()
        var logger = Logger(label: "apns-fleet.publish") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = .warning
        let topic = kafkaTopic ?? fleet.topics.jobs
        // The input is read and checked before Kafka is involved: a bad line or a missing file is
        // reported at once, not after a producer started (and possibly waited on the brokers).
        let messages = generate == nil ? try records(topic: topic, fleet: fleet) : []
        var client = try KafkaClientConfiguration.checked(fleet.kafka, clientID: "apns-fleet-publish")
        client.statisticsInterval = nil
        var producerConfiguration = KafkaProducerConfiguration(client: client)
        // Someone is waiting at a terminal: say within a minute that Kafka does not take the
        // jobs (still above librdkafka's 30-second request timeout, see docs/kafka.md).
        producerConfiguration.messageTimeout = .seconds(60)
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)
        let publisher = JobPublisher(producer: producer, topic: topic)
        let producing = Task { try await producer.run() }
        defer { producing.cancel() }

        let summary: JobPublisher.Summary
        if let generate {
            var generator = JobGenerator(
                mix: try mix.map { try parseMix($0) } ?? .realistic, topic: generatedTopic ?? Generated.topic, app: app,
                fanoutSize: fanoutSize ?? Generated.fanoutSize, deadTokenCount: deadTokens ?? Generated.deadTokens,
                idPrefix: "pub-\(UInt32.random(in: 0...UInt32.max))", seed: seed ?? Generated.seed
            )
            var progress = ProgressLine(label: "publishing", total: generate)
            summary = try await publisher.publish(count: generate, generator: &generator, rate: rate, tally: nil, clock: Self.nowMillis) {
                progress.update($0)
            }
            progress.finish()
        } else {
            var progress = ProgressLine(label: "publishing", total: messages.count)
            summary = try await publisher.publish(messages) { progress.update($0) }
            progress.finish()
        }
        await producer.shutdown(flushTimeout: .seconds(30))

        if json {
            var writer = JSONWriter()
            writer.beginObject()
            writer.field("topic", topic)
            writer.field("published", summary.published)
            writer.field("failed", summary.failed)
            writer.field("seconds", summary.seconds)
            writer.field("jobs_per_second", summary.seconds > 0 ? Double(summary.published) / summary.seconds : 0, decimals: 0)
            writer.endObject()
            print(String(decoding: writer.bytes, as: UTF8.self))
        } else {
            FileHandle.standardError.write(Data("published \(summary.published) jobs to \(topic) in \(String(format: "%.1f", summary.seconds)) s\n".utf8))
        }
        if summary.failed > 0 {
            throw CommandFailure("\(summary.failed) jobs were not accepted by Kafka; the first error: \(summary.firstError ?? "unknown")")
        }
    }

    private func records(topic: String, fleet: FleetConfiguration) throws -> [KafkaOutgoingMessage] {
        // validate-job's checks: the worker's whole intake when the configuration has apps (its
        // token limit, push types, payload limits, apps), otherwise the job's own rules. The
        // decoder alone let through what the worker then sent to the DLQ (a 4.5 KB alert).
        let validation = JobValidation(
            decoder: JobDecoder(limits: .init(maximumTokensPerJob: fleet.worker.maxTokensPerJob)),
            fleet: fleet.apps.isEmpty ? nil : fleet
        )
        func record(_ envelope: [UInt8], validate: Bool = true) throws(JobRejection) -> KafkaOutgoingMessage {
            if validate, case .invalid(let rejection) = validation.check(value: envelope, headers: []) { throw rejection }
            return try JobRecords.record(envelope: envelope, topic: topic, encoding: encoding, validate: validate)
        }
        if !token.isEmpty {
            let envelope = JobRecords.envelope(
                id: jobID, tokens: token, topic: apnsTopic, pushType: pushType, priority: priority,
                app: app, collapseID: collapseID, expiration: expiration, payload: payload ?? "{}"
            )
            do {
                return [try record(envelope)]
            } catch {
                throw UsageError("the job is invalid: \(error.reason)")
            }
        }
        // Bytes, not text: a String would replace invalid UTF-8 with U+FFFD (publishing an
        // altered job), and would not split CRLF lines.
        let input: [UInt8]
        if file == "-" {
            input = Array(FileHandle.standardInput.readDataToEndOfFile())
        } else if let file {
            guard let data = FileManager.default.contents(atPath: file) else { throw UsageError("cannot read \(file)") }
            input = Array(data)
        } else {
            return []
        }
        var messages: [KafkaOutgoingMessage] = []
        for line in JobInputSplitter.lines(in: input) {
            do {
                messages.append(try record(line.bytes, validate: !noValidate))
            } catch {
                throw UsageError("\(file ?? "input") line \(line.number): \(error.reason); nothing was published")
            }
        }
        guard !messages.isEmpty else { throw UsageError("\(file ?? "input") holds no jobs") }
        return messages
    }

    static func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
}

extension JobEncodingChoice: ExpressibleByArgument {}
