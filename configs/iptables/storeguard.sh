#!/bin/sh
# storeguard transparent sidecar rules for iptables (works with iptables-legacy and iptables-nft).
# Same policy as configs/nftables/storeguard.nft; use one of the two, not both.
#
#   storeguard.sh [add]     install or refresh the rules (idempotent: safe to run again, e.g. with new ports)
#   storeguard.sh remove    remove every rule and chain this script created
#   storeguard.sh status    print the rules with packet counters
#
# Environment:
#   STORE_PORT=29500        MASTER_PORT, where the real torch TCPStore listens (wildcard, as torch always binds)
#   PROXY_PORT=29499        where storeguard listens (storeguard serve --listen :29499 --upstream 127.0.0.1:29500)
#   STOREGUARD_IPV6=auto    auto: IPv6 rules whenever the kernel has IPv6 (failure is fatal: torch's libuv
#                           store binds "::", so a missing v6 rule is an open door); on: required; off: skip
#   IPTABLES, IP6TABLES     binaries to use (default: iptables/ip6tables, switched to the -legacy
#                           variants when only the legacy backend holds rules, as kube-proxy does)
#
# What the rules do (see configs/README.md for the full reasoning):
#   nat    PREROUTING -> STOREGUARD-PREROUTING:
#            ! -i lo -p tcp --dport STORE_PORT -m addrtype --dst-type LOCAL -j REDIRECT --to-ports PROXY_PORT
#          Traffic from other hosts for the store goes to storeguard. Locally generated traffic never
#          traverses nat PREROUTING, so this host's own clients (rank 0, storeguard's upstream) are untouched.
#   filter INPUT -> STOREGUARD-INPUT:
#            ! -i lo -p tcp --dport STORE_PORT -j DROP
#          After the redirect the input hook sees dport PROXY_PORT, so this only drops traffic that
#          bypassed the redirect (e.g. connections whose conntrack entry predates the rules).
#          Loopback may reach the store.
set -eu

STORE_PORT=${STORE_PORT:-29500}
PROXY_PORT=${PROXY_PORT:-29499}
STOREGUARD_IPV6=${STOREGUARD_IPV6:-auto}
NAT_CHAIN=STOREGUARD-PREROUTING
FILTER_CHAIN=STOREGUARD-INPUT
TAG="storeguard"

log() { echo "storeguard-fw: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "$STORE_PORT$PROXY_PORT" in *[!0-9]*|"") die "STORE_PORT and PROXY_PORT must be numbers";; esac
[ "$STORE_PORT" != "$PROXY_PORT" ] || die "STORE_PORT and PROXY_PORT must differ"
for p in "$STORE_PORT" "$PROXY_PORT"; do
	[ "$p" -ge 1 ] && [ "$p" -le 65535 ] || die "port out of range: $p"
done

# Pick the backend that holds the host's rules (the same heuristic as kube-proxy's iptables-wrapper):
# rules added with the wrong backend are silently ignored by the other one's tables on the same host.
pick_backend() {
	if [ -n "${IPTABLES:-}" ]; then IP6TABLES=${IP6TABLES:-$(echo "$IPTABLES" | sed 's/iptables/ip6tables/')}; return; fi
	IPTABLES=iptables
	IP6TABLES=${IP6TABLES:-ip6tables}
	if command -v iptables-legacy-save >/dev/null 2>&1 && command -v iptables-nft-save >/dev/null 2>&1; then
		legacy=$( (iptables-legacy-save 2>/dev/null || true) | grep -c '^-' || true)
		nft=$( (iptables-nft-save 2>/dev/null || true) | grep -c '^-' || true)
		if [ "${legacy:-0}" -gt 0 ] && [ "${nft:-0}" -eq 0 ]; then
			IPTABLES=iptables-legacy
			IP6TABLES=ip6tables-legacy
		fi
	fi
}

ipv6_wanted() {
	case "$STOREGUARD_IPV6" in
		off) return 1;;
		on) return 0;;
		auto) [ -e /proc/net/if_inet6 ];;
		*) die "STOREGUARD_IPV6 must be auto, on or off";;
	esac
}

