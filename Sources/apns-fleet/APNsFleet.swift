import APNsClient
import APNsFleetConfig
import APNsLegacyClient
import APNsSimulator
import FleetWorker
import KafkaTransport
import ArgumentParser
import Foundation

/// The one `apns-fleet` binary. Each subcommand lives in `Commands/` and is a thin layer over
/// the library modules, so that everything it does is also reachable from tests.
@main
struct APNsFleet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-fleet",
        abstract: "Deliver Apple Push Notifications from Kafka at scale.",
        discussion: """
            Producers publish notification jobs to Kafka; workers send them to APNs over HTTP/2 \
            and publish one result per notification. See the README for the contracts.

            Examples:
              apns-fleet demo
              apns-fleet worker --config fleet.yaml
              apns-fleet validate-job jobs.jsonl
            """,
        version: APNsFleetVersion.current,
        subcommands: [
            DemoCommand.self,
            WorkerCommand.self,
            FeedbackCommand.self,
            PublishCommand.self,
            SimulatorCommand.self,
            DevCredentialsCommand.self,
            SendCommand.self,
            ValidateJobCommand.self,
            KafkaDevCommand.self,
            BenchCommand.self,
        ]
    )

    /// Runs the command, mapping usage errors to exit status 2 (argument-parser's default is 64),
    /// so that scripts can tell "you called me wrong" from "the input is invalid" (1).
    static func main() async {
        // A kafka-dev, simulator or worker that the demo or a benchmark started ends with it.
        SpawnedProcess.stopWhenParentExits()
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            // `_exit` after flushing, as every exit of a running worker: a command can fail
            // after creating a Kafka client, whose threads `exit`'s atexit handlers would race.
            if let status = exitStatus(of: error) {
                FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
                fflush(nil)
                _exit(status)
            }
            let code = exitCode(for: error)
            let message = fullMessage(for: error)
            if code == .success {
                print(message)
            } else if !message.isEmpty {
                FileHandle.standardError.write(Data((message + "\n").utf8))
            }
            fflush(nil)
            _exit(code == .validationFailure ? 2 : code.rawValue)
        }
    }
}

/// The exit status of our own errors: 2 for what the caller must fix (usage, configuration,
/// credentials), 1 for work that failed; nil for argument-parser's, which it reports itself.
func exitStatus(of error: any Error) -> Int32? {
    switch error {
    case is UsageError, is ConfigurationError, is SimulatorConfigurationError, is AdminServerError: 2
    case let error as APNsClientError where error.code == .credentials || error.code == .configuration: 2
    case let error as LegacyClientError where error.code == .credentials || error.code == .configuration: 2
    // A librdkafka property refused (from kafka.properties, say): the configuration, not the work.
    case let error as KafkaError where error.code == .configuration: 2
    // The client could not be made from its settings (a TLS file it cannot load, a wrong key
    // password): also something to fix, not work that failed.
    case let error as KafkaError where error.code == .clientCreation: 2
    case is CommandFailure: 1
    default: nil
    }
}

/// A usage problem found while running (an unreadable input file, say): exit status 2.
struct UsageError: Error, CustomStringConvertible {
    var description: String

    init(_ description: String) {
        self.description = description
    }
}

/// A failure of the work itself (Kafka did not take the jobs, say): exit status 1, and no
/// usage text, which would suggest the command was called wrong.
struct CommandFailure: Error, CustomStringConvertible {
    var description: String

    init(_ description: String) {
        self.description = description
    }
}

enum APNsFleetVersion {
    static let current = "0.1.0"
}
