import ArgumentParser

/// `apns-fleet bench`: benchmarks that print one machine-readable JSON line per run. Each
/// suite arrives with the part it measures.
struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure throughput, CPU per message and memory; one JSON line per run.",
        discussion: """
            Build in release mode first: debug figures say little.

            Example:
              swift build -c release --product apns-fleet
              .build/release/apns-fleet bench kafka --messages 200000
            """,
        subcommands: [KafkaBenchCommand.self]
    )
}
