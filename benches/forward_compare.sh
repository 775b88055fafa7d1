#!/usr/bin/env bash
# Forwarded plain HTTP (`GET http://origin/` through the proxy, absolute form) on loopback:
# hey (32 keep-alive clients) → direct / egress-proxy / Squid / tinyproxy → nginx, in
# interleaved rounds (every target once per round, so drift hits all alike); prints the
# median requests per second of each. OLD=path adds a previous egress-proxy build (A/B);
# G3PROXY=path adds g3proxy (its http_proxy server with a direct escaper). NEW=path measures that
# build instead of building target/release.
# Installs hey, nginx, squid and tinyproxy from the distribution if missing.
#
#   benches/forward_compare.sh      # RUNS=5 SECONDS_PER_RUN=4 CONCURRENCY=32
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
RUNS="${RUNS:-5}"; SECS="${SECONDS_PER_RUN:-4}"; CONC="${CONCURRENCY:-32}"
scratch

need=()
for t in hey nginx squid tinyproxy; do command -v "$t" >/dev/null || need+=("$t"); done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hey nginx-light squid tinyproxy >/dev/null
  # The packages start their services on the default ports: this script runs its own.
  for s in nginx squid tinyproxy; do service "$s" stop >/dev/null 2>&1 || true; done
fi
NEW="${NEW:-target/release/egress-proxy}"
[ "$NEW" != target/release/egress-proxy ] || cargo build --release >/dev/null 2>&1

ORIGIN=127.0.0.1:8088
squid_config "$WORK" 3129 > "$WORK/squid.conf"
tinyproxy_config "$WORK" 8899 > "$WORK/tinyproxy.conf"

nginx_origin "$ORIGIN"
egress_bench_config 3130 9930 > "$WORK/egress.yaml"
"$NEW" run --config "$WORK/egress.yaml" 2>"$WORK/egress.err" & PIDS+=($!)
squid -f "$WORK/squid.conf" -N >"$WORK/squid.out" 2>&1 & PIDS+=($!)
tinyproxy -d -c "$WORK/tinyproxy.conf" >"$WORK/tiny.out" 2>&1 & PIDS+=($!)
declare -A ADDR=( [direct]=direct [egress-proxy]=127.0.0.1:3130 [squid]=127.0.0.1:3129 [tinyproxy]=127.0.0.1:8899 )
ORDER=(direct egress-proxy squid tinyproxy)
if [ -n "${OLD:-}" ]; then
  egress_bench_config 3140 9940 > "$WORK/old.yaml"
  "$OLD" run --config "$WORK/old.yaml" 2>"$WORK/old.err" & PIDS+=($!)
  ADDR[egress-proxy-old]=127.0.0.1:3140; ORDER+=(egress-proxy-old)
fi
if [ -n "${G3PROXY:-}" ]; then
  g3proxy_config 3131 > "$WORK/g3proxy.yaml"
  "$G3PROXY" -c "$WORK/g3proxy.yaml" -C "$WORK" >"$WORK/g3.out" 2>&1 & PIDS+=($!)
  ADDR[g3proxy]=127.0.0.1:3131; ORDER+=(g3proxy)
fi
sleep 3

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A RPS
for _ in $(seq "$RUNS"); do
  for t in "${ORDER[@]}"; do
    proxy=(); [ "${ADDR[$t]}" = direct ] || proxy=(-x "http://${ADDR[$t]}")
    r="$(hey -z "${SECS}s" -c "$CONC" "${proxy[@]}" "http://$ORIGIN/" | awk '/Requests\/sec/ {print $2}')"
    RPS[$t]+="${r:-0} "
  done
done
echo
echo "| target | forwarded requests/s ($CONC keep-alive clients, medians of $RUNS × ${SECS}s) | vs Squid | runs |"
echo "|---|---|---|---|"
SQ="$(echo ${RPS[squid]} | tr ' ' '\n' | median)"
for t in "${ORDER[@]}"; do
  m="$(echo ${RPS[$t]} | tr ' ' '\n' | median)"
  echo "| $t | $m | $(python3 -c "print(f'{float($m)/float($SQ):.2f}×' if float($SQ) else '-')") | ${RPS[$t]}|"
done
echo
echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); hey, origin and proxies share it."
