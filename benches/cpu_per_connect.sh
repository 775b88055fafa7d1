#!/usr/bin/env bash
# CPU per CONNECT, user and kernel apart, of egress-proxy builds and g3proxy in one run:
# interleaved rounds of `loadgen rate` (32 concurrent CONNECT + 1-byte echo + close), each
# proxy's utime and stime over its round (/proc/PID/stat) divided by the connections it made.
#
#   G3PROXY=path benches/cpu_per_connect.sh [BINARY]...     # ROUNDS=5 SECONDS_PER_RUN=4
#   benches/cpu_per_connect.sh BIN BIN@threads=1              # the same build, listen.threads: 1
#   G3_WORKERS=1 G3PROXY=path benches/cpu_per_connect.sh ...  # g3proxy with one per-core worker
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
ROUNDS="${ROUNDS:-5}"; SECS="${SECONDS_PER_RUN:-4}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && BINS=(target/release/egress-proxy)
declare -A PORT PID
NAMES=()
start_proxies 3180 "${BINS[@]}"
HZ="$(getconf CLK_TCK)"
declare -A U S R
for round in $(seq "$ROUNDS"); do
  for n in "${NAMES[@]}"; do
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/${PID[$n]}/stat")
    out="$("$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 32 --seconds "$SECS")"
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/${PID[$n]}/stat")
    c="$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["connections"])')"
    r="$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["conn_per_sec"])')"
    U[$n]+=" $(python3 -c "print(round(($u1-$u0)*1e6/$HZ/$c,1))")"
    S[$n]+=" $(python3 -c "print(round(($s1-$s0)*1e6/$HZ/$c,1))")"
    R[$n]+=" $r"
  done
  echo "round $round: $(for n in "${NAMES[@]}"; do printf '%s rate%s user%s sys%s; ' "$n" "${R[$n]}" "${U[$n]}" "${S[$n]}"; done)" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| proxy | CONNECT/s (median) | user µs/CONNECT | kernel µs/CONNECT | total | rounds (total) |"
echo "|---|---|---|---|---|---|"
for n in "${NAMES[@]}"; do
  u="$(echo "${U[$n]}" | median)"; s="$(echo "${S[$n]}" | median)"
  tot="$(python3 -c "
u='${U[$n]}'.split(); s='${S[$n]}'.split()
t=sorted(float(a)+float(b) for a,b in zip(u,s)); print(t[(len(t)-1)//2], ' '.join(str(round(float(a)+float(b),1)) for a,b in zip(u,s)))")"
  echo "| $n | $(echo "${R[$n]}" | median) | $u | $s | ${tot%% *} | ${tot#* } |"
done
echo
echo "Machine: $(nproc) cores; loadgen, origin and every proxy share it. Rounds interleaved, ${SECS} s each."
