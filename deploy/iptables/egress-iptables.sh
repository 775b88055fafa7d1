#!/usr/bin/env bash
# Install or remove the iptables rules that send a sandbox's TCP to egress-proxy's
# transparent listener, and keep UDP (QUIC on 443 included) and every other IP protocol
# (ICMP echo, raw protocols) from bypassing it.
#
#   egress-iptables.sh install|remove sidecar --proxy-uid UID [options]
#   egress-iptables.sh install|remove gateway --iface IFACE [options]
#
# sidecar: run inside the sandbox's network namespace (Kubernetes init container, netns).
#          nat OUTPUT → REDIRECT; the proxy's own uid and loopback are exempt.
# gateway: run on the host that routes the sandboxes; nat PREROUTING on the sandbox-facing
#          interface → REDIRECT to this host's proxy.
#
# Options:
#   --proxy-port PORT   the transparent listener's port (default 15001)
#   --proxy-uid UID     sidecar: the uid the proxy runs as (required for sidecar)
#   --iface IFACE       gateway: the sandbox-facing interface (required for gateway)
#   --dns-redirect PORT send the sandbox's DNS (UDP and TCP port 53, to any address) to
#                       egress-proxy's DNS listener (`listen.dns`) on PORT, and drop
#                       DNS-over-TLS (TCP 853); the proxy's own queries are not redirected
#                       (sidecar: its uid; gateway: the host's own traffic never passes the
#                       sandbox interface). Replaces --dns.
#   --dns IP            without --dns-redirect: a resolver the sandbox may reach directly on
#                       port 53 (repeatable) — an open channel for names, see the README;
#                       all other UDP from the sandbox is dropped
# Protocols other than TCP and UDP from the sandbox are dropped (ICMPv6 router and neighbour
# discovery excepted), in mangle PREROUTING for gateways and filter OUTPUT for sidecars.
#   --sources CIDR      gateway: the only source addresses the sandboxes behind IFACE have
#                       (repeatable); packets from IFACE with any other source are dropped.
#                       Without it, packets whose source would not be routed back out of
#                       IFACE are dropped (strict reverse-path filter, `-m rpfilter`), which
#                       stops a sandbox forging another interface's sandbox but not a
#                       neighbour on the same interface: name the sources for that. The
#                       proxy identifies a connection or DNS query by its source address, so
#                       that identity is only as strong as this.
#   --tproxy            gateway: use TPROXY (mangle PREROUTING, fwmark 0x1, local route in
#                       table 100) instead of REDIRECT; the proxy needs
#                       `listen.transparent_tproxy: true` and CAP_NET_ADMIN
#   --ipv4-only | --ipv6-only
#   --dry-run           print the commands instead of running them
#
# Idempotent: install replaces this script's chains and jumps; remove deletes them. Listen on
# [::]:PORT (or 0.0.0.0:PORT for IPv4 only) so that redirected IPv6 reaches the proxy too.
set -euo pipefail

ACTION="${1:-}"; MODEL="${2:-}"
[ $# -ge 2 ] && shift 2 || true
PORT=15001; UID_EXEMPT=""; IFACE=""; DNS=(); DNS_PORT=""; FAMILIES=(4 6); DRY=0; TPROXY=0
SOURCES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --proxy-port) PORT="$2"; shift 2 ;;
    --proxy-uid) UID_EXEMPT="$2"; shift 2 ;;
    --iface) IFACE="$2"; shift 2 ;;
    --dns) DNS+=("$2"); shift 2 ;;
    --dns-redirect) DNS_PORT="$2"; shift 2 ;;
    --sources) SOURCES+=("$2"); shift 2 ;;
    --tproxy) TPROXY=1; shift ;;
    --ipv4-only) FAMILIES=(4); shift ;;
    --ipv6-only) FAMILIES=(6); shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "egress-iptables: unknown option $1" >&2; exit 2 ;;
  esac
