import APNsCore
import ArgumentParser
import Foundation
import KafkaTransport
import Logging
import ServiceLifecycle
import UnixSignals

/// `apns-fleet kafka-dev`: an embedded Kafka (librdkafka's mock cluster) for development, the
/// demo and tests, with fault injection on stdin.
struct KafkaDevCommand: AsyncParsableCommand {
    static let projectTopics = ["apns.jobs", "apns.jobs.retry", "apns.jobs.dlq", "apns.results", "apns.token-events"]

    static let configuration = CommandConfiguration(
        commandName: "kafka-dev",
        abstract: "Run an embedded Kafka cluster for development and tests.",
        discussion: """
            Starts librdkafka's mock cluster with N brokers on 127.0.0.1 (random ports), creates \
            the project's topics, prints the bootstrap servers as the first line of standard \
            output, and runs until SIGTERM or SIGINT. Any Kafka client can connect.

            Limits: it is a test double, not Kafka. It implements no CreateTopics or other admin \
            requests (topics come from --topic, or the create-topic command), keeps only about \
            5 MiB (or 100,000 batches) per partition, dropping the oldest, persists nothing, and \
            its ports change on every start. Production uses a real Kafka cluster (docs/kafka.md).

            Fault commands, one per line on standard input, each answered on standard output \
            with "ok ..." or "error: ...":
              broker-down 1 | broker-up 1 | rtt 1 200 | leader apns.jobs 0 2
              request-errors Produce 3 NOT_LEADER_FOR_PARTITION | clear-request-errors Produce
              create-topic NAME PARTITIONS [RF] | bootstrap | help

            The bootstrap file is removed as kafka-dev starts and when it stops, so a script \
            that waits for the file never reads an earlier run's ports.

            Example:
              rm -f /tmp/kafka.bootstrap
              apns-fleet kafka-dev --brokers 3 --partitions 12 --bootstrap-file /tmp/kafka.bootstrap --no-stdin &
              until [ -s /tmp/kafka.bootstrap ]; do sleep 0.1; done
              kcat -b "$(cat /tmp/kafka.bootstrap)" -L
              echo hello | kcat -b "$(cat /tmp/kafka.bootstrap)" -P -t apns.jobs
              kcat -b "$(cat /tmp/kafka.bootstrap)" -C -t apns.jobs -e
            """
    )

    @Option(help: "Number of brokers (ids 1...N).")
    var brokers: Int = 3

    @Option(help: "Partitions of each topic.")
    var partitions: Int = 8

    @Option(help: "Replication factor of each topic (at most the number of brokers).")
    var replicationFactor: Int = 1

    @Option(
        name: .customLong("topic"),
        help: ArgumentHelp(
            "A topic to create; repeat for several. Default: \(KafkaDevCommand.projectTopics.joined(separator: ", ")).",
            valueName: "name"
        )
    )
    var topics: [String] = []

    @Option(help: ArgumentHelp("Also write the bootstrap servers to this file (replaced atomically).", valueName: "path"))
    var bootstrapFile: String?

    @Flag(help: "Do not read fault commands from standard input.")
    var noStdin = false

    @Option(help: ArgumentHelp("Log level on standard error (trace, debug, info, notice, warning, error, critical).", valueName: "level"))
    var logLevel: String = "notice"

