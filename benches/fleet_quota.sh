#!/usr/bin/env bash
# What exact fleet quotas cost etcd (issue 94): three replicas of one release binary on one
# etcd, one sandbox with `requests_per_day: $QUOTA`, forwarded GETs spread evenly over the
# replicas (three `hey` at a third of the rate each) → nginx, at 1,000 and 10,000 requests/s
# for $SECONDS_PER_RUN seconds each. Reports, per rate: the requests/s reached, the writes to
# the sandbox's quota counter (the key's etcd `version`: every lease and give-back is one
# transaction that writes it), those per second, and every put etcd counted meanwhile
# (`etcd_mvcc_put_total`, the per-second usage reports included). Installs hey, nginx and
# etcd if missing.
#
#   benches/fleet_quota.sh [BINARY]     # QUOTA=1000000 SECONDS_PER_RUN=10 RATES="1000 10000"
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
BIN="${1:-target/release/egress-proxy}"
QUOTA="${QUOTA:-1000000}"; SECS="${SECONDS_PER_RUN:-10}"; RATES="${RATES:-1000 10000}"
scratch
command -v etcd >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null; }
nginx_origin 127.0.0.1:8091
ETCD=127.0.0.1:23791
etcd --data-dir "$WORK/etcd" --listen-client-urls "http://$ETCD" --advertise-client-urls "http://$ETCD" \
  --listen-peer-urls http://127.0.0.1:23801 --initial-advertise-peer-urls http://127.0.0.1:23801 \
  --initial-cluster default=http://127.0.0.1:23801 >"$WORK/etcd.log" 2>&1 & PIDS+=($!)
for _ in $(seq 50); do ETCDCTL_API=3 etcdctl --endpoints "$ETCD" endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
for i in 0 1 2; do
  egress_bench_config "$((3170 + i))" "$((9970 + i))" \
    | sed 's|^sandboxes:|dns: { hosts: { origin.test: [127.0.0.1] } }\ndefaults: { guard_allow_ranges: [127.0.0.1/32], limits: { max_connections: 100000, connections_per_second: 1000000, burst: 1000000 } }\ncontrol_plane: { etcd: { endpoints: ["'"$ETCD"'"], prefix: /bench/ } }\nsandboxes:|' \
    | grep -v '^defaults: { limits' \
    | sed "s|egress: \[\"127.0.0.1/32:\*\"\] }|egress: [\"origin.test:*\"] }|" \
    | sed "s|    sources: \[127.0.0.0/8\]|    sources: [127.0.0.0/8]\n    limits: { requests_per_day: $QUOTA }|" > "$WORK/r$i.yaml"
  "$BIN" run --config "$WORK/r$i.yaml" 2>"$WORK/r$i.err" & PIDS+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((9970 + i))/readyz" >/dev/null && break; sleep 0.1; done
done
puts() { curl -s "http://$ETCD/metrics" | awk '/^etcd_mvcc_put_total/ {print $2}'; }
version() {
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD" get --prefix /bench/quota/ -w json \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(int(k.get("version",0)) for k in d.get("kvs",[])))'
}
echo "| requests/s asked | reached | quota counter writes | per second | every etcd put per second | refused |"
echo "|---|---|---|---|---|---|"
for rate in $RATES; do
  v0="$(version)"; p0="$(puts)"
  per_worker=$(( rate / 3 / 30 )); [ "$per_worker" -lt 1 ] && per_worker=1
  for i in 0 1 2; do
    hey -z "${SECS}s" -c 30 -q "$per_worker" -x "http://127.0.0.1:$((3170 + i))" "http://origin.test:8091/" >"$WORK/hey$i.out" &
  done
  wait $(jobs -p | tail -3) 2>/dev/null || true
  sleep 1
  v1="$(version)"; p1="$(puts)"
  ok=0; bad=0; reached=0
  for i in 0 1 2; do
    o="$(awk '/\[200\]/ {print $2}' "$WORK/hey$i.out" | head -1)"
    b="$(awk '/\[429\]/ {print $2}' "$WORK/hey$i.out" | head -1)"
    ok=$((ok + ${o:-0})); bad=$((bad + ${b:-0}))
  done
  reached=$(awk -v n="$ok" -v s="$SECS" 'BEGIN { printf "%.0f", n / s }')
  echo "| $rate | $reached | $((v1 - v0)) | $(awk -v w="$((v1 - v0))" -v s="$SECS" 'BEGIN { printf "%.2f", w / s }') | $(awk -v w="$((p1 - p0))" -v s="$SECS" 'BEGIN { printf "%.1f", w / s }') | $bad |"
done