done
usage() { echo "usage: $0 install|remove sidecar|gateway [options] (see --help)" >&2; exit 2; }
case "$ACTION" in install|remove) ;; *) usage ;; esac
case "$MODEL" in
  sidecar) [ -n "$UID_EXEMPT" ] || { echo "egress-iptables: sidecar needs --proxy-uid" >&2; exit 2; } ;;
  gateway) [ -n "$IFACE" ] || { echo "egress-iptables: gateway needs --iface" >&2; exit 2; } ;;
  *) usage ;;
esac
if [ "${#SOURCES[@]}" -gt 0 ] && [ "$MODEL" != gateway ]; then
  echo "egress-iptables: --sources is for the gateway model" >&2; exit 2
fi
if [ "$TPROXY" = 1 ] && [ "$MODEL" != gateway ]; then
  echo "egress-iptables: --tproxy is for the gateway model" >&2; exit 2
fi
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || { echo "egress-iptables: bad --proxy-port" >&2; exit 2; }
if [ -n "$DNS_PORT" ]; then
  [[ "$DNS_PORT" =~ ^[0-9]+$ ]] && [ "$DNS_PORT" -ge 1 ] && [ "$DNS_PORT" -le 65535 ] || { echo "egress-iptables: bad --dns-redirect port" >&2; exit 2; }
  [ "${#DNS[@]}" -eq 0 ] || { echo "egress-iptables: --dns and --dns-redirect exclude each other" >&2; exit 2; }
fi

# Sidecar: one set per network namespace. Gateway: one set per sandbox interface, so that
# several interfaces (several sandboxes) can be installed and removed independently.
if [ "$MODEL" = sidecar ]; then
  CHAIN=EGRESS_PROXY; UDP_CHAIN=EGRESS_PROXY_UDP; OTHER_CHAIN=EGRESS_PROXY_OTHER
  DNS_CHAIN=EGRESS_PROXY_DNS
else
  CHAIN="EGRESS_PROXY_$IFACE"; UDP_CHAIN="EGRESS_UDP_$IFACE"; OTHER_CHAIN="EGRESS_OTH_$IFACE"
  DNS_CHAIN="EGRESS_DNS_$IFACE"; SPOOF_CHAIN="EGRESS_SRC_$IFACE"
  [ "${#CHAIN}" -le 28 ] || { echo "egress-iptables: interface name too long" >&2; exit 2; }
fi

run() {
  if [ "$DRY" = 1 ]; then echo "$*"; else "$@"; fi
}
# Is this address of the family being configured?
is_family() { if [ "$1" = 6 ]; then [[ "$2" == *:* ]]; else [[ "$2" != *:* ]]; fi; }

# The hook (table, chain, match) where our chains are jumped to.
nat_hook() { if [ "$MODEL" = sidecar ]; then echo "OUTPUT"; else echo "PREROUTING -i $IFACE"; fi; }
# TPROXY lives in mangle PREROUTING; REDIRECT in nat.
tcp_table() { if [ "$TPROXY" = 1 ]; then echo mangle; else echo nat; fi; }
TPROXY_MARK=0x1/0x1
TPROXY_TABLE=100
udp_hook() { if [ "$MODEL" = sidecar ]; then echo "filter OUTPUT"; else echo "mangle PREROUTING -i $IFACE"; fi; }

# Policy routing for TPROXY: marked packets are delivered locally (table 100). Shared by every
# TPROXY interface: added once, removed with the last one.
tproxy_routing() {
  local fam="$1" action="$2" any
  [ "$fam" = 6 ] && any="::/0" || any="0.0.0.0/0"
  if [ "$action" = add ]; then
    if [ "$DRY" = 1 ] || ! ip -"$fam" rule show | grep -q "fwmark 0x1/0x1 lookup $TPROXY_TABLE"; then
      run ip -"$fam" rule add fwmark "$TPROXY_MARK" lookup "$TPROXY_TABLE"
    fi
    run ip -"$fam" route replace local "$any" dev lo table "$TPROXY_TABLE"
  else
    local ipt; [ "$fam" = 6 ] && ipt=ip6tables || ipt=iptables
    if [ "$DRY" = 1 ] || ! $ipt -w -t mangle -S 2>/dev/null | grep -q -- "-N EGRESS_PROXY_"; then
      while [ "$DRY" = 0 ] && ip -"$fam" rule show | grep -q "fwmark 0x1/0x1 lookup $TPROXY_TABLE"; do
        ip -"$fam" rule del fwmark "$TPROXY_MARK" lookup "$TPROXY_TABLE"
      done
      run ip -"$fam" route flush table "$TPROXY_TABLE" 2>/dev/null || true
    fi
  fi
}

