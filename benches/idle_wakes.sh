#!/usr/bin/env bash
# What an idle proxy costs: for each build (and g3proxy), a fresh process on the bench
# configuration, left alone for SECS seconds after a settling pause; then the times its
# threads were switched out (voluntary + involuntary, summed over /proc/PID/task/*/status,
# so every wake-up counts) and the CPU it used (utime + stime of /proc/PID/stat). ROUNDS
# alternate the builds. A sidecar proxy sits idle most of its life, beside every sandbox.
#
#   G3PROXY=path benches/idle_wakes.sh [BINARY]...     # SECS=10 ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
SECS="${SECS:-10}"; ROUNDS="${ROUNDS:-3}"
scratch
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && { cargo build --release --quiet --bin egress-proxy; BINS=(target/release/egress-proxy); }
[ -n "${G3PROXY:-}" ] && BINS+=(g3proxy)

switches() { # pid: context switches of all its threads so far
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches:/ {n += $2} END {print n + 0}'
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

declare -A WAKES CPU
for round in $(seq "$ROUNDS"); do
  for b in "${BINS[@]}"; do
    start_one "$b" 3190
    sleep 3
    s0=$(switches "$pid"); t0=$(ticks "$pid")
    sleep "$SECS"
    s1=$(switches "$pid"); t1=$(ticks "$pid")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    WAKES[$b]+=" $(( (s1 - s0) / SECS ))"
    CPU[$b]+=" $(awk -v t=$((t1 - t0)) -v hz="$HZ" -v s="$SECS" 'BEGIN {printf "%.2f", t * 1000 / hz / s}')"
    echo "round $round $b: $(( (s1 - s0) / SECS )) switches/s" >&2
    sleep 1
  done
done
echo "| build | thread switches per idle second, each round | CPU ms per idle second, each round |"
echo "|---|---|---|"
for b in "${BINS[@]}"; do echo "| $b |${WAKES[$b]} |${CPU[$b]} |"; done
