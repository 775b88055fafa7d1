#!/usr/bin/env bash
# Where a saturated DNS server's CPU goes: user space and kernel apart, µs per query, for an
# egress-proxy build and unbound under the same dnsperf flood (4 clients, 100 outstanding
# each), rounds interleaved; utime and stime of all the server's threads from /proc, and its
# context switches per query. dns_compare.sh gives the sum; this says which side of the
# system call boundary a difference is on (the kernel's share is the sending and receiving
# of datagrams, the same work for both servers per datagram, less per query when batched).
#
#   benches/dns_cpu_split.sh [BINARY] [denied|allowed] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
for t in dnsperf unbound dnsmasq dig; do
  command -v "$t" >/dev/null || { echo "needs $t (apt-get install dnsperf unbound dnsmasq-base dnsutils)" >&2; exit 2; }
done
BIN="${1:-}"; KIND="${2:-denied}"; SECS="${3:-6}"; ROUNDS="${4:-3}"
if [ -z "$BIN" ]; then
  cargo build --release --quiet --bin egress-proxy
  BIN=target/release/egress-proxy
fi
source benches/dns_common.sh
start_upstream
proxy_config 15364 > "$WORK/proxy.yaml"
query_files
"$BIN" run --config "$WORK/proxy.yaml" 2>"$WORK/proxy.log" &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
start_unbound 15365
for port in 15364 15365; do
  for _ in $(seq 60); do
    dig +short +time=1 +tries=1 -p "$port" @127.0.0.1 allowed.bench >/dev/null 2>&1 && break
    sleep 0.5
  done
done

HZ="$(getconf CLK_TCK)"
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}'; }
measure() { # name pid port
  local u0 s0 u1 s1 c0 c1 q
  dnsperf -s 127.0.0.1 -p "$3" -d "$WORK/$KIND.txt" -l 2 -c 4 -q 100 >/dev/null 2>&1
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$2/stat"); c0="$(switches "$2")"
  q="$(dnsperf -s 127.0.0.1 -p "$3" -d "$WORK/$KIND.txt" -l "$SECS" -c 4 -q 100 2>&1 | awk '/Queries completed/ {print $3}')"
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$2/stat"); c1="$(switches "$2")"
  python3 -c "
q, hz = $q, $HZ
user, sys = ($u1 - $u0) / hz * 1e6 / q, ($s1 - $s0) / hz * 1e6 / q
print(f'| $1 | {q / $SECS:,.0f} | {user:.2f} | {sys:.2f} | {user + sys:.2f} | {($c1 - $c0) / q:.3f} |')"
}
echo "| server ($KIND) | queries/s | user µs/q | kernel µs/q | total | switches/q |"
echo "|---|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
  measure egress-proxy "$PROXY_PID" 15364
  measure unbound "$UNBOUND_PID" 15365
done
