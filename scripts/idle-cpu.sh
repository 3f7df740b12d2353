#!/usr/bin/env bash
# What an idle push worker costs: kafka-dev, the APNs simulator and one worker (two connections)
# on this machine, no jobs; the worker's CPU time and context switches over a window, read from
# /proc. Production fetch settings (no fetch.wait.max.ms override, unlike the demo's).
#
# Usage: scripts/idle-cpu.sh [APNS_FLEET_BINARY] [SECONDS]
#   scripts/idle-cpu.sh .build/release/apns-fleet 30
set -euo pipefail

BIN=${1:-.build/release/apns-fleet}
SECONDS_TO_WATCH=${2:-30}
[ -x "$BIN" ] || { echo "no executable at $BIN (make release first)" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

DIR=$(mktemp -d /tmp/apns-fleet-idle.XXXXXX)
PIDS=()
KEEP_LOGS=false
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if $KEEP_LOGS; then echo "logs kept in $DIR" >&2; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
fail() { echo "$1" >&2; KEEP_LOGS=true; exit 1; }

"$BIN" dev-credentials --out "$DIR/credentials" --topic com.example.app > /dev/null
"$BIN" kafka-dev --brokers 1 --partitions 8 --bootstrap-file "$DIR/bootstrap" > "$DIR/kafka.log" 2>&1 &
PIDS+=($!)
"$BIN" simulator --config "$DIR/credentials/simulator.json" --h2-port 0 --h2c-port=-1 --admin-port=-1 \
    --gateway-port=-1 --gateway-plain-port=-1 --feedback-port=-1 --feedback-plain-port=-1 > "$DIR/simulator.log" 2>&1 &
PIDS+=($!)

for _ in $(seq 1 100); do
    [ -s "$DIR/bootstrap" ] && grep -q "h2 (TLS)" "$DIR/simulator.log" && break
    sleep 0.1
done
PORT=$(sed -n 's/.*h2 (TLS) 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$DIR/simulator.log" | head -1)
[ -n "$PORT" ] && [ -s "$DIR/bootstrap" ] || fail "kafka-dev or the simulator did not start"

read -r KEY_ID TEAM_ID KEY_FILE < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["key_id"], c["team_id"], c["signing_key_file"])' "$DIR/credentials/credentials.json")
cat > "$DIR/fleet.yaml" <<EOF
kafka:
  bootstrap-servers: $(cat "$DIR/bootstrap")
apps: [idle]
app:
  idle:
    key-file: $DIR/credentials/$KEY_FILE
    key-id: $KEY_ID
    team-id: $TEAM_ID
    topic: com.example.app
    environment: custom
    host: 127.0.0.1
    port: $PORT
    ca-file: $DIR/credentials/ca.pem
    connections: 2
admin:
  port: 0
EOF
"$BIN" worker --config "$DIR/fleet.yaml" > "$DIR/worker.log" 2>&1 &
WORKER=$!
PIDS+=("$WORKER")

for _ in $(seq 1 300); do
    grep -q "partitions assigned" "$DIR/worker.log" && break
    sleep 0.1
done
grep -q "partitions assigned" "$DIR/worker.log" || fail "the worker did not join its group"
sleep 5  # connections up, first metrics samples taken

# utime + stime of the whole process (field 14 and 15 of /proc/PID/stat, in clock ticks), and
# the context switches of its threads (a thread that ends inside the window takes its count
# with it; an idle worker starts none).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$WORKER/stat"; }
switches() { awk '/ctxt_switches/ {s += $2} END {print s + 0}' /proc/"$WORKER"/task/*/status 2>/dev/null || true; }
TICKS=$(getconf CLK_TCK)
t0=$(cpu_ticks); s0=$(switches)
sleep "$SECONDS_TO_WATCH"
t1=$(cpu_ticks); s1=$(switches)
python3 - "$t0" "$t1" "$s0" "$s1" "$TICKS" "$SECONDS_TO_WATCH" <<'EOF'
import sys
t0, t1, s0, s1, ticks, seconds = map(float, sys.argv[1:])
cpu = (t1 - t0) / ticks
print(f"idle worker over {seconds:.0f} s: {cpu * 1000:.0f} ms of CPU = {100 * cpu / seconds:.2f}% of one core, "
      f"{(s1 - s0) / seconds:.0f} context switches/s")
EOF
