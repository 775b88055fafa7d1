#!/usr/bin/env bash
# The cost of attribution by observation (issue 64) on the connection rate: one build, two
# proxies side by side — `listen.attribution.observe` off and on — driven in interleaved
# rounds by `loadgen rate` (32 concurrent CONNECT + 1-byte echo + close; every connection
# is a new socket, so each is looked up: inet_diag, then the load generator's file table,
# tried first as the holder of recent connections) — and a third, `scoped`, whose sandbox has
# a `network.scoped` entry (the traffic does not need it), so every lookup searches every
# process for a second holder. Prints each round and, per proxy, the median rate and CPU
# (user + kernel) per CONNECT from /proc/PID/stat.
#
#   benches/attribution_ab.sh [BINARY]        # ROUNDS=5 SECONDS_PER_RUN=4; ~1 min
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
ROUNDS="${ROUNDS:-5}"; SECS="${SECONDS_PER_RUN:-4}"
BIN="${1:-${CARGO_TARGET_DIR:-target}/release/egress-proxy}"
scratch
LG="$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
declare -A PORT PID U S R
NAMES=(off on scoped)
egress_bench_config 3191 9991 > "$WORK/off.yaml"
egress_bench_config 3192 9992 \
  | sed 's|^listen: { proxy: 127.0.0.1:3192, admin: 127.0.0.1:9992 }|listen: { proxy: 127.0.0.1:3192, admin: 127.0.0.1:9992, attribution: { observe: true, lookups_per_second: 1000000 } }|' \
  > "$WORK/on.yaml"
grep -q 'observe: true' "$WORK/on.yaml"
sed -e 's/3192/3193/; s/9992/9993/' \
    -e 's|network: { egress: \["127.0.0.1/32:\*"\] }|network: { egress: ["127.0.0.1/32:*"], scoped: [{ binaries: [/usr/bin/git], egress: [github.com] }] }|' \
    "$WORK/on.yaml" > "$WORK/scoped.yaml"
grep -q 'scoped:' "$WORK/scoped.yaml"
for n in off on scoped; do
  "$BIN" run --config "$WORK/$n.yaml" 2>/dev/null & PIDS+=($!); PID[$n]=$!
done
PORT[off]=3191; PORT[on]=3192; PORT[scoped]=3193
sleep 2
HZ="$(getconf CLK_TCK)"
for round in $(seq "$ROUNDS"); do
  for n in "${NAMES[@]}"; do
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/${PID[$n]}/stat")
    out="$("$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 32 --seconds "$SECS")"
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/${PID[$n]}/stat")
    c="$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["connections"])')"
    R[$n]+=" $(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["conn_per_sec"])')"
    U[$n]+=" $(python3 -c "print(round(($u1-$u0)*1e6/$HZ/$c,1))")"
    S[$n]+=" $(python3 -c "print(round(($s1-$s0)*1e6/$HZ/$c,1))")"
  done
  echo "round $round: $(for n in "${NAMES[@]}"; do printf '%s rate%s user%s sys%s; ' "$n" "${R[$n]}" "${U[$n]}" "${S[$n]}"; done)" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| attribution | CONNECT/s (median) | user µs/CONNECT | kernel µs/CONNECT |"
echo "|---|---|---|---|"
for n in "${NAMES[@]}"; do
  echo "| $n | $(echo "${R[$n]}" | median) | $(echo "${U[$n]}" | median) | $(echo "${S[$n]}" | median) |"
done
