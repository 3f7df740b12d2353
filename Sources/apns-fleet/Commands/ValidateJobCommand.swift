import APNsCore
import APNsFleetConfig
import ArgumentParser
import Foundation

/// `apns-fleet validate-job`: lets producers check their messages against the job contract
/// with exactly the rules the worker applies.
struct ValidateJobCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "validate-job",
        abstract: "Check notification jobs against the job contract.",
        discussion: """
            Reads one JSON job, or JSON lines (one job per line), from a file or standard input, \
            and prints for each whether it is valid and, if not, the exact reason the worker \
            would put in its `invalid` result. With --header, the input is instead the raw APNs \
            payload of a header-encoded job.

            With --config, each job goes through the worker's own intake: its app, default topic \
            and push type, worker.max-tokens-per-job, and the binary interface's limits for apps \
            with protocol binary.

            Exit status: 0 when every job is valid, 1 when any is invalid, 2 on a usage error \
            (including a configuration that does not load).

            Examples:
              apns-fleet validate-job jobs.jsonl
              echo '{"token":"<64 hex digits>","payload":{"aps":{"alert":"hi"}}}' | apns-fleet validate-job
              apns-fleet validate-job --header apns-token=<hex> --header apns-topic=com.example.app payload.json
              apns-fleet validate-job --config fleet.yaml jobs.jsonl   # also resolve apps and topics
            """
    )

    @Argument(help: "File with one JSON job or JSON lines; '-' or nothing reads standard input.")
    var file: String?

    @Option(name: .customLong("header"), help: ArgumentHelp("A record header key=value: validates the input as a header-encoded job's raw payload.", valueName: "key=value"))
    var headers: [String] = []

    @Option(help: "A configuration file: jobs are then also resolved against its apps (unknown app, missing topic).")
    var config: String?

    @Option(help: "Most tokens one job may carry (default: worker.max-tokens-per-job from --config, otherwise 1000).")
    var maxTokens: Int?

    @Flag(help: "Print only the invalid jobs.")
    var quiet = false

    @Flag(help: "Print one JSON object per job instead of text.")
    var json = false

    func validate() throws {
        if let maxTokens, !(1...JobDecoder.Limits.tokensThatFit).contains(maxTokens) {
            throw ValidationError("--max-tokens must be 1 to \(JobDecoder.Limits.tokensThatFit) (the most worker.max-tokens-per-job allows)")
        }
        for header in headers where !header.contains("=") {
            throw ValidationError("--header expects key=value, got '\(header)'")
        }
    }

    func run() async throws {
        let input = try readInput()
        var fleet: FleetConfiguration?
        if let config {
            do {
                fleet = try await ConfigurationLoader(filePath: config, environment: ProcessInfo.processInfo.environment).load()
            } catch {
                // Exit 2, not 1: a configuration that does not load says nothing about the jobs.
                throw UsageError("\(error)")
            }
            // As the worker refuses it: every job would read "invalid" for the configuration's sake.
            if fleet?.apps.isEmpty == true {
                throw ConfigurationError(key: "apps", "no app is configured in \(config); a worker refuses it, so jobs cannot be resolved against it")
            }
            if let maxTokens { fleet?.worker.maxTokensPerJob = maxTokens }
        }
        let validator = JobValidation(decoder: JobDecoder(limits: .init(maximumTokensPerJob: maxTokens ?? 1000)), fleet: fleet)

        var verdicts: [(label: String, verdict: JobValidation.Verdict)] = []
        if !headers.isEmpty {
            let recordHeaders = headers.map { pair -> RecordHeader in
                let equals = pair.firstIndex(of: "=") ?? pair.endIndex
                let value = equals < pair.endIndex ? String(pair[pair.index(after: equals)...]) : ""
                return RecordHeader(String(pair[..<equals]), value)
            }
            verdicts.append(("payload", validator.check(value: input, headers: recordHeaders)))
        } else {
            for (label, record) in JobInputSplitter.records(in: input) {
                verdicts.append((label, validator.check(value: record, headers: [])))
            }
        }
        guard !verdicts.isEmpty else {
            throw UsageError("no jobs in the input")
        }

        var invalid = 0
        for (label, verdict) in verdicts {
            if case .invalid = verdict { invalid += 1 } else if quiet { continue }
            print(json ? verdict.jsonLine(label: label) : verdict.textLine(label: label))
        }
        if !json && !quiet {
            print("\(verdicts.count - invalid) valid, \(invalid) invalid")
        }
        if invalid > 0 { throw ExitCode(1) }
    }

    private func readInput() throws -> [UInt8] {
        if file == nil || file == "-" {
            return Array(FileHandle.standardInput.readDataToEndOfFile())
        }
        guard let path = file, let data = FileManager.default.contents(atPath: path) else {
            throw UsageError("cannot read \(file ?? "")")
        }
        return Array(data)
    }
}

