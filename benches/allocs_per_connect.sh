#!/usr/bin/env bash
# Heap allocations per CONNECT of egress-proxy builds (and g3proxy with G3PROXY=path), counted
# exactly: uprobes on glibc's `malloc`, `posix_memalign` and `memalign` (`perf probe`), read
# while `loadgen rate` (32 concurrent CONNECT + 1-byte echo + close) runs, divided by the
# connections it made. Also the large ones (1 KiB or more: glibc serves those from its bins,
# not its per-thread cache, and merges its fast bins first) and their bytes. A count, not a
# time: it repeats exactly where CPU per CONNECT drifts ±20 %.
#
#   benches/allocs_per_connect.sh [BINARY]...      # SECONDS_PER_RUN=2; BY_SIZE=1 lists sizes
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
SECS="${SECONDS_PER_RUN:-2}"
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 2; }
LIBC="$(ldd /bin/true | awk '/libc\.so/ {print $3}')"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && { cargo build --release --quiet --bin egress-proxy; BINS=(target/release/egress-proxy); }
[ -n "${G3PROXY:-}" ] && BINS+=(g3proxy)

# The probes, with the size each asks for (memalign: `aligned_alloc` and Rust's aligned boxes).
probe() { perf probe -q -x "$LIBC" "$1" 2>/dev/null || perf probe -l 2>/dev/null | grep -q "probe_libc:${1%% *}"; }
probe 'malloc size=%di:u64'
probe 'posix_memalign size=%dx:u64'
probe 'memalign size=%si:u64'

printf '%-44s %10s %12s %14s %16s\n' build connections "allocs/conn" "large/conn" "large KB/conn"
for b in "${BINS[@]}"; do
  start_one "$b" 3195
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/3195) 2>/dev/null && break; sleep 0.2; done
  # Warm up: the first connections fill the allocator's and the policy's caches.
  "$LG" rate --proxy 127.0.0.1:3195 --concurrency 32 --seconds 1 >/dev/null
  perf record -q -e probe_libc:malloc -e probe_libc:posix_memalign -e probe_libc:memalign \
    -p "$pid" -o "$WORK/allocs.data" -- sleep $((SECS + 2)) >/dev/null 2>&1 &
  rec=$!
  sleep 0.5
  n="$("$LG" rate --proxy 127.0.0.1:3195 --concurrency 32 --seconds "$SECS" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["connections"])')"
  wait "$rec" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
  perf script -i "$WORK/allocs.data" -F trace 2>/dev/null | sed 's/.*size=//' > "$WORK/sizes"
  awk -v n="$n" -v b="$b" '{a++; if ($1 >= 1024) {l++; by += $1}}
    END {printf "%-44s %10d %12.1f %14.1f %16.1f\n", b, n, a / n, l / n, by / n / 1000}' "$WORK/sizes"
  if [ -n "${BY_SIZE:-}" ]; then
    sort -n "$WORK/sizes" | uniq -c | awk -v n="$n" '$1 / n >= 0.5 {printf "    %8d bytes: %.2f a CONNECT\n", $2, $1 / n}'
  fi
done
