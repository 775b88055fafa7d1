#!/usr/bin/env bash
# Forwarded plain HTTP (`GET http://origin/` through the proxy, absolute form) on loopback:
# hey (32 keep-alive clients) → direct / egress-proxy / Squid / tinyproxy → nginx, in
# interleaved rounds (every target once per round, so drift hits all alike); prints the
# median requests per second of each. OLD=path adds a previous egress-proxy build (A/B);
# G3PROXY=path adds g3proxy (its http_proxy server with a direct escaper).
# Installs hey, nginx, squid and tinyproxy from the distribution if missing.
#
#   benches/forward_compare.sh      # RUNS=5 SECONDS_PER_RUN=4 CONCURRENCY=32
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"; SECS="${SECONDS_PER_RUN:-4}"; CONC="${CONCURRENCY:-32}"
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

need=()
for t in hey nginx squid tinyproxy; do command -v "$t" >/dev/null || need+=("$t"); done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hey nginx-light squid tinyproxy >/dev/null
  # The packages start their services on the default ports: this script runs its own.
  for s in nginx squid tinyproxy; do service "$s" stop >/dev/null 2>&1 || true; done
fi
cargo build --release >/dev/null 2>&1

ORIGIN=127.0.0.1:8088
cat > "$WORK/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen $ORIGIN; location / { return 200 "hello from the origin\n"; } }
}
CONF
egress_config() { # proxy_port admin_port
  cat <<YAML
listen: { proxy: 127.0.0.1:$1, admin: 127.0.0.1:$2 }
audit: { path: /dev/null }
max_connections: 100000
admission: { unidentified_per_source: 100000, unidentified_total: 100000, accepts_per_second_per_source: 1000000, accept_burst_per_source: 1000000 }
defaults: { limits: { max_connections: 100000, connections_per_second: 1000000, burst: 1000000 } }
sandboxes:
  - id: bench
    sources: [127.0.0.0/8]
    policy: { provider: local, config: {}, network: { egress: ["127.0.0.1/32:*"] } }
YAML
}
mkdir -p "$WORK/squid"; chown proxy:proxy "$WORK/squid" 2>/dev/null || true
cat > "$WORK/squid.conf" <<CONF
http_port 127.0.0.1:3129
acl localnet src 127.0.0.0/8
http_access allow localnet
http_access deny all
cache deny all
cache_mem 8 MB
access_log none
cache_store_log none
cache_log /dev/null
pid_filename $WORK/squid/squid.pid
coredump_dir $WORK/squid
max_filedescriptors 20000
workers 1
shutdown_lifetime 1 seconds
CONF
cat > "$WORK/tinyproxy.conf" <<CONF
Port 8899
Listen 127.0.0.1
Timeout 600
MaxClients 20000
LogLevel Critical
PidFile "$WORK/tinyproxy.pid"
Allow 127.0.0.1
DisableViaHeader Yes
CONF

nginx -p "$WORK" -c "$WORK/nginx.conf" & PIDS+=($!)
egress_config 3130 9930 > "$WORK/egress.yaml"
target/release/egress-proxy run --config "$WORK/egress.yaml" 2>"$WORK/egress.err" & PIDS+=($!)
squid -f "$WORK/squid.conf" -N >"$WORK/squid.out" 2>&1 & PIDS+=($!)
tinyproxy -d -c "$WORK/tinyproxy.conf" >"$WORK/tiny.out" 2>&1 & PIDS+=($!)
declare -A ADDR=( [direct]=direct [egress-proxy]=127.0.0.1:3130 [squid]=127.0.0.1:3129 [tinyproxy]=127.0.0.1:8899 )
ORDER=(direct egress-proxy squid tinyproxy)
if [ -n "${OLD:-}" ]; then
  egress_config 3140 9940 > "$WORK/old.yaml"
  "$OLD" run --config "$WORK/old.yaml" 2>"$WORK/old.err" & PIDS+=($!)
  ADDR[egress-proxy-old]=127.0.0.1:3140; ORDER+=(egress-proxy-old)
fi
if [ -n "${G3PROXY:-}" ]; then
  # Not run on the machine this was written on (no g3proxy binary there).
  cat > "$WORK/g3proxy.yaml" <<YAML
runtime: { thread_number: 2 }
resolver:
  - { name: default, type: c-ares, server: 127.0.0.1 }
escaper:
  - { name: default, type: direct_fixed, resolver: default, egress_net_filter: { default: allow, allow: 127.0.0.1 } }
server:
  - { name: http, type: http_proxy, escaper: default, listen: "127.0.0.1:3131" }
YAML
  "$G3PROXY" -c "$WORK/g3proxy.yaml" >"$WORK/g3.out" 2>&1 & PIDS+=($!)
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
