#!/usr/bin/env bash
# System calls per CONNECT, counted by the kernel's syscall tracepoints (`perf stat`) while
# `loadgen rate` (8 concurrent CONNECT + 1-byte echo + close) runs at full speed, divided by
# the connections the run made. Rounds are interleaved across the proxies; the table gives the
# median of each count. `STRACE=1` counts with `strace -c -f` instead, as issue 46 did: it
# slows each proxy to a few hundred connections a second, which inflates the calls whose
# number depends on the rate (the audit writer's wake-ups, the runtime's parking: `futex`,
# `write`, `clock_nanosleep`).
#
#   benches/syscalls.sh [BINARY]...        # egress-proxy builds (default: target/release)
#   G3PROXY=path benches/syscalls.sh       # and g3proxy           ROUNDS=3 SECONDS_PER_RUN=3
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
SECS="${SECONDS_PER_RUN:-3}"; ROUNDS="${ROUNDS:-3}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
BINS=("$@"); [ ${#BINS[@]} -eq 0 ] && BINS=(target/release/egress-proxy)
declare -A PORT PID
NAMES=()
start_proxies 3170 "${BINS[@]}"
CALLS=(recvfrom sendto writev epoll_ctl epoll_wait close shutdown setsockopt getsockopt
  getsockname accept4 socket connect futex write clock_nanosleep sched_yield splice pipe2
  madvise mmap munmap)
EVENTS="raw_syscalls:sys_enter$(printf ',syscalls:sys_enter_%s' "${CALLS[@]}")"
for n in "${NAMES[@]}"; do
  "$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 8 --seconds 1 >/dev/null   # warm
done
for round in $(seq "$ROUNDS"); do
  for n in "${NAMES[@]}"; do
    out="$WORK/$n.$round"
    if [ -n "${STRACE:-}" ]; then
      strace -c -f -q -p "${PID[$n]}" -o "$out.strace" & st=$!
      sleep 1
    else
      # Runs past the load generator's own run (1 s of warm-up, then SECS): every one of its
      # connections is counted, and nothing else is going on.
      perf stat -x, -e "$EVENTS" -p "${PID[$n]}" -o "$out.perf" -- sleep "$((SECS + 2))" & st=$!
      sleep 0.2
    fi
    "$LG" rate --proxy "127.0.0.1:${PORT[$n]}" --concurrency 8 --seconds "$SECS" > "$out.json"
    if [ -n "${STRACE:-}" ]; then sleep 1; kill -INT "$st"; fi
    wait "$st" 2>/dev/null || true
  done
done
python3 - "$WORK" "$ROUNDS" "${NAMES[@]}" <<'PY'
import sys, json, collections, statistics
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
per = {n: collections.defaultdict(list) for n in names}
conns = {n: [] for n in names}
for n in names:
    for r in range(1, rounds + 1):
        c = json.load(open(f"{work}/{n}.{r}.json"))["connections"]
        conns[n].append(c)
        counts = collections.Counter()
        try:
            for line in open(f"{work}/{n}.{r}.perf"):
                f = line.strip().split(",")
                if len(f) > 2 and f[0].isdigit():
                    ev = f[2]
                    counts["total" if ev == "raw_syscalls:sys_enter" else ev.rsplit("sys_enter_", 1)[-1]] += int(f[0])
        except FileNotFoundError:
            for line in open(f"{work}/{n}.{r}.strace"):
                f = line.split()
                if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
                    counts[f[-1]] += int(f[3])
            counts["total"] = sum(counts.values())
        for k, v in counts.items():
            per[n][k].append(v / c)
med = {n: {k: statistics.median(v) for k, v in per[n].items()} for n in names}
rows = sorted({k for n in names for k in med[n] if k != "total"}, key=lambda k: -max(med[n].get(k, 0) for n in names))
print("| per CONNECT (median of %d rounds) | " % rounds + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for k in rows:
    vals = [med[n].get(k, 0.0) for n in names]
    if max(vals) < 0.05:
        continue
    print(f"| `{k}` | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
print("| **all system calls** | " + " | ".join(f"**{med[n]['total']:.1f}**" for n in names) + " |")
print("| rounds (all calls) | " + " | ".join(" ".join(f"{x:.1f}" for x in per[n]["total"]) for n in names) + " |")
print("| connections per round | " + " | ".join(" ".join(str(c) for c in conns[n]) for n in names) + " |")
PY
