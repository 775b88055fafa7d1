#!/usr/bin/env bash
# The cost of exact quotas and durable counts on the connection rate (issue 59), two builds
# side by side: each runs the same sandbox with `requests_per_day` set (so every CONNECT is
# reserved against the meter) and a `state_dir` (so the new build writes `usage.state` within
# 100 ms of each reservation, synced), driven by `loadgen rate` (8 concurrent CONNECT + 1-byte
# echo + close). Runs alternate OLD, NEW, OLD, NEW… (ROUNDS of each, SECONDS each) so drift on
# a shared machine hits both; prints every run and each build's mean.
#
#   benches/quota_ab.sh OLD_BINARY [NEW_BINARY]       # ROUNDS=4 RUN_S=5; ~1 min
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
OLD="${1:?usage: benches/quota_ab.sh OLD_BINARY [NEW_BINARY]}"
NEW="${2:-target/release/egress-proxy}"
ROUNDS="${ROUNDS:-4}"; SECONDS_EACH="${RUN_S:-5}"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
LG="$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

config() { # state_dir
  egress_bench_config 3171 9971 \
    | sed "s|^sandboxes:|state_dir: $1\nsandboxes:|" \
    | sed 's|    sources: \[127.0.0.0/8\]|    sources: [127.0.0.0/8]\n    limits: { requests_per_day: 1000000000 }|'
}

# One run of binary $1: connections per second.
run() {
  local state="$WORK/state-$2"; mkdir -p "$state"
  config "$state" > "$WORK/p.yaml"
  "$1" run --config "$WORK/p.yaml" >/dev/null 2>"$WORK/err" &
  local pid=$!
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:9971/healthz" && break
    sleep 0.1
  done
  local r; r="$("$LG" rate --proxy 127.0.0.1:3171 --concurrency 8 --seconds "$SECONDS_EACH" | field conn_per_sec)"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "$r"
}

declare -a O N
for i in $(seq 1 "$ROUNDS"); do
  O+=("$(run "$OLD" old)"); N+=("$(run "$NEW" new)")
  echo "round $i: old ${O[-1]} conn/s, new ${N[-1]} conn/s"
done
mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print(round(sum(v)/len(v)))" "$@"; }
echo "old mean $(mean "${O[@]}") conn/s; new mean $(mean "${N[@]}") conn/s (metered sandbox, state_dir)"
