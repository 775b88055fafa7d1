# Sourced by the comparison scripts: equivalent configurations of egress-proxy and its peers
# on loopback (allow everything from 127.0.0.0/8, no cache, no logs), so every script
# measures the same setups.

# The scratch directory $WORK (mktemp -d, with its arguments) and the processes in $PIDS: on
# exit they are stopped and it is removed. `cleanup` may also be called between rounds.
scratch() { WORK="$(mktemp -d "$@")"; PIDS=(); trap cleanup EXIT; }
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }

# egress-proxy with an allow policy for loopback origins and the admission limits lifted
# (one load generator on one address); audit to $3 (default /dev/null, like the peers' logs;
# more `audit:` keys may follow the path: "$WORK/a.jsonl, chain: true").
egress_bench_config() { # proxy_port admin_port [audit_path[, audit keys]]
  cat <<YAML
listen: { proxy: 127.0.0.1:$1, admin: 127.0.0.1:$2 }
audit: { path: ${3:-/dev/null} }
max_connections: 100000
admission: { unidentified_per_source: 100000, unidentified_total: 100000, accepts_per_second_per_source: 1000000, accept_burst_per_source: 1000000 }
defaults: { limits: { max_connections: 100000, connections_per_second: 1000000, burst: 1000000 } }
sandboxes:
  - id: bench
    sources: [127.0.0.0/8]
    policy: { provider: local, config: {}, network: { egress: ["127.0.0.1/32:*"] } }
YAML
}

# Squid: CONNECT and forwarding from loopback, no cache, no logs, one worker; state in $1.
squid_config() { # work_dir port
  mkdir -p "$1/squid"; chown proxy:proxy "$1/squid" 2>/dev/null || true
  cat <<CONF
http_port 127.0.0.1:$2
acl localnet src 127.0.0.0/8
http_access allow localnet
http_access deny all
cache deny all
cache_mem 8 MB
access_log none
cache_store_log none
cache_log /dev/null
pid_filename $1/squid/squid.pid
coredump_dir $1/squid
max_filedescriptors 20000
workers 1
shutdown_lifetime 1 seconds
CONF
}

# tinyproxy: no ConnectPort line = CONNECT to any port; minimal logging.
tinyproxy_config() { # work_dir port
  cat <<CONF
Port $2
Listen 127.0.0.1
Timeout 600
MaxClients 20000
LogLevel Critical
PidFile "$1/tinyproxy.pid"
Allow 127.0.0.1
DisableViaHeader Yes
CONF
}

# g3proxy (G3PROXY=path): its http_proxy server with a direct escaper. Not run on the machine
# this was run on, built from source (`cargo build --release -p g3proxy --no-default-features
# --features rustls-ring`: no Lua, Python, c-ares or QUIC; needs libssl-dev and capnproto).
g3proxy_config() { # port          G3_WORKERS=N: N per-core workers that listen themselves
  local in_worker=""
  [ -n "${G3_WORKERS:-}" ] && in_worker=", listen_in_worker: true"
  cat <<YAML
runtime: { thread_number: 2 }
$([ -n "${G3_WORKERS:-}" ] && echo "worker: { thread_number: $G3_WORKERS }")
resolver:
  - { name: default, type: hickory, server: 127.0.0.1 }
escaper:
  - { name: default, type: direct_fixed, resolver: default, egress_net_filter: { default: allow, allow: 127.0.0.1 } }
server:
  - { name: http, type: http_proxy, escaper: default, listen: "127.0.0.1:$1"$in_worker }
YAML
}

# Start one proxy on port $2 in $WORK: g3proxy when $1 is "g3proxy" ($G3PROXY), else the
# egress-proxy binary $1 on the bench configuration (admin on $2 + 6800). Sets the caller's
# `pid`; the caller stops it (one fresh process per round).
start_one() { # binary|g3proxy port
  if [ "$1" = g3proxy ]; then
    g3proxy_config "$2" > "$WORK/g3.yaml"
    "$G3PROXY" -c "$WORK/g3.yaml" -C "$WORK" >/dev/null 2>&1 & pid=$!
  else
    egress_bench_config "$2" "$(($2 + 6800))" > "$WORK/e.yaml"
    "$1" run --config "$WORK/e.yaml" 2>/dev/null & pid=$!
  fi
}

# Start each egress-proxy binary given (and g3proxy when $G3PROXY is set) on consecutive
# ports from $1, in $WORK; fills the caller's NAMES (in order), PID and PORT (by name) and
# appends to PIDS for the caller's cleanup. Names are the binaries' paths made safe.
# `BINARY@threads=N` runs that build with `listen.threads: N`; G3_WORKERS=N gives g3proxy N
# per-core workers that accept on their own sockets (`worker:`, `listen_in_worker`).
start_proxies() { # first_port binary...
  local port="$1" b name; shift
  for b in "$@"; do
    # BINARY@threads=N: that build with `listen.threads: N`.
    name="$(echo "$b" | tr -c 'a-zA-Z0-9\n' _)"
    egress_bench_config "$port" "$((port + 6800))" > "$WORK/$port.yaml"
    case "$b" in *@threads=*)
      sed -i "s/^listen: { /listen: { threads: ${b##*@threads=}, /" "$WORK/$port.yaml"; b="${b%@threads=*}";;
    esac
    "$b" run --config "$WORK/$port.yaml" 2>/dev/null & PIDS+=($!); PID[$name]=$!; PORT[$name]=$port
    NAMES+=("$name"); port=$((port + 1))
  done
  if [ -n "${G3PROXY:-}" ]; then
    g3proxy_config "$port" > "$WORK/g3.yaml"
    "$G3PROXY" -c "$WORK/g3.yaml" -C "$WORK" >/dev/null 2>&1 & PIDS+=($!); PID[g3proxy]=$!; PORT[g3proxy]=$port
    NAMES+=(g3proxy)
  fi
  sleep 2
}

# nginx answering every request `200 hello from the origin` on $1 (host:port), in $WORK (one
# worker, no logs, keep-alive without end); appended to $PIDS. Installs hey and nginx first.
nginx_origin() { # addr
  for t in hey nginx; do
    command -v "$t" >/dev/null && continue
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hey nginx-light >/dev/null
    service nginx stop >/dev/null 2>&1 || true
  done
  cat > "$WORK/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen $1; location / { return 200 "hello from the origin\n"; } }
}
CONF
  nginx -p "$WORK" -c "$WORK/nginx.conf" & PIDS+=($!)
}
