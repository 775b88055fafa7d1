#!/usr/bin/env bash
# What the tamper-evident audit trail costs: CONNECT rate (benches/loadgen.rs `rate`, 32
# concurrent CONNECT + 1-byte echo + close) through two egress-proxy instances that differ
# only in `audit.chain` (plus a signing key, checkpoints every 10,000 records), both writing
# their audit to a real file under TMPDIR. Interleaved A/B (both up at once, alternating runs)
# because whole runs on a shared 2-core machine drift by more than the effect measured.
#
#   benches/chain_ab.sh            # ROUNDS=6 SECONDS_PER_RUN=4
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
ROUNDS="${ROUNDS:-6}"; SECS="${SECONDS_PER_RUN:-4}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
openssl genpkey -algorithm ed25519 -out "$WORK/sk.pem" 2>/dev/null

egress_bench_config 3141 9941 "$WORK/audit-3141.jsonl" > "$WORK/off.yaml"
egress_bench_config 3142 9942 "$WORK/audit-3142.jsonl, chain: true, signing_key_file: $WORK/sk.pem, checkpoint_every_records: 10000" > "$WORK/on.yaml"
target/release/egress-proxy run --config "$WORK/off.yaml" 2>"$WORK/off.err" & PIDS+=($!)
target/release/egress-proxy run --config "$WORK/on.yaml" 2>"$WORK/on.err" & PIDS+=($!)
sleep 2
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
off=(); on=()
for i in $(seq "$ROUNDS"); do
  if (( i % 2 )); then order="3141 3142"; else order="3142 3141"; fi
  for port in $order; do
    r="$("$LG" rate --proxy 127.0.0.1:$port --concurrency 32 --seconds "$SECS" | field conn_per_sec)"
    if [ "$port" = 3141 ]; then off+=("$r"); else on+=("$r"); fi
  done
done
m_off="$(printf '%s\n' "${off[@]}" | median)"; m_on="$(printf '%s\n' "${on[@]}" | median)"
echo "chain off: ${off[*]} (median $m_off conn/s)"
echo "chain on:  ${on[*]} (median $m_on conn/s)"
python3 -c "a,b=float('$m_off'),float('$m_on'); print(f'chain on vs off: {100*(b-a)/a:+.1f} %')"
lines_on=$(wc -l < "$WORK/audit-3142.jsonl"); echo "records written with the chain: $lines_on"
target/release/egress-proxy audit verify "$WORK/audit-3142.jsonl" >/dev/null && echo "the chained log verifies"