    func validate() throws {
        guard brokers >= 1, brokers <= 64 else { throw ValidationError("--brokers must be 1...64, not \(brokers)") }
        guard partitions >= 1, partitions <= 10_000 else {
            throw ValidationError("--partitions must be 1...10000, not \(partitions)")
        }
        guard replicationFactor >= 1, replicationFactor <= brokers else {
            throw ValidationError("--replication-factor must be 1...\(brokers) (the broker count), not \(replicationFactor)")
        }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("unknown --log-level '\(logLevel)'") }
        var seen = Set<String>()
        for topic in topics {
            if let problem = TopicNames.problem(with: topic) {
                throw ValidationError("--topic \"\(topic.prefix(60))\": \(problem) (repeat --topic for several topics)")
            }
            guard seen.insert(topic).inserted else { throw ValidationError("--topic \(topic) is given twice") }
        }
    }

    func run() async throws {
        // Logs go to stderr: stdout carries the bootstrap line and command answers.
        var logger = Logger(label: "kafka-dev") { label in StreamLogHandler.standardError(label: label) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .notice

        // An earlier run's file (one killed before it could remove it) names ports nobody
        // listens on any more: gone before anything else, so a script waiting for the file
        // reads this run's address.
        if let bootstrapFile { unlink(bootstrapFile) }
        let cluster = try MockKafkaCluster(brokers: brokers, logger: logger)
        let topicNames = topics.isEmpty ? Self.projectTopics : topics
        for topic in topicNames {
            try cluster.createTopic(topic, partitions: partitions, replicationFactor: replicationFactor)
        }
        let output = ConsoleOutput()
        let bootstrapFile = self.bootstrapFile
        let (brokers, partitions, announcer, noStdin) = (self.brokers, self.partitions, logger, self.noStdin)
        // Announced from inside the service group, once its signal handlers are in place: a
        // script that stops kafka-dev as soon as it sees the line gets a clean stop.
        let announce: @Sendable () throws -> Void = {
            // The file first: whoever sees the line may read the file at once.
            if let bootstrapFile {
                try Self.writeAtomically(cluster.bootstrapServers + "\n", to: bootstrapFile)
            }
            output.line(cluster.bootstrapServers)
            announcer.notice(
                "kafka-dev running",
                metadata: [
                    "kafka.bootstrap": "\(cluster.bootstrapServers)",
                    "kafka.brokers": "\(brokers)",
                    "kafka.topics": "\(topicNames.joined(separator: ","))",
                    "kafka.partitions": "\(partitions)",
                ]
            )
            // Commands on stdin only after the line: its first line is always the bootstrap
            // servers, and a failure above (an unwritable bootstrap file) ends the process
            // before a thread blocks in a read of stdin.
            if !noStdin {
                // Started in the background of an interactive shell, the first read of the
                // terminal would stop the whole process (SIGTTIN), brokers included; ignored,
                // the read fails instead and only the command reader ends.
                signal(SIGTTIN, SIG_IGN)
                let console = MockClusterConsole(cluster: cluster)
                // stdin is read with blocking calls, so on its own thread. At shutdown the
                // process exits with the thread still blocked in read(2), which is harmless.
                let thread = Thread {
                    while let line = readLine() {
                        let trimmed = line.trimmingCharacters(in: .whitespaces)
                        if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
                        output.line(console.execute(trimmed))
                    }
                }
                thread.name = "kafka-dev-stdin"
                thread.start()
            }
        }

        let group = ServiceGroup(
            configuration: .init(
                services: [KafkaDevService(cluster: cluster, announce: announce)],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            )
        )
        do {
            try await group.run()
        } catch {
            Self.removeBootstrapFile(bootstrapFile, naming: cluster.bootstrapServers)
            throw error
        }
        Self.removeBootstrapFile(bootstrapFile, naming: cluster.bootstrapServers)
        logger.notice("kafka-dev stopped")
        // `_exit`, not a return through `exit`: the stdin thread keeps the cluster (and its
        // broker threads) alive, and atexit handlers (OpenSSL's cleanup among them) must not run
        // under them. Nothing is left to flush (the lines go out with write(2), the log to
        // unbuffered stderr), and `fflush(nil)` would wait for stdin's lock, which the stdin
        // thread holds while blocked in its read.
        _exit(0)
    }

    private static func writeAtomically(_ text: String, to path: String) throws {
        let temporary = path + ".tmp-\(getpid())"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard descriptor >= 0 else {
            throw CommandFailure("cannot write the bootstrap file \(path): \(String(cString: strerror(errno)))")
        }
        do {
            try FileHandle(fileDescriptor: descriptor, closeOnDealloc: true).write(contentsOf: Data(text.utf8))
        } catch {
            unlink(temporary)
            throw CommandFailure("cannot write the bootstrap file \(path): \(error.localizedDescription)")
        }
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw CommandFailure("cannot move the bootstrap file into place at \(path): \(reason)")
        }
    }

    /// Removes the bootstrap file at exit, unless another kafka-dev has written its own address
    /// there meanwhile.
    private static func removeBootstrapFile(_ path: String?, naming servers: String) {
        guard let path, let contents = FileManager.default.contents(atPath: path),
            String(decoding: contents, as: UTF8.self) == servers + "\n"
        else { return }
        unlink(path)
    }
}

/// Keeps the mock cluster alive until graceful shutdown.
private struct KafkaDevService: Service {
    let cluster: MockKafkaCluster
    let announce: @Sendable () throws -> Void

    func run() async throws {
        try announce()
        try? await gracefulShutdown()
        withExtendedLifetime(cluster) {}
    }
}

/// Whole lines to stdout, flushed at once (stdout is a pipe when a test or script drives us).
private final class ConsoleOutput: Sendable {
    private let lock = NSLock()

    func line(_ text: String) {
        lock.lock()
        defer { lock.unlock() }
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}
