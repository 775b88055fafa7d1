#!/usr/bin/env bash
# The CPU a flow rule adds to a forwarded request (issue 93: within 5 µs): one egress-proxy
# binary, two configurations side by side — the same sandbox without and with `network.flows`
# (a `private` label on the origin, armed by the first request, and a rule over it: every later
# request is judged with the label in force and re-arms nothing) — hey (32 keep-alive clients)
# → each → nginx, in interleaved rounds; each round reads the proxy's user+system CPU from
# /proc/PID/stat around the run and divides by the requests hey completed. Prints the medians
# of µs per request and requests/s. Installs hey and nginx if missing.
#
#   benches/flows_ab.sh [BINARY]     # ROUNDS=7 SECONDS_PER_RUN=4
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
BIN="${1:-target/release/egress-proxy}"
ROUNDS="${ROUNDS:-7}"; SECS="${SECONDS_PER_RUN:-4}"
scratch
ORIGIN=127.0.0.1:8089
nginx_origin "$ORIGIN"
config() { # proxy_port admin_port [flows]
  egress_bench_config "$1" "$2" \
    | sed 's|^sandboxes:|dns: { hosts: { origin.test: [127.0.0.1] } }\ndefaults: { guard_allow_ranges: [127.0.0.1/32], limits: { max_connections: 100000, connections_per_second: 1000000, burst: 1000000 } }\nsandboxes:|' \
    | grep -v '^defaults: { limits' \
    | sed "s|egress: \[\"127.0.0.1/32:\*\"\] }|egress: [\"origin.test:*\"]${3:+, flows: $3} }|"
}
FLOWS='{ labels: { private: [origin.test] }, rules: [{ name: no-exfil, after: [private], refuse: writes, except: [private] }] }'
config 3163 9963 > "$WORK/without.yaml"
config 3164 9964 "$FLOWS" > "$WORK/with.yaml"
"$BIN" run --config "$WORK/without.yaml" 2>"$WORK/without.err" & PIDS+=($!); WITHOUT_PID=$!
"$BIN" run --config "$WORK/with.yaml" 2>"$WORK/with.err" & PIDS+=($!); WITH_PID=$!
sleep 2
# The label is armed before the rounds (and the run fails here if the config is wrong).
curl -sf -x http://127.0.0.1:3164 http://origin.test:8089/ >/dev/null
curl -sf http://127.0.0.1:9964/v1/sandboxes/bench/flows | grep -q '"label":"private"'
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ="$(getconf CLK_TCK)"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A US RPS
for _ in $(seq "$ROUNDS"); do
  for b in without with; do
    if [ "$b" = without ]; then pid=$WITHOUT_PID; port=3163; else pid=$WITH_PID; port=3164; fi
    t0="$(ticks "$pid")"
    out="$(hey -z "${SECS}s" -c 32 -x "http://127.0.0.1:$port" "http://origin.test:8089/")"
    t1="$(ticks "$pid")"
    n="$(echo "$out" | awk '/\[200\]/ {print $2}')"
    r="$(echo "$out" | awk '/Requests\/sec/ {print $2}')"
    US[$b]+="$(awk -v t="$((t1 - t0))" -v hz="$HZ" -v n="${n:-0}" 'BEGIN { printf "%.2f", t / hz * 1e6 / (n > 0 ? n : 1) }') "
    RPS[$b]+="${r:-0} "
  done
done
echo "| flow rules | µs of proxy CPU per forwarded request (median of $ROUNDS) | requests/s | rounds (µs) |"
echo "|---|---|---|---|"
for b in without with; do
  echo "| $b | $(echo ${US[$b]} | tr ' ' '\n' | median) | $(echo ${RPS[$b]} | tr ' ' '\n' | median) | ${US[$b]}|"
done
