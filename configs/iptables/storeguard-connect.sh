#!/bin/sh
# storeguard client-side rules (mutual TLS) for iptables (works with iptables-legacy and iptables-nft).
# Same policy as configs/nftables/storeguard-connect.nft; use one of the two, not both.
#
#   storeguard-connect.sh [add]     install or refresh the rules (idempotent: safe to run again, e.g. with new ports)
#   storeguard-connect.sh remove    remove every rule and chain this script created
#   storeguard-connect.sh status    print the rules with packet counters
#
# Environment:
#   MASTER_PORTS=29500      store port(s) ranks connect to on other hosts, comma-separated (up to 15):
#                           MASTER_PORT, and the c10d rendezvous port if it differs (storeguard connect --master-port)
#   CONNECT_PORT=15001      where the client guard listens (storeguard connect --listen :15001 --transparent)
#   GUARD_UID=65533         the uid storeguard connect runs as (a number or a user name); "" = match by mark only
#   GUARD_MARK=0x5347       the mark on the guard's own sockets (storeguard connect --mark 0x5347); "" = by uid only
#   STOREGUARD_IPV6=auto    auto: IPv6 rules whenever the kernel has IPv6 (failure is fatal: ranks resolving
#                           MASTER_ADDR to IPv6 would go out in plaintext and be refused); on: required; off: skip
#   IPTABLES, IP6TABLES     binaries to use (default: iptables/ip6tables, switched to the -legacy
#                           variants when only the legacy backend holds rules, as kube-proxy does)
#
# What the rules do (see configs/README.md, "Variant 3: mutual TLS"):
#   nat    OUTPUT -> STOREGUARD-CONNECT:
#            -o lo -j RETURN                                 a store on this host is reached directly
#            -m owner --uid-owner GUARD_UID -j RETURN        the guard's own connections to the master
#            -m mark --mark GUARD_MARK -j RETURN             (either one: no loop back into the guard)
#            -p tcp -m multiport --dports MASTER_PORTS -j REDIRECT --to-ports CONNECT_PORT
#          A rank's connection to MASTER_ADDR:MASTER_PORT goes to the client guard, which reads the
#          original destination (SO_ORIGINAL_DST) and dials it over mutual TLS.
#   filter INPUT -> STOREGUARD-CONNECT-INPUT:
#            ! -i lo -p tcp --dport CONNECT_PORT -j DROP
#          Only this host may use the guard (and its certificate); redirected connections arrive on lo.
set -eu

MASTER_PORTS=${MASTER_PORTS:-29500}
CONNECT_PORT=${CONNECT_PORT:-15001}
GUARD_UID=${GUARD_UID-65533}
GUARD_MARK=${GUARD_MARK-0x5347}
STOREGUARD_IPV6=${STOREGUARD_IPV6:-auto}
NAT_CHAIN=STOREGUARD-CONNECT
FILTER_CHAIN=STOREGUARD-CONNECT-INPUT
TAG="storeguard-connect"

log() { echo "storeguard-connect-fw: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "$CONNECT_PORT" in *[!0-9]*|"") die "CONNECT_PORT must be a number";; esac
case "$MASTER_PORTS" in *[!0-9,]*|"") die "MASTER_PORTS must be comma-separated numbers";; esac
for p in $(echo "$MASTER_PORTS" | tr ',' ' ') "$CONNECT_PORT"; do
	[ "$p" -ge 1 ] && [ "$p" -le 65535 ] || die "port out of range: $p"
done
case ",$MASTER_PORTS," in *",$CONNECT_PORT,"*) die "CONNECT_PORT must not be one of MASTER_PORTS";; esac
[ -n "$GUARD_UID$GUARD_MARK" ] || die "set GUARD_UID or GUARD_MARK (or both): without one the guard's own connections loop back into it"

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
	{
		echo "*nat"
		echo ":$NAT_CHAIN - [0:0]"
		echo "-A $NAT_CHAIN -o lo -m comment --comment \"$TAG: local store, direct\" -j RETURN"
		[ -z "$GUARD_UID" ] || echo "-A $NAT_CHAIN -m owner --uid-owner $GUARD_UID -m comment --comment \"$TAG: the guard's own (uid)\" -j RETURN"
		[ -z "$GUARD_MARK" ] || echo "-A $NAT_CHAIN -m mark --mark $GUARD_MARK -m comment --comment \"$TAG: the guard's own (mark)\" -j RETURN"
		echo "-A $NAT_CHAIN -p tcp -m multiport --dports $MASTER_PORTS -m comment --comment \"$TAG: rank -> client guard\" -j REDIRECT --to-ports $CONNECT_PORT"
		echo "COMMIT"
		echo "*filter"
		echo ":$FILTER_CHAIN - [0:0]"
		echo "-A $FILTER_CHAIN ! -i lo -p tcp -m tcp --dport $CONNECT_PORT -m comment --comment \"$TAG: connect port is loopback-only\" -j DROP"
		echo "COMMIT"
	} | "$bin-restore" -w 5 --noflush
}

# The jumps carry no port, so changing ports and running "add" again never leaves a stale jump.
jump_args() { # TABLE
	case $1 in
		nat) echo "OUTPUT -p tcp -m comment --comment $TAG -j $NAT_CHAIN";;
		filter) echo "INPUT -p tcp -m comment --comment $TAG -j $FILTER_CHAIN";;
	esac
}

add_family() { # BIN
	bin=$1
	restore_rules "$bin"
	for t in nat filter; do
		# shellcheck disable=SC2046
		if ! "$bin" -w 5 -t "$t" -C $(jump_args "$t") 2>/dev/null; then
			# Position 1: ahead of other nat OUTPUT rules (a mesh's own redirect) and of any broad ACCEPT in INPUT.
			set -- $(jump_args "$t")
			chain=$1; shift
			"$bin" -w 5 -t "$t" -I "$chain" 1 "$@"
		fi
	done
	log "$bin: tcp/$MASTER_PORTS to other hosts -> :$CONNECT_PORT (guard uid ${GUARD_UID:-none}, mark ${GUARD_MARK:-none} skipped), non-loopback tcp/$CONNECT_PORT dropped"
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
	log "$bin: storeguard-connect rules removed"
}

status_family() { # BIN
	bin=$1
	echo "== $bin nat $NAT_CHAIN"
	"$bin" -w 5 -t nat -L "$NAT_CHAIN" -n -v -x 2>&1 || true
	echo "== $bin filter $FILTER_CHAIN"
	"$bin" -w 5 -t filter -L "$FILTER_CHAIN" -n -v -x 2>&1 || true
}

pick_backend
command -v "$IPTABLES" >/dev/null 2>&1 || die "$IPTABLES not found (install iptables, or use configs/nftables/storeguard-connect.nft)"
verb=${1:-add}
case "$verb" in
	add)
		add_family "$IPTABLES"
		if ipv6_wanted; then
			command -v "$IP6TABLES" >/dev/null 2>&1 || die "$IP6TABLES not found but IPv6 is enabled (set STOREGUARD_IPV6=off only if MASTER_ADDR never resolves to IPv6)"
			add_family "$IP6TABLES" || die "IPv6 rules failed: ranks reaching the master over IPv6 would not go through the guard"
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
		sed -n '2,31p' "$0"
		;;
	*) die "unknown verb '$verb' (add | remove | status)";;
esac
