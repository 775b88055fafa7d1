#!/usr/bin/env bash
# User-space instructions per DNS query, for several egress-proxy builds, counted by callgrind
# (valgrind): the same fixed set of queries to each build, so the count repeats to about 1 %
# where the rates of dns_compare.sh drift ±20 % (and this VM's `perf stat` has no hardware
# counters). Two kinds: the cached allowed name (the answer
# cache's path) and fresh refused names (a full parse, decision, refusal and record each).
# The kernel's share is not counted; dns_compare.sh's CPU per query includes it.
#
# EDNS=1 sends every query with an OPT record (`dnsperf -e`), as systemd-resolved and `dig`
# do: a refusal then carries its Extended DNS Error, which costs the text.
#
#   benches/dns_instructions.sh [BINARY]...          # QUERIES=20000; default: this tree's build
#
# KEEP=DIR keeps each profile (DIR/<binary path>-<kind>.callgrind) for `callgrind_annotate --inclusive=yes`.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${QUERIES:-20000}"
E=()
[ -n "${EDNS:-}" ] && E=(-e)
for t in dnsperf dnsmasq valgrind callgrind_annotate callgrind_control dig; do
  command -v "$t" >/dev/null || { echo "needs $t (apt-get install dnsperf dnsmasq-base valgrind dnsutils)" >&2; exit 2; }
done
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
  cargo build --release --quiet --bin egress-proxy
  BINS=(target/release/egress-proxy)
fi
source benches/dns_common.sh
start_upstream
proxy_config 15364 > "$WORK/proxy.yaml"
query_files
yes 'allowed.bench A' | head -n "$N" > "$WORK/allowed.q" || true
head -n "$N" "$WORK/denied.txt" > "$WORK/denied.q"

count() { # binary kind: instructions per query
  local out="$WORK/cg.out" p sent ir
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" run --config "$WORK/proxy.yaml" 2>"$WORK/cg.log" &
  p=$!
  for _ in $(seq 120); do
    dig +short +time=1 +tries=1 -p 15364 @127.0.0.1 allowed.bench >/dev/null 2>&1 && break
    sleep 0.5
  done
  # Warm up (the first refusals fill the policy's and allocator's caches), then count.
  dnsperf "${E[@]}" -s 127.0.0.1 -p 15364 -d "$WORK/$2.q" -n 1 -c 4 -q 50 -t 10 >/dev/null 2>&1
  callgrind_control -z "$p" >/dev/null 2>&1
  sent=$(dnsperf "${E[@]}" -s 127.0.0.1 -p 15364 -d "$WORK/$2.q" -n 1 -c 4 -q 50 -t 10 2>&1 | awk '/Queries completed/ {print $3}')
  callgrind_control -d "$p" >/dev/null 2>&1
  sleep 1
  kill "$p"; wait "$p" 2>/dev/null || true
  ir=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"; cp "$out.1" "$KEEP/$(printf %s "$1" | tr -c 'A-Za-z0-9.-' _)-$2.callgrind"
  fi
  rm -f "$out"*
  echo $((ir / sent))
}

printf '%-40s %22s %22s\n' build "allowed (cached) Ir/q" "refused Ir/q"
for b in "${BINS[@]}"; do
  printf '%-40s %22s %22s\n' "$b" "$(count "$b" allowed)" "$(count "$b" denied)"
done
