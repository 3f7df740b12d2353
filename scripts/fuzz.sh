#!/usr/bin/env bash
# Builds the libFuzzer target over APNsCore (Tests/Sanitized, with -sanitize=fuzzer,address) and
# fuzzes each of its targets for an equal share of FUZZ_SECONDS, starting from the committed seeds
# in Tests/Corpus/fuzz-seeds/<target>. New interesting inputs go to
# Tests/Sanitized/.build-fuzz/corpus/<target> (kept between local runs, not committed); a crash,
# hang or leak stops the run with a non-zero status and leaves the input in
# Tests/Sanitized/.build-fuzz/artifacts/. Reproduce one with the replayer:
#   (cd Tests/Sanitized && swift run --scratch-path .build-asan --sanitize=address CoreFuzz <target> .build-fuzz/artifacts/<file>)
set -euo pipefail
cd "$(dirname "$0")/../Tests/Sanitized"

SWIFT=${SWIFT:-swift}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
TARGETS=(envelope headers gateway feedback)
SEEDS=../Corpus/fuzz-seeds
SCRATCH=.build-fuzz

flags=(-c debug --scratch-path "$SCRATCH" --product CoreFuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING)
# ld.gold prints one warning per ASan check symbol it cannot export; they say nothing useful.
$SWIFT build "${flags[@]}" 2>&1 | { grep -v "Cannot export local symbol" || true; }
binary="$($SWIFT build "${flags[@]}" --show-bin-path)/CoreFuzz"
[ -x "$binary" ] || { echo "fuzz: the build failed" >&2; exit 1; }

share=$(( FUZZ_SECONDS / ${#TARGETS[@]} ))
(( share >= 1 )) || share=1
mkdir -p "$SCRATCH/artifacts"
for target in "${TARGETS[@]}"; do
    mkdir -p "$SCRATCH/corpus/$target"
    echo "fuzz: $target for ${share}s"
    # -timeout: an input taking over 5 s is a hang; -rss_limit_mb: memory blow-ups are bugs too.
    # -print_final_stats=1 ends with the number of inputs run, for the log.
    log="$SCRATCH/$target.log"
    status=0
    # SWIFT_BACKTRACE=enable=no: on a trap, libFuzzer's own report (with ASan's stack) is the one
    # to read; Swift's backtracer would only add an ASan complaint about itself.
    SWIFT_BACKTRACE=enable=no CORE_FUZZ_TARGET=$target "$binary" "$SCRATCH/corpus/$target" "$SEEDS/$target" \
        -max_total_time="$share" -timeout=5 -rss_limit_mb=2048 -max_len=8192 \
        -artifact_prefix="$SCRATCH/artifacts/$target-" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^INFO: seed corpus" "$log" || true
    if [ "$status" -ne 0 ]; then
        # The report: what broke, where, and the saved input.
        grep -E "property violated|Fatal error|ERROR|SUMMARY|#[0-9]+ 0x.* in .*(APNsCore|CoreFuzz)|Test unit written" "$log" | head -40 >&2 || true
        echo "fuzz: $target failed (status $status); full log Tests/Sanitized/$log" >&2
        echo "fuzz: replay with (cd Tests/Sanitized && swift run --scratch-path .build-asan --sanitize=address CoreFuzz $target $SCRATCH/artifacts/<file>)" >&2
        exit 1
    fi
done
echo "fuzz: ${#TARGETS[@]} targets, ${share}s each, no crash, hang or broken property"
