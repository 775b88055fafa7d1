#!/usr/bin/env bash
# Instructions per CONNECT of two egress-proxy builds, counted by callgrind (repeatable on a
# noisy shared machine: ../shared/perf-notes.md). Each build runs under
# `valgrind --tool=callgrind` twice, driven by `loadgen rate` (8 concurrent CONNECT + 1-byte
# echo + close) for a short and a long run; the instructions per CONNECT are the difference of
# the two totals over the difference of the connections made, so start-up and shutdown cancel
# out. User-space instructions only (callgrind sees no kernel work). With G3PROXY=path, g3proxy
# (peers.sh's configuration) is counted the same way after the two builds.
#
# Callgrind counts each byte a `rep stosb`/`rep movsb` moves as an instruction (glibc's memset
# and memcpy use them above about 2 KiB): a large zeroing or copy weighs far more here than
# on the CPU. That makes this the tool to find them, not to weigh them.
#
#   benches/instructions_ab.sh OLD_BINARY [NEW_BINARY]      # SHORT=4 LONG=12 seconds; ~3 min
#   G3PROXY=path benches/instructions_ab.sh OLD_BINARY [NEW_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
OLD="${1:?usage: benches/instructions_ab.sh OLD_BINARY [NEW_BINARY]}"
NEW="${2:-target/release/egress-proxy}"
SHORT="${SHORT:-4}"; LONG="${LONG:-12}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

# One run of binary $1 (or "g3proxy": $G3PROXY) for $2 seconds: "instructions connections".
run() {
  local cmd
  if [ "$1" = g3proxy ]; then
    g3proxy_config 3161 > "$WORK/g3.yaml"
    cmd=("$G3PROXY" -c "$WORK/g3.yaml" -C "$WORK")
  else
    egress_bench_config 3161 9961 > "$WORK/p.yaml"
    cmd=("$1" run --config "$WORK/p.yaml")
  fi
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" "${cmd[@]}" >/dev/null 2>"$WORK/vg.err" &
  local pid=$!
  # Ready: egress-proxy says so on /healthz; g3proxy takes a connection.
  for _ in $(seq 1 100); do
    if [ "$1" = g3proxy ]; then
      (exec 3<>/dev/tcp/127.0.0.1/3161) 2>/dev/null && break
    else
      curl -s -o /dev/null "http://127.0.0.1:9961/healthz" && break
    fi
    sleep 0.2
  done
  local n; n="$("$LG" rate --proxy 127.0.0.1:3161 --concurrency 8 --seconds "$2" | field connections)"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  local total; total="$(awk '/^summary:/ {print $2}' "$WORK"/cg.out*)"
  rm -f "$WORK"/cg.out*
  echo "$total $n"
}

WHICH=(old new)
[ -n "${G3PROXY:-}" ] && WHICH+=(g3proxy)
for which in "${WHICH[@]}"; do
  case "$which" in old) bin="$OLD" ;; new) bin="$NEW" ;; *) bin=g3proxy ;; esac
  read -r i1 c1 < <(run "$bin" "$SHORT")
  read -r i2 c2 < <(run "$bin" "$LONG")
  python3 - "$which" "$i1" "$c1" "$i2" "$c2" <<'PY'
import sys
w, i1, c1, i2, c2 = sys.argv[1], *map(int, sys.argv[2:])
print(f"{w}: {(i2 - i1) / (c2 - c1):,.0f} instructions per CONNECT "
      f"(runs: {c1} connections, {i1:,} instructions; {c2} connections, {i2:,} instructions)")
PY
done
