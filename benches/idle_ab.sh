#!/usr/bin/env bash
# Idle memory per tunnel of egress-proxy builds (and g3proxy) in one run: for each, a fresh
# process, then `loadgen idle` opens N tunnels (each proven with an echo) and reports the
# proxy's RSS growth divided by N. ROUNDS alternate the builds (a fresh process each time).
#
#   G3PROXY=path benches/idle_ab.sh [BINARY]...     # TUNNELS=8000 ROUNDS=2
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
TUNNELS="${TUNNELS:-8000}"; ROUNDS="${ROUNDS:-2}"
scratch
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && BINS=(target/release/egress-proxy)
[ -n "${G3PROXY:-}" ] && BINS+=(g3proxy)
"$LG" origin >"$WORK/origin.out" & PIDS+=($!); sleep 1
ORIGIN="$(python3 -c "import json; print(json.load(open('$WORK/origin.out'))['origin'])")"
declare -A KIB
for round in $(seq "$ROUNDS"); do
  for b in "${BINS[@]}"; do
    start_one "$b" 3190
    sleep 2
    out="$(timeout 300 "$LG" idle --proxy 127.0.0.1:3190 --tunnels "$TUNNELS" --pid "$pid" --origin "$ORIGIN" || echo '{"kib_per_tunnel":null}')"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    KIB[$b]+=" $(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kib_per_tunnel"])')"
    echo "round $round $b: $out" >&2
    sleep 1
  done
done
echo "| build | KiB per idle tunnel ($TUNNELS tunnels), each round |"
echo "|---|---|"
for b in "${BINS[@]}"; do echo "| $b |${KIB[$b]} |"; done
