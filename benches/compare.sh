#!/usr/bin/env bash
# Compare egress-proxy with direct connections, Squid and tinyproxy on loopback, with one load
# generator (benches/loadgen.rs), in one run, and print a Markdown table (medians of RUNS
# interleaved rounds: every target once per round).
# Installs squid and tinyproxy from the distribution if missing; stops everything it starts.
# G3PROXY=path adds g3proxy (its http_proxy server, a direct escaper) to the CONNECT table;
# then the forwarding comparison (benches/forward_compare.sh) and, with dnsmasq installed, the
# DNS one (benches/dns_compare.sh) run too (SKIP_EXTRA=1 leaves them out).
#
#   benches/compare.sh            # RUNS=3 SECONDS_PER_RUN=5 IDLE_TUNNELS=9000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
RUNS="${RUNS:-3}"; SECS="${SECONDS_PER_RUN:-5}"; IDLE="${IDLE_TUNNELS:-9000}"
scratch

if ! command -v squid >/dev/null || ! command -v tinyproxy >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squid tinyproxy >/dev/null
fi
cargo build --release --bench loadgen >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"

egress_bench_config 3130 9930 > "$WORK/egress.yaml"
squid_config "$WORK" 3129 > "$WORK/squid.conf"
tinyproxy_config "$WORK" 8899 > "$WORK/tinyproxy.conf"

target/release/egress-proxy run --config "$WORK/egress.yaml" 2>"$WORK/egress.err" & PIDS+=($!); EGRESS_PID=$!
squid -f "$WORK/squid.conf" -N >"$WORK/squid.out" 2>&1 & PIDS+=($!)
tinyproxy -d -c "$WORK/tinyproxy.conf" >"$WORK/tiny.out" 2>&1 & PIDS+=($!); TINY_PID=$!
sleep 3
SQUID_PID="$(pgrep -n -x squid || true)"

declare -A ADDR=( [direct]=direct [egress-proxy]=127.0.0.1:3130 [squid]=127.0.0.1:3129 [tinyproxy]=127.0.0.1:8899 )
ORDER=(direct egress-proxy squid tinyproxy)
if [ -n "${G3PROXY:-}" ]; then
  g3proxy_config 3131 > "$WORK/g3proxy.yaml"
  "$G3PROXY" -c "$WORK/g3proxy.yaml" -C "$WORK" >"$WORK/g3.out" 2>&1 & PIDS+=($!); G3_PID=$!
  sleep 1
  ADDR[g3proxy]=127.0.0.1:3131; ORDER+=(g3proxy)
fi
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

declare -A RATE RATE_TLS BULK P50 P99 R H B PACED
# Interleaved: every target once per round, so the machine's drift hits all alike.
for round in $(seq "$RUNS"); do
  for t in "${ORDER[@]}"; do
    R[$t]+=" $("$LG" rate --proxy "${ADDR[$t]}" --concurrency 32 --seconds "$SECS" | field conn_per_sec)"
    # TLS-shaped: each tunnel starts with a real ClientHello (egress-proxy parses it).
    H[$t]+=" $("$LG" rate --hello --proxy "${ADDR[$t]}" --concurrency 32 --seconds "$SECS" | field conn_per_sec)"
    B[$t]+=" $("$LG" bulk --proxy "${ADDR[$t]}" --tunnels 4 --seconds "$SECS" | field gbit_per_sec)"
  done
  echo "round $round: $(for t in "${ORDER[@]}"; do printf '%s rate%s bulk%s; ' "$t" "${R[$t]}" "${B[$t]}"; done)" >&2
done
for t in "${ORDER[@]}"; do
  RATE[$t]="$(printf '%s\n' ${R[$t]} | median)"; RATE_TLS[$t]="$(printf '%s\n' ${H[$t]} | median)"; BULK[$t]="$(printf '%s\n' ${B[$t]} | median)"
  lat="$("$LG" latency --proxy "${ADDR[$t]}" --concurrency 8 --seconds "$SECS")"
  P50[$t]="$(echo "$lat" | field p50_us)"; P99[$t]="$(echo "$lat" | field p99_us)"
  # The same load for every target: a closed loop runs more connections through a faster one.
  paced="$("$LG" latency --proxy "${ADDR[$t]}" --concurrency 8 --seconds "$SECS" --rate "${LAT_RATE:-4000}")"
  PACED[$t]="$(echo "$paced" | field p50_us) / $(echo "$paced" | field p99_us)"
done

# Idle tunnels: RSS growth per tunnel (origin in its own process: descriptor limits).
"$LG" origin >"$WORK/origin.out" & PIDS+=($!); sleep 1
ORIGIN="$(field origin <"$WORK/origin.out")"
declare -A IDLE_KIB
IDLE_ORDER=(egress-proxy squid tinyproxy); [ -n "${G3PROXY:-}" ] && IDLE_ORDER+=(g3proxy)
for t in "${IDLE_ORDER[@]}"; do
  case $t in egress-proxy) pid=$EGRESS_PID ;; squid) pid=$SQUID_PID ;; tinyproxy) pid=$TINY_PID ;; g3proxy) pid=$G3_PID ;; esac
  out="$(timeout 180 "$LG" idle --proxy "${ADDR[$t]}" --tunnels "$IDLE" --pid "$pid" --origin "$ORIGIN" || echo '{"kib_per_tunnel":null}')"
  IDLE_KIB[$t]="$(echo "$out" | field kib_per_tunnel)"
  echo "idle $t: $out" >&2
done

ratio() { python3 -c "a,b=float('$1'),float('$2'); print(f'{a/b:.2f}×' if b else '-')"; }
echo
echo "| target | CONNECT rate (conn/s) | with a ClientHello | vs Squid | bulk (Gbit/s, 4 tunnels) | vs Squid | vs direct | p50 / p99 CONNECT→first byte (µs) | the same at ${LAT_RATE:-4000} conn/s | idle RSS per tunnel (KiB, $IDLE tunnels) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for t in "${ORDER[@]}"; do
  echo "| $t | ${RATE[$t]} | ${RATE_TLS[$t]} | $(ratio "${RATE[$t]}" "${RATE[squid]}") | ${BULK[$t]} | $(ratio "${BULK[$t]}" "${BULK[squid]}") | $(ratio "${BULK[$t]}" "${BULK[direct]}") | ${P50[$t]} / ${P99[$t]} | ${PACED[$t]} | ${IDLE_KIB[$t]:--} |"
done
echo
echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); loadgen, origin and proxy share it. Medians of $RUNS runs of ${SECS}s."

if [ -z "${SKIP_EXTRA:-}" ]; then
  cleanup; PIDS=(); WORK="$(mktemp -d)"
  echo; echo "## Forwarded plain HTTP"
  benches/forward_compare.sh
  if command -v dnsmasq >/dev/null; then
    echo; echo "## DNS listener"
    benches/dns_compare.sh
  else
    echo "(DNS comparison skipped: apt-get install dnsmasq-base)"
  fi
fi
