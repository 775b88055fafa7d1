# Shared by the DNS benches (sourced): a scratch directory and the processes stopped on exit,
# the upstream every server forwards to, the proxy's bench configuration and the query files.

source benches/peers.sh
scratch /dev/shm/egress-dns.XXXX

UP=15353

# A dnsmasq on loopback that knows allowed.bench and exfil.bench; its pid is $UPSTREAM_PID.
start_upstream() {
  dnsmasq --keep-in-foreground --no-resolv --no-hosts --port=$UP --listen-address=127.0.0.1 \
    --bind-interfaces --address=/allowed.bench/127.0.0.1 --address=/exfil.bench/127.0.0.2 \
    --cache-size=10000 --local-ttl=300 --pid-file="$WORK/dnsmasq.pid" --user=root 2>"$WORK/dnsmasq.log" &
  UPSTREAM_PID=$!
  PIDS+=("$UPSTREAM_PID")
}

# The proxy's configuration: one sandbox allowed allowed.bench, limits lifted, the audit
# trail encoded and written to /dev/null.
proxy_config() { # dns_port
  cat <<YAML
listen: { proxy: 127.0.0.1:0, admin: 127.0.0.1:0, dns: 127.0.0.1:$1, default_sandbox: bench }
audit: { path: /dev/null }
dns: { servers: ["127.0.0.1:$UP"], timeout_ms: 2000 }
defaults: { guard_allow_ranges: [127.0.0.0/8] }
admission: { dns_queries_per_second_per_source: 10000000 }
sandboxes:
  - id: bench
    limits: { dns_queries_per_second: 10000000 }
    policy: { provider: local, config: {}, network: { egress: ["allowed.bench"] } }
YAML
}

# allowed.txt (one cached name) and denied.txt (400,000 fresh refused names: the
# exfiltration path, where no answer cache can help).
query_files() {
  printf 'allowed.bench A\n' > "$WORK/allowed.txt"
  python3 -c "
import random
r = random.Random(7)
print('\n'.join('q%016x.exfil.bench A' % r.getrandbits(64) for _ in range(400000)))" > "$WORK/denied.txt"
}

# An unbound on loopback port $1 that forwards to the upstream and refuses exfil.bench with a
# local zone (its equivalent of a deny rule); its pid is $UNBOUND_PID.
start_unbound() { # port
  cat > "$WORK/unbound.conf" <<CONF
server:
  interface: 127.0.0.1
  port: $1
  do-daemonize: no
  use-syslog: no
  logfile: ""
  verbosity: 0
  username: ""
  chroot: ""
  directory: "$WORK"
  pidfile: "$WORK/unbound.pid"
  num-threads: 2
  so-reuseport: yes
  access-control: 127.0.0.0/8 allow
  do-not-query-localhost: no
  module-config: "iterator"
  local-zone: "exfil.bench." always_nxdomain
  local-zone: "bench." nodefault
forward-zone:
  name: "."
  forward-addr: 127.0.0.1@$UP
CONF
  unbound -c "$WORK/unbound.conf" 2>"$WORK/unbound.log" &
  UNBOUND_PID=$!
  PIDS+=("$UNBOUND_PID")
}
