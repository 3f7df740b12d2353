#!/usr/bin/env python3
"""Plot `apns-fleet bench` JSON lines: throughput against workers, and latency percentiles.

Usage: scripts/plot_bench.py bench.jsonl [more.jsonl ...] --out docs/bench.png

Reads every line that is a JSON object with a "suite" field. Median lines ("run": "median of N")
are used when present; otherwise each run is plotted. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def load(paths):
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    sys.exit(f"{path}:{number}: not JSON: {error}")
                if "suite" in record:
                    records.append(record)
    return records


def configuration(record):
    return (record["suite"], record.get("workers"), record.get("publish_rate"), record.get("apns_latency_ms"))


def preferred(records):
    """Per configuration, its median line when there is one, else every run."""
    groups = {}
    for record in records:
        groups.setdefault(configuration(record), []).append(record)
    chosen = []
    for group in groups.values():
        medians = [r for r in group if str(r.get("run", "")).startswith("median")]
        chosen += medians[-1:] or group
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="files of JSON lines from apns-fleet bench")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is missing: apt-get install python3-matplotlib (or pip install matplotlib)")

    records = load(args.inputs)
    # Throughput against workers: the scaling suite when present, else e2e; runs with injected
    # APNs latency measure memory, not throughput, and are left out.
    plain = [r for r in records if "apns_latency_ms" not in r]
    fleet = preferred([r for r in plain if r["suite"] == "scaling"]) or preferred([r for r in plain if r["suite"] == "e2e"])
    if not fleet:
        sys.exit("no e2e or scaling lines in the input")

    figure, (throughput_axis, latency_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    by_workers = sorted(fleet, key=lambda r: r["workers"])
    workers = [r["workers"] for r in by_workers]
    total = [r["notifications_per_second"] for r in by_workers]
    per_worker = [r["per_worker_notifications_per_second"] for r in by_workers]
    throughput_axis.plot(workers, total, marker="o", label="fleet")
    throughput_axis.plot(workers, per_worker, marker="s", label="per worker")
    if workers and total:
        ideal = [total[0] * w / workers[0] for w in workers]
        throughput_axis.plot(workers, ideal, linestyle=":", color="grey", label="linear")
    throughput_axis.set_xlabel("push workers (one consumer group)")
    throughput_axis.set_ylabel("notifications / s")
    throughput_axis.set_xticks(workers)
    throughput_axis.set_title("Throughput against workers")
    throughput_axis.legend()
    throughput_axis.grid(alpha=0.3)

    labels = [f'{r["workers"]}w' + (f' @{int(r["publish_rate"])}/s' if "publish_rate" in r else "") for r in by_workers]
    positions = range(len(by_workers))
    latency_axis.bar([p - 0.2 for p in positions], [r["p50_ms"] for r in by_workers], width=0.4, label="p50")
    latency_axis.bar([p + 0.2 for p in positions], [r["p99_ms"] for r in by_workers], width=0.4, label="p99")
    latency_axis.set_xticks(list(positions))
    latency_axis.set_xticklabels(labels)
    latency_axis.set_ylabel("job → result latency, ms")
    latency_axis.set_title("Latency percentiles")
    latency_axis.legend()
    latency_axis.grid(axis="y", alpha=0.3)

    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out} from {len(fleet)} lines")


if __name__ == "__main__":
    main()
