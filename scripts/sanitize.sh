#!/usr/bin/env bash
# The unit layer under ThreadSanitizer and AddressSanitizer: APNsCore's tests, and the committed
# fuzz seeds replayed through the fuzz targets' checks. Builds Tests/Sanitized, a package that
# holds only APNsCore (symlinked) and swift-crypto, so no other dependency is rebuilt per
# sanitizer. Each sanitizer has its own scratch path (.build-tsan, .build-asan).
# SANITIZERS="address" runs one of them.
set -euo pipefail
cd "$(dirname "$0")/../Tests/Sanitized"

SWIFT=${SWIFT:-swift}
SANITIZERS=${SANITIZERS:-thread address}
SEEDS=../Corpus/fuzz-seeds

for sanitizer in $SANITIZERS; do
    case $sanitizer in
        thread) scratch=.build-tsan ;;
        address) scratch=.build-asan ;;
        *) echo "sanitize: unknown sanitizer $sanitizer" >&2; exit 2 ;;
    esac
    echo "sanitize: $sanitizer"
    # ld.gold prints one warning per ASan check symbol it cannot export; they say nothing useful.
    $SWIFT build --build-tests --sanitize="$sanitizer" --scratch-path "$scratch" 2>&1 | { grep -v "Cannot export local symbol" || true; }
    # A report makes the process exit non-zero (halt_on_error is the default for both). The tests
    # are Swift Testing only: --disable-xctest skips the empty XCTest pass, whose runner (the
    # toolchain's libXCTest) leaks a few objects that LeakSanitizer would report.
    TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}" \
        $SWIFT test --skip-build --disable-xctest --sanitize="$sanitizer" --scratch-path "$scratch"
    replay="$($SWIFT build --sanitize="$sanitizer" --scratch-path "$scratch" --show-bin-path)/CoreFuzz"
    for target in envelope headers gateway feedback; do
        "$replay" "$target" "$SEEDS/$target"
    done
done
