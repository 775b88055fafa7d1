#!/usr/bin/env bash
# RSS of the proxy while one sandbox floods the DNS listener with 20,000 distinct names, and
# after the answers expired (TTL 1 s + the 60 s grace + the 10 s sweep): the answer memory is
# bounded per sandbox and given back. Another sandbox's name still resolves during the flood.
#
#   cargo build --release && benches/dns_memory.sh [BINARY]      # about 3 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/egress-proxy}"
WORK="$(mktemp -d)"; PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
python3 - "$WORK" <<'PY'
import sys
hosts = "\n".join(f"    n{i}.flood.test: [10.{(i>>16)&255}.{(i>>8)&255}.{i&255}]" for i in range(20000))
open(sys.argv[1] + "/proxy.yaml", "w").write(f"""listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0, dns: 127.0.0.1:15353 }}
audit: {{ path: /dev/null, dns: denied }}
dns:
  servers: ["127.0.0.1:9"]
  max_answer_ttl_s: 1
  hosts:
    other.test: [10.200.0.1]
{hosts}
defaults: {{ guard_allow_ranges: [10.0.0.0/8] }}
sandboxes:
  - {{ id: flood, sources: [127.0.0.1/32], limits: {{ dns_queries_per_second: 100000 }}, policy: {{ provider: local, config: {{}}, network: {{ egress: ["*.flood.test"] }} }} }}
  - {{ id: other, sources: [127.0.0.2/32], policy: {{ provider: local, config: {{}}, network: {{ egress: ["other.test"] }} }} }}
""")
PY
cat > "$WORK/flood.py" <<'PY'
import socket, struct
def query(i, name):
    q = struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00\x00\x01\x00\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); s.settimeout(2)
answered = 0
for i in range(20000):
    s.sendto(query(i, f"n{i}.flood.test"), ("127.0.0.1", 15353))
    try:
        s.recv(4096); answered += 1
    except OSError:
        pass
o = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); o.bind(("127.0.0.2", 0)); o.settimeout(2)
o.sendto(query(1, "other.test"), ("127.0.0.1", 15353))
r = o.recv(4096)
print(f"flood: {answered} answered; other sandbox: rcode {r[3] & 15}, {struct.unpack('>H', r[6:8])[0]} answer(s)")
PY
"$BIN" run --config "$WORK/proxy.yaml" >/dev/null 2>"$WORK/err" & PID=$!
sleep 2
rss() { awk '/VmRSS/ {print $2 " kB"}' "/proc/$PID/status"; }
echo "start:               $(rss)"
python3 "$WORK/flood.py"
echo "after flood 1:       $(rss)"
sleep 75
echo "after expiry:        $(rss)"
python3 "$WORK/flood.py" >/dev/null
echo "after flood 2:       $(rss)"
sleep 75
echo "after expiry 2:      $(rss)"
