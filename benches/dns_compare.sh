#!/usr/bin/env bash
# The DNS listener's budget (issue 15): queries per second and latency for an allowed name
# answered from the proxy's cache, for refused names (a fresh random name each time: the
# exfiltration path), side by side with the same load sent straight to dnsmasq (Debian's
# dnsmasq-base), which is also the proxy's upstream. Rounds are interleaved; medians are what
# the closing note reports.
#
#   benches/dns_compare.sh [ROUNDS] [SECONDS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"; SECS="${2:-5}"; CONC="${3:-32}"
command -v dnsmasq >/dev/null || { echo "needs dnsmasq (apt-get install dnsmasq-base)" >&2; exit 2; }
cargo build --release --quiet --bin egress-proxy
cargo bench --quiet --bench dnsload --no-run 2>/dev/null
LOAD=$(ls -t target/release/deps/dnsload-* | grep -v '\.d$' | head -1)
work=$(mktemp -d /dev/shm/egress-dns.XXXX)
cleanup() { kill "${DNSMASQ:-}" "${PROXY:-}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

UP=127.0.0.1:15353
dnsmasq --keep-in-foreground --no-resolv --no-hosts --port=15353 --listen-address=127.0.0.1 \
  --bind-interfaces --address=/allowed.bench/127.0.0.1 --address=/exfil.bench/127.0.0.2 \
  --cache-size=10000 --local-ttl=300 --pid-file="$work/dnsmasq.pid" --user=root 2>"$work/dnsmasq.log" &
DNSMASQ=$!
cat > "$work/proxy.yaml" <<YAML
listen: { proxy: 127.0.0.1:0, admin: 127.0.0.1:0, dns: 127.0.0.1:15354, default_sandbox: bench }
audit: { path: $work/audit.jsonl }
dns: { servers: ["$UP"], timeout_ms: 2000 }
defaults: { guard_allow_ranges: [127.0.0.0/8] }
sandboxes:
  - id: bench
    limits: { dns_queries_per_second: 1000000 }
    policy: { provider: local, config: {}, network: { egress: ["allowed.bench"] } }
YAML
target/release/egress-proxy run --config "$work/proxy.yaml" 2>"$work/proxy.log" &
PROXY=$!
sleep 1

run() { "$LOAD" --server "$1" --name "$2" ${3:+$3} --concurrency "$CONC" --seconds "$SECS"; }
for r in $(seq "$ROUNDS"); do
  echo "# round $r"
  run "$UP" allowed.bench
  run 127.0.0.1:15354 allowed.bench
  run "$UP" exfil.bench --random-prefix
  run 127.0.0.1:15354 exfil.bench --random-prefix
done
echo "# audit records written: $(wc -l < "$work/audit.jsonl")"