remove_family() {
  local ipt="$1"
  local udp_table udp_rest
  read -r udp_table udp_rest <<<"$(udp_hook)"
  # Delete every jump (install may have run more than once before this script was idempotent).
  if [ "$DRY" = 1 ]; then
    echo "$ipt -t $(tcp_table) -D $(nat_hook) -p tcp -j $CHAIN   # while present"
    echo "$ipt -t $udp_table -D $udp_rest -p udp -j $UDP_CHAIN   # while present"
    echo "$ipt -t $udp_table -D $udp_rest -j $OTHER_CHAIN   # while present"
    echo "$ipt -t $(tcp_table) -F $CHAIN; $ipt -t $(tcp_table) -X $CHAIN"
    echo "$ipt -t $udp_table -F $UDP_CHAIN; $ipt -t $udp_table -X $UDP_CHAIN"
    echo "$ipt -t $udp_table -F $OTHER_CHAIN; $ipt -t $udp_table -X $OTHER_CHAIN"
    echo "$ipt -t nat -D $(nat_hook) -j $DNS_CHAIN   # while present"
    echo "$ipt -t nat -F $DNS_CHAIN; $ipt -t nat -X $DNS_CHAIN"
    if [ "$MODEL" = gateway ]; then
      echo "$ipt -t mangle -D PREROUTING -i $IFACE -j $SPOOF_CHAIN   # while present"
      echo "$ipt -t mangle -F $SPOOF_CHAIN; $ipt -t mangle -X $SPOOF_CHAIN"
    fi
    return
  fi
  # shellcheck disable=SC2046
  while $ipt -t nat -C $(nat_hook) -j "$DNS_CHAIN" 2>/dev/null; do
    $ipt -t nat -D $(nat_hook) -j "$DNS_CHAIN"
  done
  $ipt -t nat -F "$DNS_CHAIN" 2>/dev/null || true
  $ipt -t nat -X "$DNS_CHAIN" 2>/dev/null || true
  # shellcheck disable=SC2086
  while $ipt -t "$udp_table" -C $udp_rest -j "$OTHER_CHAIN" 2>/dev/null; do
    $ipt -t "$udp_table" -D $udp_rest -j "$OTHER_CHAIN"
  done
  # shellcheck disable=SC2046
  while $ipt -t "$(tcp_table)" -C $(nat_hook) -p tcp -j "$CHAIN" 2>/dev/null; do
    $ipt -t "$(tcp_table)" -D $(nat_hook) -p tcp -j "$CHAIN"
  done
  # shellcheck disable=SC2086
  while $ipt -t "$udp_table" -C $udp_rest -p udp -j "$UDP_CHAIN" 2>/dev/null; do
    $ipt -t "$udp_table" -D $udp_rest -p udp -j "$UDP_CHAIN"
  done
  $ipt -t "$(tcp_table)" -F "$CHAIN" 2>/dev/null || true
  $ipt -t "$(tcp_table)" -X "$CHAIN" 2>/dev/null || true
  $ipt -t "$udp_table" -F "$UDP_CHAIN" 2>/dev/null || true
  $ipt -t "$udp_table" -X "$UDP_CHAIN" 2>/dev/null || true
  $ipt -t "$udp_table" -F "$OTHER_CHAIN" 2>/dev/null || true
  $ipt -t "$udp_table" -X "$OTHER_CHAIN" 2>/dev/null || true
  if [ "$MODEL" = gateway ]; then
    while $ipt -t mangle -C PREROUTING -i "$IFACE" -j "$SPOOF_CHAIN" 2>/dev/null; do
      $ipt -t mangle -D PREROUTING -i "$IFACE" -j "$SPOOF_CHAIN"
    done
    $ipt -t mangle -F "$SPOOF_CHAIN" 2>/dev/null || true
    $ipt -t mangle -X "$SPOOF_CHAIN" 2>/dev/null || true
  fi
}

