#!/usr/bin/env bash
# The DNS listener side by side with unbound and dnsmasq (Debian packages), measured with
# dnsperf (Debian's dnsperf): queries per second for an allowed name answered from cache,
# for refused names (a fresh random name each query: the exfiltration path), and the p50/p99
# latency of allowed names at a fixed 5,000 QPS. Every server has the same upstream (a
# dnsmasq on loopback that knows allowed.bench and exfil.bench) and the same policy: unbound
# forwards everything to it and refuses exfil.bench with a local zone (its equivalent of a
# deny rule); dnsmasq is measured as that upstream itself. OLD=path adds an older
# egress-proxy build. Rounds are interleaved; the closing note reports medians. Beside each
# rate, the server's own CPU per query (user + system, from /proc, all its threads): on two
# shared cores the rate also depends on how much CPU dnsperf gets, the CPU per query does not.
#
#   benches/dns_compare.sh [ROUNDS] [SECONDS]        # OLD=/tmp/base-target/release/egress-proxy
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"; SECS="${2:-5}"
for t in dnsperf unbound dnsmasq; do
  command -v "$t" >/dev/null || { echo "needs $t (apt-get install dnsperf unbound dnsmasq-base)" >&2; exit 2; }
done
cargo build --release --quiet --bin egress-proxy

source benches/dns_common.sh
start_upstream
declare -A PID
PID[dnsmasq]=$UPSTREAM_PID

start_unbound 15355
PID[unbound]=$UNBOUND_PID

proxy_config 15354 > "$WORK/new.yaml"
target/release/egress-proxy run --config "$WORK/new.yaml" 2>"$WORK/new.log" &
PIDS+=($!)
PID[egress-proxy]=$!
SERVERS="dnsmasq=$UP unbound=15355 egress-proxy=15354"
if [ -n "${OLD:-}" ]; then
  proxy_config 15356 > "$WORK/old.yaml"
  "$OLD" run --config "$WORK/old.yaml" 2>"$WORK/old.log" &
  PIDS+=($!)
  PID[egress-proxy-old]=$!
  SERVERS="$SERVERS egress-proxy-old=15356"
fi
sleep 1.5

query_files
# Warm every cache.
for s in $SERVERS; do dig +short -p "${s#*=}" @127.0.0.1 allowed.bench >/dev/null; done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
qps() { # name port file: "QPS/us-of-server-CPU-per-query"
  local before out after
  before=$(ticks "${PID[$1]}")
  out=$(dnsperf -s 127.0.0.1 -p "$2" -d "$3" -l "$SECS" -c 8 -q 200 -T 2 2>&1)
  after=$(ticks "${PID[$1]}")
  echo "$out" | awk -v t=$((after - before)) -v hz="$HZ" '
    /Queries completed/ {n = $3} /Queries per second/ {q = int($4)}
    END {printf "%d/%.2f", q, n ? t * 1000000 / hz / n : 0}'
}
latency() { # port: p50 and p99 in microseconds at 5,000 QPS
  dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/allowed.txt" -l "$SECS" -Q 5000 -c 4 -v 2>/dev/null \
    | awk '$1 == ">" && $2 == "NOERROR" {print $NF * 1000000}' | sort -n \
    | awk '{a[NR]=$1} END {if (NR) printf "%d/%d\n", a[int(NR*0.5)], a[int(NR*0.99)]; else print "-"}'
}
declare -A ALLOWED DENIED LAT
for r in $(seq "$ROUNDS"); do
  for s in $SERVERS; do
    name=${s%%=*}; port=${s#*=}
    ALLOWED[$name]+="$(qps "$name" "$port" "$WORK/allowed.txt") "
    DENIED[$name]+="$(qps "$name" "$port" "$WORK/denied.txt") "
    LAT[$name]+="$(latency "$port") "
  done
  echo "# round $r done" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The medians of the rates and, separately, of the CPU per query.
medians() { local v; v=$(cat); echo "$(echo "$v" | tr ' ' '\n' | cut -d/ -f1 | median)/$(echo "$v" | tr ' ' '\n' | cut -s -d/ -f2 | median)"; }
printf '%-18s %14s %14s %24s\n' server "allowed QPS/us" "denied QPS/us" "p50/p99 us @5k QPS"
for s in $SERVERS; do
  name=${s%%=*}
  printf '%-18s %14s %14s %24s   (allowed: %s| denied: %s| latency: %s)\n' "$name" \
    "$(echo "${ALLOWED[$name]}" | medians)" "$(echo "${DENIED[$name]}" | medians)" \
    "$(echo "${LAT[$name]}" | tr ' ' '\n' | grep -v '^$' | sort -t/ -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')" \
    "${ALLOWED[$name]}" "${DENIED[$name]}" "${LAT[$name]}"
done
