#!/usr/bin/env bash
# Instructions per terminated request of one or two egress-proxy builds, counted by callgrind
# (repeatable on a noisy shared machine, where CPU time per request also moves with how often
# the proxy's threads sleep and wake: ../shared/perf-notes.md). The proxy runs under
# `valgrind --tool=callgrind` inside `benches/intercept.rs` (`--only PHASE`: one phase alone,
# 8 keep-alive connections); the counters are zeroed once the phase runs, dumped 10 s later,
# and divided by the requests served in between (the calls that drop a request's handler).
# User-space instructions only: callgrind sees no kernel work, and the system calls per request
# are counted apart (`perf stat -e 'syscalls:sys_enter_*'`, the same for both phases here).
#
#   benches/instructions_requests.sh BINARY [BINARY2]         # phases path.test, mcp.test
#   PHASES="terminated_h1 terminated_h2" FLAGS=--protocols benches/instructions_requests.sh BIN
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=("${@:?usage: benches/instructions_requests.sh BINARY [BINARY2]}")
PHASES="${PHASES:-path.test mcp.test}"; FLAGS="${FLAGS:---mcp}"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release --bench intercept >/dev/null 2>&1
BENCH="$(ls -t target/release/deps/intercept-* | grep -v '\.d$' | head -1)"
WORK="$(mktemp -d)"
trap 'pkill -f "$WORK/wrap" 2>/dev/null || true; rm -rf "$WORK"' EXIT

# Requests served and instructions counted in callgrind dump $1.
count() {
  python3 - "$1" <<'PY'
import re, sys
names, calls, total, cfn = {}, 0, 0, None
for line in open(sys.argv[1]):
    m = re.match(r'(c?fn)=\((\d+)\)(?: (.*))?', line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3)
        cfn = m.group(2) if m.group(1) == 'cfn' else cfn
        continue
    m = re.match(r'calls=(\d+)', line)
    if m and 'drop_in_place<egress_proxy::intercept::exchange::Exchange::handle' in names.get(cfn, ''):
        calls += int(m.group(1))
    m = re.match(r'(?:summary|totals): (\d+)', line)
    if m:
        total = int(m.group(1))
print(total, calls)
PY
}

# glibc copies and fills past a few KiB with `rep movsb`/`rep stosb`, which callgrind counts
# one instruction per byte (an 8 KiB copy reads as 8,400 instructions and costs a few hundred
# cycles); with the thresholds out of reach they take the vector loop, counted as the work it
# is (about 820 for 8 KiB). The same for every build measured.
TUNED=glibc.cpu.x86_rep_movsb_threshold=2147483647:glibc.cpu.x86_rep_stosb_threshold=2147483647
for i in "${!BINS[@]}"; do
  printf '#!/bin/sh\nif [ "$1" = run ]; then GLIBC_TUNABLES=%s exec valgrind --tool=callgrind --log-file=%s/vg.log --callgrind-out-file=%s/cg.%%p.out %s "$@"; fi\nexec %s "$@"\n' \
    "$TUNED" "$WORK" "$WORK" "$(realpath "${BINS[$i]}")" "$(realpath "${BINS[$i]}")" > "$WORK/wrap$i"
  chmod +x "$WORK/wrap$i"
done
for phase in $PHASES; do
  for i in "${!BINS[@]}"; do
    rm -f "$WORK"/cg.*
    # shellcheck disable=SC2086
    "$BENCH" --bin "$WORK/wrap$i" --connections 8 --seconds 20 $FLAGS --only "$phase" >/dev/null 2>&1 &
    bench=$!
    sleep 25
    pid="$(pgrep -f "callgrind-out-file=$WORK" | head -1)"
    callgrind_control -z "$pid" >/dev/null 2>&1
    sleep 10
    callgrind_control -d "$pid" >/dev/null 2>&1
    sleep 1
    read -r ir n < <(count "$(ls "$WORK"/cg.*.out.1)")
    echo "{\"binary\":\"${BINS[$i]}\",\"phase\":\"$phase\",\"requests\":$n,\"instructions_per_request\":$((ir / (n > 0 ? n : 1)))}"
    kill "$bench" "$pid" 2>/dev/null || true
    wait "$bench" 2>/dev/null || true
  done
done
