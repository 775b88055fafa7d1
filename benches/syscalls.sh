#!/usr/bin/env bash
# System calls per CONNECT: `strace -c -f` attached to each proxy over one `loadgen rate`
# run (8 concurrent CONNECT + 1-byte echo + close), divided by the connections the run made.
# Prints one Markdown table, a column per proxy. Tracing slows the proxy: read the counts, not
# the rate.
#
#   benches/syscalls.sh [BINARY]...        # egress-proxy builds (default: target/release)
#   G3PROXY=path benches/syscalls.sh       # and g3proxy
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
SECS="${SECONDS_PER_RUN:-3}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && BINS=(target/release/egress-proxy)
declare -A PORT PID
NAMES=()
start_proxies 3170 "${BINS[@]}"
declare -A CONNS
for n in "${NAMES[@]}"; do
  "$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 8 --seconds 1 >/dev/null   # warm
  strace -c -f -q -p "${PID[$n]}" -o "$WORK/$n.strace" & st=$!
  sleep 1
  out="$("$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 8 --seconds "$SECS")"
  CONNS[$n]="$(python3 -c "import json; d=json.loads('''$out'''); print(d.get('connections') or round(d['conn_per_sec']*$SECS))")"
  sleep 1; kill -INT "$st"; wait "$st" 2>/dev/null || true
done
python3 - "$WORK" "${NAMES[@]}" <<PY
import sys, re, collections
work, names = sys.argv[1], sys.argv[2:]
conns = {$(for n in "${NAMES[@]}"; do printf '"%s": %s, ' "$n" "${CONNS[$n]}"; done)}
calls = {}
for n in names:
    c = collections.Counter()
    for line in open(f"{work}/{n}.strace"):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            c[f[-1]] += int(f[3])
    calls[n] = c
rows = sorted({k for c in calls.values() for k in c}, key=lambda k: -max(calls[n][k] / conns[n] for n in names))
print("| per CONNECT | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for k in rows:
    vals = [calls[n][k] / conns[n] for n in names]
    if max(vals) < 0.05:
        continue
    print(f"| \`{k}\` | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
print("| **total** | " + " | ".join(f"**{sum(calls[n].values()) / conns[n]:.1f}**" for n in names) + " |")
print("| connections traced | " + " | ".join(str(conns[n]) for n in names) + " |")
PY