/// Splits validate-job's input into records: the whole input when it is one JSON document,
/// otherwise one record per non-empty line.
enum JobInputSplitter {
    static func records(in input: [UInt8]) -> [(String, [UInt8])] {
        if (try? JSONParser.parse(input)) != nil {
            return [("job", input)]
        }
        return lines(in: input).map { ("line \($0.number)", $0.bytes) }
    }

    /// The non-blank lines of `input` as bytes, numbered from 1: split on LF with a CR before
    /// it dropped (files written on Windows), bytes kept as they are (invalid UTF-8 included,
    /// for the checks to name).
    static func lines(in input: [UInt8]) -> [(number: Int, bytes: [UInt8])] {
        var lines: [(number: Int, bytes: [UInt8])] = []
        var lineNumber = 0
        // A UTF-8 byte order mark (Windows PowerShell writes one) is not part of the first job.
        let text = input.starts(with: [0xEF, 0xBB, 0xBF]) ? input.dropFirst(3) : input[...]
        for line in text.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            var bytes = Array(line)
            if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
            if bytes.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
            lines.append((lineNumber, bytes))
        }
        return lines
    }
}

/// The checks validate-job applies: the worker's decoder, or with a configuration the worker's
/// whole intake (`JobIntake`), so that nothing the worker would refuse shows as valid.
struct JobValidation {
    enum Verdict {
        case valid(NotificationJob, topic: String?, app: String?)
        case invalid(JobRejection)

        func textLine(label: String) -> String {
            switch self {
            case .invalid(let rejection):
                return "\(label): invalid: \(rejection.reason)"
            case .valid(let job, let topic, let app):
                var parts = ["\(job.tokens.count) token\(job.tokens.count == 1 ? "" : "s")"]
                if let id = job.id { parts.insert("id \(id)", at: 0) }
                if let topic { parts.append("topic \(topic)") }
                if let app { parts.append("app \(app)") }
                parts.append("payload \(job.payload.count) bytes")
                return "\(label): valid (\(parts.joined(separator: ", ")))"
            }
        }

        func jsonLine(label: String) -> String {
            var writer = JSONWriter()
            writer.beginObject()
            writer.field("input", label)
            switch self {
            case .invalid(let rejection):
                writer.field("valid", false)
                writer.field("reason", rejection.reason)
            case .valid(let job, let topic, let app):
                writer.field("valid", true)
                writer.field("id", job.id)
                writer.field("tokens", job.tokens.count)
                writer.field("topic", topic)
                writer.field("app", app)
            }
            writer.endObject()
            return String(decoding: writer.bytes, as: UTF8.self)
        }
    }

    var decoder: JobDecoder
    /// The worker's intake, when a configuration was given (made once, not per job).
    private let intake: JobIntake?

    init(decoder: JobDecoder, fleet: FleetConfiguration?) {
        self.decoder = decoder
        self.intake = fleet.map { JobIntake(configuration: $0, workerID: "validate-job") }
    }

    func check(value: [UInt8], headers: [RecordHeader]) -> Verdict {
        if let intake {
            let source = SourcePosition(topic: intake.configuration.topics.jobs, partition: 0, offset: 0)
            switch intake.accept(value: value, headers: headers, source: source, now: UnixMillis(0)) {
            case .accepted(let accepted): return .valid(accepted.job.job, topic: accepted.job.topic, app: accepted.appName)
            case .rejected(let rejected): return .invalid(rejected.rejection)
            }
        }
        do {
            let job = try decoder.decode(value: value, headers: headers)
            // Without a configuration the topic and push type may still come from an app's
            // defaults: only the job's own fields are checked, against its push type or alert.
            try job.checkRules(pushType: job.pushType ?? .alert)
            return .valid(job, topic: job.topic, app: job.app)
        } catch {
            return .invalid(error)
        }
    }
}
