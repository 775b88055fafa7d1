#!/usr/bin/env bash
# Issue 67's budgets for the paths agents use now, each measured beside direct or a peer in the
# same run (benches/intercept.rs; 3 interleaved rounds per budget), then checked:
#
#   mcp        a terminated MCP `tools/call` judged by a `protocol: mcp` rule costs at most
#              1.15x the proxy CPU per request of the same POST under a path rule
#              (`intercept --mcp`, HTTP/1.1, 8 keep-alive connections);
#   h2         terminated HTTP/2 serves at least 1.0x the requests per second of terminated
#              HTTP/1.1 at the same concurrency (`intercept --protocols`: 8 connections, one
#              stream each);
#   latency    a terminated request, paced at $RATE requests/s over 8 connections, adds at
#              most 500 us at p50 and 2000 us at p99 to the same request sent direct
#              (`intercept --latency`); with G3PROXY set, the same request through g3proxy's
#              untouched CONNECT tunnel is printed beside ours (the hop without inspection).
#
# Prints one line per round and phase, then one verdict line per budget (`met` / `MISSED`);
# the exit status is 0 either way (a benchmark reports, it does not gate).
#
#   G3PROXY=path benches/budgets.sh          # SECONDS_PER_RUN=4 RATE=1000 BIN=target/release/egress-proxy
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
SECS="${SECONDS_PER_RUN:-4}"; RATE="${RATE:-1000}"
BIN="${BIN:-target/release/egress-proxy}"
scratch
cargo build --release >/dev/null 2>&1
cargo build --release --bench intercept >/dev/null 2>&1
IB="$(ls -t target/release/deps/intercept-* | grep -v '\.d$' | head -1)"
PEER=()
if [ -n "${G3PROXY:-}" ]; then
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  g3proxy_config "$port" > "$WORK/g3.yaml"
  "$G3PROXY" -c "$WORK/g3.yaml" -C "$WORK" >/dev/null 2>&1 & PIDS+=($!)
  PEER=(--peer "127.0.0.1:$port" --peer-pid "$!")
  sleep 2
fi
"$IB" --bin "$BIN" --connections 8 --seconds "$SECS" --mcp > "$WORK/mcp.json"
"$IB" --bin "$BIN" --connections 8 --seconds "$SECS" --protocols > "$WORK/h2.json"
"$IB" --bin "$BIN" --connections 8 --seconds "$SECS" --latency --rate "$RATE" "${PEER[@]}" > "$WORK/latency.json"
python3 - "$WORK" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def load(name):
    with open(f"{work}/{name}.json") as f:
        return json.load(f)
def rounds(d, phase, what):
    return [d[f"{phase}_round{r}_{what}"] for r in range(3) if f"{phase}_round{r}_{what}" in d]
def show(d, phases, whats):
    for r in range(3):
        for p in phases:
            vals = ", ".join(f"{w} {d[f'{p}_round{r}_{w}']}" for w in whats if f"{p}_round{r}_{w}" in d)
            if vals:
                print(f"round {r} {p}: {vals}")
def verdict(name, ok, text):
    print(f"budget {name}: {'met' if ok else 'MISSED'} ({text})")

mcp = load("mcp")
show(mcp, ["path.test", "mcp.test"], ["req_per_s", "proxy_cpu_us_per_req"])
ratio = statistics.median(a / b for a, b in zip(rounds(mcp, "mcp.test", "proxy_cpu_us_per_req"),
                                                  rounds(mcp, "path.test", "proxy_cpu_us_per_req")))
verdict("mcp", ratio <= 1.15, f"MCP rule / path rule proxy CPU per request, median of rounds: {ratio:.2f}x, budget <= 1.15x")

h2 = load("h2")
show(h2, ["terminated_h1", "terminated_h2"], ["req_per_s", "proxy_cpu_us_per_req"])
ratio = statistics.median(a / b for a, b in zip(rounds(h2, "terminated_h2", "req_per_s"),
                                                  rounds(h2, "terminated_h1", "req_per_s")))
verdict("h2", ratio >= 1.0, f"HTTP/2 / HTTP/1.1 requests per second, median of rounds: {ratio:.2f}x, budget >= 1.0x")

lat = load("latency")
show(lat, ["direct", "relayed", "terminated", "peer_relayed"], ["p50_us", "p99_us", "proxy_cpu_us_per_req"])
added = {q: statistics.median(t - d for t, d in zip(rounds(lat, "terminated", f"{q}_us"),
                                                    rounds(lat, "direct", f"{q}_us")))
         for q in ("p50", "p99")}
for q in ("p50", "p99"):
    for p in ("relayed", "peer_relayed"):
        if rounds(lat, p, f"{q}_us"):
            hop = statistics.median(t - d for t, d in zip(rounds(lat, p, f"{q}_us"), rounds(lat, "direct", f"{q}_us")))
            print(f"{p} adds {q} {hop:.0f} us (median of rounds)")
verdict("latency", added["p50"] <= 500 and added["p99"] <= 2000,
        f"terminated adds p50 {added['p50']:.0f} us, p99 {added['p99']:.0f} us over direct, median of rounds; budget 500 / 2000 us")
PY
