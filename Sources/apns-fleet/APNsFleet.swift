import ArgumentParser

/// The one `apns-fleet` binary. Each subcommand lives in `Commands/` and is a thin layer over
/// the library modules, so that everything it does is also reachable from tests.
@main
struct APNsFleet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-fleet",
        abstract: "Deliver Apple Push Notifications from Kafka at scale.",
        discussion: """
            Producers publish notification jobs to Kafka; workers send them to APNs over HTTP/2 and
            publish one result per notification. See the README for the contracts.

            Example:
              apns-fleet validate-job jobs.jsonl
            """,
        version: APNsFleetVersion.current,
        subcommands: [
            ValidateJobCommand.self,
        ]
    )
}

enum APNsFleetVersion {
    static let current = "0.1.0"
}