install_family() {
  local fam="$1" ipt="$2" loop
  [ "$fam" = 6 ] && loop="::1/128" || loop="127.0.0.0/8"
  local udp_table udp_rest
  read -r udp_table udp_rest <<<"$(udp_hook)"
  remove_family "$ipt"
  # TCP: everything to the proxy, except what must stay direct.
  local tt; tt="$(tcp_table)"
  run $ipt -t "$tt" -N "$CHAIN"
  if [ "$MODEL" = sidecar ]; then
    run $ipt -t nat -A "$CHAIN" -o lo -j RETURN
    run $ipt -t nat -A "$CHAIN" -d "$loop" -j RETURN
    run $ipt -t nat -A "$CHAIN" -m owner --uid-owner "$UID_EXEMPT" -j RETURN
  fi
  for d in "${DNS[@]}"; do
    if is_family "$fam" "$d"; then run $ipt -t "$tt" -A "$CHAIN" -p tcp -d "$d" --dport 53 -j RETURN; fi
  done
  if [ -n "$DNS_PORT" ] && [ "$TPROXY" = 1 ]; then
    # DNS over TCP goes to the DNS listener (nat, below), not to the transparent listener.
    run $ipt -t mangle -A "$CHAIN" -p tcp --dport 53 -j RETURN
  fi
  if [ "$TPROXY" = 1 ]; then
    run $ipt -t mangle -A "$CHAIN" -p tcp -j TPROXY --on-port "$PORT" --tproxy-mark "$TPROXY_MARK"
    tproxy_routing "$fam" add
  else
    run $ipt -t nat -A "$CHAIN" -p tcp -j REDIRECT --to-ports "$PORT"
  fi
  # shellcheck disable=SC2046
  run $ipt -t "$tt" -A $(nat_hook) -p tcp -j "$CHAIN"
  # DNS: every query on port 53, UDP and TCP, to the DNS listener (first in the nat hook).
  if [ -n "$DNS_PORT" ]; then
    local hook_chain hook_rest
    read -r hook_chain hook_rest <<<"$(nat_hook)"
    run $ipt -t nat -N "$DNS_CHAIN"
    if [ "$MODEL" = sidecar ]; then
      run $ipt -t nat -A "$DNS_CHAIN" -m owner --uid-owner "$UID_EXEMPT" -j RETURN
    fi
    run $ipt -t nat -A "$DNS_CHAIN" -p udp --dport 53 -j REDIRECT --to-ports "$DNS_PORT"
    run $ipt -t nat -A "$DNS_CHAIN" -p tcp --dport 53 -j REDIRECT --to-ports "$DNS_PORT"
    # shellcheck disable=SC2086
    run $ipt -t nat -I "$hook_chain" 1 $hook_rest -j "$DNS_CHAIN"
  fi
  # UDP: only DNS to the configured resolvers; QUIC (UDP 443) and the rest are dropped.
  run $ipt -t "$udp_table" -N "$UDP_CHAIN"
  if [ "$MODEL" = sidecar ]; then
    run $ipt -t "$udp_table" -A "$UDP_CHAIN" -o lo -j RETURN
    run $ipt -t "$udp_table" -A "$UDP_CHAIN" -m owner --uid-owner "$UID_EXEMPT" -j RETURN
  fi
  for d in "${DNS[@]}"; do
    if is_family "$fam" "$d"; then run $ipt -t "$udp_table" -A "$UDP_CHAIN" -p udp -d "$d" --dport 53 -j RETURN; fi
  done
  if [ -n "$DNS_PORT" ]; then
    if [ "$MODEL" = gateway ]; then
      # Seen here before nat PREROUTING redirects it to the DNS listener.
      run $ipt -t "$udp_table" -A "$UDP_CHAIN" -p udp --dport 53 -j RETURN
    else
      # Seen here after nat OUTPUT redirected it: let through what was redirected.
      run $ipt -t "$udp_table" -A "$UDP_CHAIN" -p udp -m conntrack --ctstate DNAT --ctorigdstport 53 -j RETURN
    fi
  fi
  run $ipt -t "$udp_table" -A "$UDP_CHAIN" -p udp -j DROP
  # shellcheck disable=SC2086
  run $ipt -t "$udp_table" -A $udp_rest -p udp -j "$UDP_CHAIN"
  # Every other protocol: ICMP echo and raw IP protocols would carry data past the proxy.
  run $ipt -t "$udp_table" -N "$OTHER_CHAIN"
  if [ "$MODEL" = gateway ]; then
    # No forged sources: the proxy identifies sandboxes by source address. Jumped to before
    # the UDP chain (inserted first below), so a forged DNS query never reaches the listener.
    run $ipt -t mangle -N "$SPOOF_CHAIN"
    local listed=0
    for s in "${SOURCES[@]}"; do
      if is_family "$fam" "$s"; then
        run $ipt -t mangle -A "$SPOOF_CHAIN" -s "$s" -j RETURN
        listed=1
      fi
    done
    if [ "$listed" = 1 ]; then
      if [ "$fam" = 6 ]; then
        # Link-local sources carry neighbour discovery; they never reach the proxy.
        run $ipt -t mangle -A "$SPOOF_CHAIN" -s fe80::/10 -j RETURN
      fi
      run $ipt -t mangle -A "$SPOOF_CHAIN" -j DROP
    else
      run $ipt -t mangle -A "$SPOOF_CHAIN" -m rpfilter --invert -j DROP
    fi
    run $ipt -t mangle -I PREROUTING 1 -i "$IFACE" -j "$SPOOF_CHAIN"
  fi
  if [ -n "$DNS_PORT" ]; then
    # DNS over TLS would carry names past the DNS listener. Matched on the original port:
    # a sidecar's connection was already redirected when filter OUTPUT sees it.
    if [ "$MODEL" = sidecar ]; then
      run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -p tcp -m conntrack --ctorigdstport 853 \
        -m owner ! --uid-owner "$UID_EXEMPT" -j DROP
    else
      run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -p tcp -m conntrack --ctorigdstport 853 -j DROP
    fi
  fi
  run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -p tcp -j RETURN
  run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -p udp -j RETURN
  if [ "$MODEL" = sidecar ]; then
    run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -o lo -j RETURN
  fi
  if [ "$fam" = 6 ]; then
    # Router and neighbour discovery keep IPv6 working; nothing else of ICMPv6 leaves.
    for t in 133 134 135 136; do
      run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -p ipv6-icmp --icmpv6-type "$t" -j RETURN
    done
  fi
  run $ipt -t "$udp_table" -A "$OTHER_CHAIN" -j DROP
  # shellcheck disable=SC2086
  run $ipt -t "$udp_table" -A $udp_rest -j "$OTHER_CHAIN"
}

for fam in "${FAMILIES[@]}"; do
  if [ "$fam" = 6 ]; then ipt=ip6tables; else ipt=iptables; fi
  if [ "$DRY" = 0 ] && ! command -v "$ipt" >/dev/null 2>&1; then
    echo "egress-iptables: $ipt not found" >&2; exit 1
  fi
  ipt="$ipt -w"   # wait for the xtables lock instead of failing when others change rules
  if [ "$ACTION" = install ]; then
    install_family "$fam" "$ipt"
  else
    remove_family "$ipt"
    [ "$TPROXY" = 1 ] && tproxy_routing "$fam" del
  fi
done
[ "$DRY" = 1 ] || echo "egress-iptables: $ACTION $MODEL done (${FAMILIES[*]/#/IPv})"
