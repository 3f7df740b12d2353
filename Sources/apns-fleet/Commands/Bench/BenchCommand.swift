import ArgumentParser

/// `apns-fleet bench`: benchmarks that print one machine-readable JSON line per run, the median
/// of several runs, and optionally a Markdown table.
struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure throughput, CPU per message and memory; one JSON line per run.",
        discussion: """
            Build in release mode first: debug figures say little.

            Example:
              swift build -c release --product apns-fleet
              .build/release/apns-fleet bench e2e --runs 3 --markdown bench.md | tee bench.jsonl
              scripts/plot_bench.py bench.jsonl --out docs/bench.png
            """,
        subcommands: [ClientBenchCommand.self, CodecBenchCommand.self, KafkaBenchCommand.self, E2EBenchCommand.self, ScalingBenchCommand.self]
    )
}
