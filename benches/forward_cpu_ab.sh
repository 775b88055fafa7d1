#!/usr/bin/env bash
# CPU per forwarded plain-HTTP request, two egress-proxy builds side by side (issue 89): hey (32
# keep-alive clients) → each build → nginx, in interleaved rounds; each round reads the proxy's
# user+system CPU from /proc/PID/stat around the run and divides by the requests hey completed.
# Prints the medians of µs per request and requests/s. Installs hey and nginx if missing.
#
#   benches/forward_cpu_ab.sh OLD_BINARY [NEW_BINARY]     # ROUNDS=7 SECONDS_PER_RUN=4
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
OLD="${1:?usage: benches/forward_cpu_ab.sh OLD_BINARY [NEW_BINARY]}"
NEW="${2:-target/release/egress-proxy}"
ROUNDS="${ROUNDS:-7}"; SECS="${SECONDS_PER_RUN:-4}"
scratch
ORIGIN=127.0.0.1:8089
nginx_origin "$ORIGIN"
egress_bench_config 3161 9961 > "$WORK/old.yaml"
egress_bench_config 3162 9962 > "$WORK/new.yaml"
"$OLD" run --config "$WORK/old.yaml" 2>"$WORK/old.err" & PIDS+=($!); OLD_PID=$!
"$NEW" run --config "$WORK/new.yaml" 2>"$WORK/new.err" & PIDS+=($!); NEW_PID=$!
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ="$(getconf CLK_TCK)"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A US RPS
for _ in $(seq "$ROUNDS"); do
  for b in old new; do
    if [ "$b" = old ]; then pid=$OLD_PID; port=3161; else pid=$NEW_PID; port=3162; fi
    t0="$(ticks "$pid")"
    out="$(hey -z "${SECS}s" -c 32 -x "http://127.0.0.1:$port" "http://$ORIGIN/")"
    t1="$(ticks "$pid")"
    n="$(echo "$out" | awk '/\[200\]/ {print $2}')"
    r="$(echo "$out" | awk '/Requests\/sec/ {print $2}')"
    US[$b]+="$(awk -v t="$((t1 - t0))" -v hz="$HZ" -v n="${n:-0}" 'BEGIN { printf "%.2f", t / hz * 1e6 / (n > 0 ? n : 1) }') "
    RPS[$b]+="${r:-0} "
  done
done
echo "| build | µs of proxy CPU per forwarded request (median of $ROUNDS) | requests/s | rounds (µs) |"
echo "|---|---|---|---|"
for b in old new; do
  echo "| $b | $(echo ${US[$b]} | tr ' ' '\n' | median) | $(echo ${RPS[$b]} | tr ' ' '\n' | median) | ${US[$b]}|"
done
