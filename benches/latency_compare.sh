#!/usr/bin/env bash
# CONNECT latency of egress-proxy beside g3proxy at the same paced load (a closed loop runs
# more connections through the faster proxy, which fattens its own tail on a shared machine):
# `loadgen latency --rate` with 8 concurrent tasks, interleaved rounds, and the proxy's CPU
# time per connection (utime + stime from /proc). Prints one line per run.
#
#   G3PROXY=path benches/latency_compare.sh        # RATE=4000 ROUNDS=5 SECONDS_PER_RUN=3
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
G3PROXY="${G3PROXY:?G3PROXY=path to a g3proxy binary}"
RATE="${RATE:-4000}"; ROUNDS="${ROUNDS:-5}"; SECS="${SECONDS_PER_RUN:-3}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
egress_bench_config 3130 9930 > "$WORK/egress.yaml"
g3proxy_config 3131 > "$WORK/g3proxy.yaml"
target/release/egress-proxy run --config "$WORK/egress.yaml" 2>/dev/null & PIDS+=($!); EP=$!
"$G3PROXY" -c "$WORK/g3proxy.yaml" -C "$WORK" >/dev/null 2>&1 & PIDS+=($!); GP=$!
sleep 2
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # clock ticks
tick="$(getconf CLK_TCK)"
for r in $(seq "$ROUNDS"); do
  for t in "egress-proxy $EP 127.0.0.1:3130" "g3proxy $GP 127.0.0.1:3131"; do
    set -- $t
    before="$(cpu "$2")"
    out="$("$LG" latency --proxy "$3" --concurrency 8 --seconds "$SECS" --rate "$RATE")"
    after="$(cpu "$2")"
    echo "$out" | python3 -c "
import json, sys
d = json.load(sys.stdin)
cpu = ($after - $before) / $tick * 1e6 / max(d['samples'], 1)
print(f\"round $r $1: p50 {d['p50_us']:.0f} us, p99 {d['p99_us']:.0f} us, {cpu:.0f} us CPU per connection, {d['samples']} connections\")"
  done
done
