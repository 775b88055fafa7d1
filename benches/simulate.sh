#!/usr/bin/env bash
# `egress-proxy simulate` over a 1,000,000-record trail (issue 65): records per second and
# peak memory (max RSS from /usr/bin/time), with `egress-proxy suggest` over the same file in
# the same rounds as the reader to compare with (it parses every line too, and decides
# nothing). The trail is written here in the audit record's own shape: 100 sandboxes, each
# with CONNECT tunnels, terminated requests (path rules and MCP calls), forwarded requests and
# refusals, allowed and denied; the candidate removes one host and adds a path rule.
#
#   benches/simulate.sh [BINARY]        # RECORDS=1000000 ROUNDS=3; ~1 min
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/peers.sh
RECORDS="${RECORDS:-1000000}"; ROUNDS="${ROUNDS:-3}"
BIN="${1:-${CARGO_TARGET_DIR:-target}/release/egress-proxy}"
scratch
python3 - "$RECORDS" > "$WORK/trail.jsonl" <<'PY'
import json, sys
n = int(sys.argv[1])
# A terminated tunnel's three requests, then the tunnel's own record (as the proxy writes them).
kinds = [
    ("https", "api.test", "GET", "/v1/items", None, "allow", "rule_matched"),
    ("https", "api.test", "GET", "/v2/items", None, "deny", "http_not_allowed"),
    ("https", "api.test", "POST", "/mcp", "mcp tools/call search", "allow", "rule_matched"),
    ("connect", "api.test", None, None, None, "allow", "rule_matched"),
    ("connect", "gone.test", None, None, None, "allow", "rule_matched"),
    ("forward", "fwd.test", "GET", "/x", None, "allow", "rule_matched"),
    ("connect", "other.test", None, None, None, "deny", "no_rule_matched"),
    ("connect", "pypi.org", None, None, None, "deny", "no_rule_matched"),
]
out = sys.stdout
for i in range(n):
    mode, host, method, path, call, decision, reason = kinds[i % len(kinds)]
    r = {"ts": "2026-11-28T07:00:00.000Z", "event": "end", "conn_id": i // 4, "run": "bench-1",
         "sandbox": f"s{i % 100}", "identity": "token", "client": "127.0.0.1:40000", "mode": mode,
         "target_host": host, "target_port": 443, "resolved": ["127.0.0.1"], "dialed": "127.0.0.1:443",
         "decision": decision, "reason": reason, "rule": None, "rule_source": None,
         "policy_version": "0123456789ab", "bytes_up": 512, "bytes_down": 4096, "duration_ms": 12,
         "close": "eof"}
    if method:
        r.update({"method": method, "path": path, "status": 200})
    if reason == "http_not_allowed":
        r["detail"] = f"no network.http rule allows {method} {path} on {host}"
    if call:
        r["call"] = call
    out.write(json.dumps(r, separators=(",", ":")) + "\n")
PY
"$BIN" ca init "$WORK/ica" > /dev/null
{
  echo "tls_intercept: { ca_cert_file: $WORK/ica/ca.crt, ca_key_file: $WORK/ica/ca.key }"
  echo 'dns: { servers: ["127.0.0.1:9"] }'
  echo 'defaults: { guard_allow_ranges: [127.0.0.1/32] }'
  echo 'sandboxes:'
  for i in $(seq 0 99); do
    echo "  - { id: s$i, auth: { token_sha256: $(printf '%064d' "$i") }, policy: { provider: local, config: {}, network: { egress: [\"api.test\", \"fwd.test\"], http: [{ host: api.test, methods: [GET], paths: [\"/v1/*\", \"/v2/*\"] }, { host: api.test, paths: [/mcp], protocol: mcp, tools: [search] }] } } }"
  done
} > "$WORK/candidate.yaml"
"$BIN" validate --config "$WORK/candidate.yaml" > /dev/null
bytes=$(stat -c %s "$WORK/trail.jsonl")
echo "trail: $RECORDS records, $((bytes / 1024 / 1024)) MiB"
run() { # name args...
  local name="$1"; shift
  /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" > "$WORK/out" 2>/dev/null || true
  read -r secs kib < <(tail -1 "$WORK/time")
  printf '%-9s %6.2f s  %9.0f records/s  max RSS %6.1f MiB\n' "$name" "$secs" \
    "$(echo "$RECORDS / $secs" | bc -l)" "$(echo "$kib / 1024" | bc -l)"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r"
  run simulate "$BIN" simulate --config "$WORK/candidate.yaml" "$WORK/trail.jsonl"
  run suggest "$BIN" suggest --sandbox s1 --audit "$WORK/trail.jsonl"
done
echo "report (last round):"
"$BIN" simulate --config "$WORK/candidate.yaml" "$WORK/trail.jsonl" | head -20 || true
