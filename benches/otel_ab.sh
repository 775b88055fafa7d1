#!/usr/bin/env bash
# Does a collector that is down cost the data plane anything? Interleaved rounds of the CONNECT
# rate (benches/loadgen.rs `rate`: 32 concurrent CONNECT + 1-byte echo + close) through four
# instances of the same build, all up at once: without `otel:`, exporting to a live OTLP/HTTP
# receiver (tests/data/otlp_receiver.py, on opentelemetry-proto), to a port that refuses, and to
# a listener that accepts and never answers. Each instance writes its audit trail to a file.
#
#   benches/otel_ab.sh            # ROUNDS=5 SECONDS_PER_RUN=4
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
ROUNDS="${ROUNDS:-5}"; SECS="${SECONDS_PER_RUN:-4}"
scratch
cargo build --release --bench loadgen >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
LG="$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)"
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

python3 tests/data/otlp_receiver.py http /dev/null >"$WORK/receiver.port" & PIDS+=($!)
python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1024)
print(s.getsockname()[1], flush=True)
conns = []
while True:
    c, _ = s.accept(); conns.append(c)
" >"$WORK/silent.port" & PIDS+=($!)
sleep 1
LIVE="$(cat "$WORK/receiver.port")"; SILENT="$(cat "$WORK/silent.port")"
REFUSING="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"

declare -A PID
declare -A PORT=( [none]=3161 [live]=3162 [refusing]=3163 [silent]=3164 )
declare -A OTEL=( [none]="" [live]="http://127.0.0.1:$LIVE" [refusing]="http://127.0.0.1:$REFUSING" [silent]="http://127.0.0.1:$SILENT" )
ORDER=(none live refusing silent)
for t in "${ORDER[@]}"; do
  egress_bench_config "${PORT[$t]}" "$((PORT[$t] + 6800))" "$WORK/$t.audit" > "$WORK/$t.yaml"
  if [ -n "${OTEL[$t]}" ]; then
    echo "otel: { endpoint: \"${OTEL[$t]}\", protocol: http, interval_ms: 1000, timeout_ms: 2000 }" >> "$WORK/$t.yaml"
  fi
  target/release/egress-proxy run --config "$WORK/$t.yaml" 2>"$WORK/$t.err" & PIDS+=($!); PID[$t]=$!
done
sleep 2
# CPU time (user + system, in clock ticks) of a process so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ="$(getconf CLK_TCK)"
declare -A R C
for round in $(seq "$ROUNDS"); do
  for t in "${ORDER[@]}"; do
    before="$(ticks "${PID[$t]}")"
    rate="$("$LG" rate --proxy "127.0.0.1:${PORT[$t]}" --concurrency 32 --seconds "$SECS" | field conn_per_sec)"
    # The exporter's share comes after the load (its batches, its retries): wait for it, so
    # the CPU per connection counts it and the next target is measured alone.
    sleep 2
    after="$(ticks "${PID[$t]}")"
    R[$t]+=" $rate"
    C[$t]+=" $(python3 -c "print(round(($after - $before) * 1e6 / $HZ / ($rate * $SECS), 1))")"
  done
  echo "round $round: $(for t in "${ORDER[@]}"; do printf '%s%s; ' "$t" "${R[$t]}"; done)" >&2
done
metric() { curl -s "127.0.0.1:$(( PORT[$1] + 6800 ))/metrics" | awk -v m="$2" 'index($0, m) == 1 {print $2}' | head -1; }
echo
echo "| collector | CONNECT rate (conn/s, median of $ROUNDS) | rounds | vs no otel | proxy CPU per connection (µs, with the export after it) | records exported | failed | dropped |"
echo "|---|---|---|---|---|---|---|---|"
base="$(printf '%s\n' ${R[none]} | median)"
for t in "${ORDER[@]}"; do
  m="$(printf '%s\n' ${R[$t]} | median)"
  ratio="$(python3 -c "print(f'{float(\"$m\")/float(\"$base\"):.2f}×')")"
  cpu="$(printf '%s\n' ${C[$t]} | median)"
  echo "| $t | $m | ${R[$t]} | $ratio | $cpu | $(metric "$t" 'egress_otel_records_total{outcome="exported"}') | $(metric "$t" 'egress_otel_records_total{outcome="failed"}') | $(metric "$t" egress_otel_records_dropped_total) |"
done
echo
echo "Machine: $(nproc) cores; loadgen, origin, receiver and the four proxies share it. Rounds interleaved."
