#!/usr/bin/env bash
# CPU per DNS query at a fixed rate, for two egress-proxy builds and unbound side by side:
# dnsperf paces QPS queries a second (default 60,000: below every server's saturation, so
# each gets the same arrivals and the same batch sizes) for 8 s at each in turn, refused names
# then the cached allowed name, ROUNDS rounds interleaved; the CPU is the server's user +
# system time from /proc over the run, all its threads. dns_compare.sh measures the rates at
# saturation, where a faster server also gets larger batches; this measures the cost per
# query where the rate is not the question. Same upstream, policy and unbound configuration
# as dns_compare.sh.
#
#   benches/dns_paced.sh OLD NEW [QPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD_BIN="$1"; NEW_BIN="$2"; QPS="${3:-60000}"; ROUNDS="${4:-3}"
for t in dnsperf unbound dnsmasq; do
  command -v "$t" >/dev/null || { echo "needs $t (apt-get install dnsperf unbound dnsmasq-base)" >&2; exit 2; }
done
source benches/dns_common.sh
start_upstream
query_files
proxy_config 15381 > "$WORK/old.yaml"
proxy_config 15382 > "$WORK/new.yaml"
"$OLD_BIN" run --config "$WORK/old.yaml" 2>"$WORK/old.log" & OLD_PID=$!; PIDS+=("$OLD_PID")
"$NEW_BIN" run --config "$WORK/new.yaml" 2>"$WORK/new.log" & NEW_PID=$!; PIDS+=("$NEW_PID")
start_unbound 15383
sleep 2
for port in 15381 15382 15383; do dig +short -p "$port" @127.0.0.1 allowed.bench >/dev/null; done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
cpu() { # pid port file: µs of the server's CPU per completed query
  local before after out
  before=$(ticks "$1")
  out=$(dnsperf -s 127.0.0.1 -p "$2" -d "$3" -l 8 -Q "$QPS" -c 8 -q 400 -T 2 2>&1)
  after=$(ticks "$1")
  echo "$out" | awk -v t=$((after - before)) -v hz="$HZ" \
    '/Queries completed/ {n = $3} END {printf "%.2f", n ? t * 1000000 / hz / n : 0}'
}
printf '%-6s %-8s %10s %10s %10s   (us of server CPU per query at %d QPS)\n' round kind old new unbound "$QPS"
for r in $(seq "$ROUNDS"); do
  for kind in denied allowed; do
    printf '%-6s %-8s %10s %10s %10s\n' "$r" "$kind" "$(cpu "$OLD_PID" 15381 "$WORK/$kind.txt")" \
      "$(cpu "$NEW_PID" 15382 "$WORK/$kind.txt")" "$(cpu "$UNBOUND_PID" 15383 "$WORK/$kind.txt")"
  done
done
