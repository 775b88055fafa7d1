#!/usr/bin/env bash
# Interleaved A/B of two egress-proxy builds on the same load: CONNECT rate (benches/loadgen.rs
# `rate`: 32 concurrent CONNECT + 1-byte echo + close), bulk throughput (`bulk`: 4 tunnels),
# and the cost of one CONNECT (instructions from perf stat where the machine exposes them —
# the stable number on a noisy shared machine, ../shared/perf-notes.md — else CPU time).
# Both builds are up at once and run alternately, so drift hits both alike.
#
#   git worktree add /tmp/base <rev> && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release)
#   benches/build_ab.sh /tmp/base-target/release/egress-proxy      # ROUNDS=4 SECONDS_PER_RUN=3
#   benches/build_ab.sh BIN BIN@threads=1                           # listen.threads: 1 against 0
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
OLD="${1:?usage: benches/build_ab.sh OLD_BINARY [NEW_BINARY]}"
NEW="${2:-target/release/egress-proxy}"
ROUNDS="${ROUNDS:-4}"; SECS="${SECONDS_PER_RUN:-3}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"

egress_bench_config 3151 9951 > "$WORK/old.yaml"
egress_bench_config 3152 9952 > "$WORK/new.yaml"
# BINARY@threads=N: that build with `listen.threads: N`.
for side in old new; do
  b="$([ $side = old ] && echo "$OLD" || echo "$NEW")"
  case "$b" in *@threads=*)
    sed -i "s/^listen: { /listen: { threads: ${b##*@threads=}, /" "$WORK/$side.yaml"
    if [ $side = old ]; then OLD="${b%@threads=*}"; else NEW="${b%@threads=*}"; fi;;
  esac
done
"$OLD" run --config "$WORK/old.yaml" 2>"$WORK/old.err" & PIDS+=($!); OLD_PID=$!
"$NEW" run --config "$WORK/new.yaml" 2>"$WORK/new.err" & PIDS+=($!); NEW_PID=$!
sleep 2
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Cost per CONNECT of the proxy on port $1 (process $2), 8 concurrent: instructions (user,
# kernel) where perf can read the counters, else CPU microseconds (user, system) from
# /proc/PID/stat — coarser, but the same for both builds.
if perf stat -x, -e instructions:u true 2>&1 | grep -q 'not supported'; then UNIT="CPU us"; else UNIT="instructions"; fi
cost() {
  local rate
  if [ "$UNIT" = instructions ]; then
    perf stat -x, -e instructions:u,instructions:k -p "$2" -o "$WORK/perf" -- sleep "$((SECS + 1))" &
    local perf_pid=$!
    sleep 0.3
    rate="$("$LG" rate --proxy "127.0.0.1:$1" --concurrency 8 --seconds "$SECS" | field conn_per_sec)"
    wait "$perf_pid"
    python3 - "$WORK/perf" "$rate" "$SECS" <<'PY'
import sys
rows = [l.split(',') for l in open(sys.argv[1]) if l.strip() and not l.startswith('#')]
n = float(sys.argv[2]) * float(sys.argv[3])
u = next(float(r[0]) for r in rows if r[2].startswith('instructions:u'))
k = next(float(r[0]) for r in rows if r[2].startswith('instructions:k'))
print(f"{u / n:.0f} {k / n:.0f}")
PY
  else
    local before; before="$(cut -d' ' -f14,15 "/proc/$2/stat")"
    rate="$("$LG" rate --proxy "127.0.0.1:$1" --concurrency 8 --seconds "$SECS" | field conn_per_sec)"
    local after; after="$(cut -d' ' -f14,15 "/proc/$2/stat")"
    python3 - "$before" "$after" "$rate" "$SECS" "$(getconf CLK_TCK)" <<'PY'
import sys
(u0, s0), (u1, s1) = (map(int, a.split()) for a in sys.argv[1:3])
n = float(sys.argv[3]) * float(sys.argv[4]); tick = 1e6 / int(sys.argv[5])
print(f"{(u1 - u0) * tick / n:.1f} {(s1 - s0) * tick / n:.1f}")
PY
  fi
}
declare -A rate bulk insn_u insn_k
for i in $(seq "$ROUNDS"); do
  if (( i % 2 )); then order="old new"; else order="new old"; fi
  for which in $order; do
    if [ "$which" = old ]; then port=3151; pid=$OLD_PID; else port=3152; pid=$NEW_PID; fi
    rate[$which]+="$("$LG" rate --proxy 127.0.0.1:$port --concurrency 32 --seconds "$SECS" | field conn_per_sec) "
    bulk[$which]+="$("$LG" bulk --proxy 127.0.0.1:$port --tunnels 4 --seconds "$SECS" | field gbit_per_sec) "
    read -r u k < <(cost "$port" "$pid")
    insn_u[$which]+="$u "; insn_k[$which]+="$k "
  done
done
for which in old new; do
  echo "$which: CONNECT/s ${rate[$which]}(median $(echo ${rate[$which]} | tr ' ' '\n' | median))" \
    "| bulk Gbit/s ${bulk[$which]}(median $(echo ${bulk[$which]} | tr ' ' '\n' | median))" \
    "| $UNIT per CONNECT: user ${insn_u[$which]}kernel ${insn_k[$which]}"
done