# restore_rules BIN: atomically (per table) declare our chains and fill them. With --noflush only the
# declared chains are flushed; every other rule on the host is left alone.
restore_rules() {
	bin=$1
	"$bin-restore" -w 5 --noflush <<EOF
*nat
:$NAT_CHAIN - [0:0]
-A $NAT_CHAIN ! -i lo -p tcp -m tcp --dport $STORE_PORT -m addrtype --dst-type LOCAL -m comment --comment "$TAG: remote -> proxy" -j REDIRECT --to-ports $PROXY_PORT
COMMIT
*filter
:$FILTER_CHAIN - [0:0]
-A $FILTER_CHAIN ! -i lo -p tcp -m tcp --dport $STORE_PORT -m comment --comment "$TAG: store port is loopback-only" -j DROP
COMMIT
EOF
}

# The jumps carry no port, so changing ports and running "add" again never leaves a stale jump.
jump_args() { # TABLE
	case $1 in
		nat) echo "PREROUTING -p tcp -m comment --comment $TAG -j $NAT_CHAIN";;
		filter) echo "INPUT -p tcp -m comment --comment $TAG -j $FILTER_CHAIN";;
	esac
}

add_family() { # BIN
	bin=$1
	restore_rules "$bin"
	for t in nat filter; do
		# shellcheck disable=SC2046
		if ! "$bin" -w 5 -t "$t" -C $(jump_args "$t") 2>/dev/null; then
			# Position 1: ahead of any broad ACCEPT already in INPUT and of other DNAT rules.
			set -- $(jump_args "$t")
			chain=$1; shift
			"$bin" -w 5 -t "$t" -I "$chain" 1 "$@"
		fi
	done
	log "$bin: remote tcp/$STORE_PORT -> :$PROXY_PORT, non-loopback tcp/$STORE_PORT dropped"
}

remove_family() { # BIN
	bin=$1
	for t in nat filter; do
		# shellcheck disable=SC2046
		while "$bin" -w 5 -t "$t" -D $(jump_args "$t") 2>/dev/null; do :; done
		case $t in nat) c=$NAT_CHAIN;; filter) c=$FILTER_CHAIN;; esac
		if "$bin" -w 5 -t "$t" -L "$c" -n >/dev/null 2>&1; then
			"$bin" -w 5 -t "$t" -F "$c"
			"$bin" -w 5 -t "$t" -X "$c"
		fi
	done
	log "$bin: storeguard rules removed"
}

status_family() { # BIN
	bin=$1
	echo "== $bin nat $NAT_CHAIN"
	"$bin" -w 5 -t nat -L "$NAT_CHAIN" -n -v -x 2>&1 || true
	echo "== $bin filter $FILTER_CHAIN"
	"$bin" -w 5 -t filter -L "$FILTER_CHAIN" -n -v -x 2>&1 || true
}

pick_backend
command -v "$IPTABLES" >/dev/null 2>&1 || die "$IPTABLES not found (install iptables, or use configs/nftables/storeguard.nft)"
verb=${1:-add}
case "$verb" in
	add)
		add_family "$IPTABLES"
		if ipv6_wanted; then
			command -v "$IP6TABLES" >/dev/null 2>&1 || die "$IP6TABLES not found but IPv6 is enabled (set STOREGUARD_IPV6=off only if nothing can reach this host over IPv6)"
			add_family "$IP6TABLES" || die "IPv6 rules failed: the store would be reachable over IPv6"
		else
			log "IPv6 rules skipped (STOREGUARD_IPV6=$STOREGUARD_IPV6)"
		fi
		;;
	remove|delete)
		remove_family "$IPTABLES"
		if command -v "$IP6TABLES" >/dev/null 2>&1 && [ -e /proc/net/if_inet6 ]; then remove_family "$IP6TABLES"; fi
		;;
	status)
		status_family "$IPTABLES"
		if command -v "$IP6TABLES" >/dev/null 2>&1 && [ -e /proc/net/if_inet6 ]; then status_family "$IP6TABLES"; fi
		;;
	-h|--help|help)
		sed -n '2,30p' "$0"
		;;
	*) die "unknown verb '$verb' (add | remove | status)";;
esac
