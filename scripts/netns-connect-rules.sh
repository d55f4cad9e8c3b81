#!/usr/bin/env bash
# Proves the client-side (mutual TLS) rules, `storeguard firewall install connect` (by netlink),
# configs/nftables/storeguard-connect.nft and configs/iptables/storeguard-connect.sh, in two private
# network namespaces joined by a veth pair. Nothing leaves them, and no storeguard connect is needed: a
# stand-in listens on the connect port and answers with the original destination it reads
# (SO_ORIGINAL_DST), as `storeguard connect --transparent` does.
#
#   master ns (10.78.0.1/24, fd78::1/64)             worker ns (10.78.0.2/24, fd78::2/64)
#     "store" on :MASTER_PORT and :OTHER_PORT          stand-in guard on :CONNECT_PORT, rules loaded
#                                                      a local "store" on :MASTER_PORT (a rank-0 agent's)
# Checks (each with storeguard firewall install connect, with nft, and with iptables on both backends when installed):
#   R1 a rank's connection to MASTER:MASTER_PORT lands on the guard, which reads MASTER:MASTER_PORT back (IPv4, R1b IPv6)
#   R2 the guard's own connection (its uid) reaches the master directly; R3 so does one carrying the mark
#   R4 a store on this host (127.0.0.1 and the host's own address) is reached directly
#   R5 another port of the master is not touched
#   R6 the connect port is not reachable from another host; R6c positive control: it is without the rules
# Env: STOREGUARD_BIN (default: go build ./cmd/storeguard) PY=/usr/bin/python3 GUARD_UID=65533 GUARD_MARK=0x5347 MASTER_PORT=29500 CONNECT_PORT=15001 OTHER_PORT=29400
# Exit 0 on pass, or with a line starting "SKIP" when namespaces cannot be made here; 1 on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GUARD_UID=${GUARD_UID:-65533}
GUARD_MARK=${GUARD_MARK:-0x5347}
MASTER_PORT=${MASTER_PORT:-29500}
CONNECT_PORT=${CONNECT_PORT:-15001}
OTHER_PORT=${OTHER_PORT:-29400}
PY=${PY:-/usr/bin/python3}         # the system's: the guard's uid must be able to run it
TAG=$$
NS_M=sg-cr-m-$TAG
NS_W=sg-cr-w-$TAG
WORK=$(mktemp -d /tmp/storeguard-connect-rules.XXXXXX)
chmod 755 "$WORK"
PASSED=0 FAILED=0
PIDS=()

pass() { PASSED=$((PASSED + 1)); echo "connect-rules: PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "connect-rules: FAIL $*"; }
skip() { echo "SKIP: connect-rules: $*"; exit 0; }
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	ip netns del "$NS_W" 2>/dev/null || true
	ip netns del "$NS_M" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "needs root (ip netns)"
if [ -z "${STOREGUARD_BIN:-}" ]; then
	(cd "$ROOT" && go build -o "$WORK/storeguard" ./cmd/storeguard) || { echo "connect-rules: FAIL go build"; exit 1; }
	STOREGUARD_BIN=$WORK/storeguard
fi
ip netns add "$NS_M" 2>"$WORK/err" || skip "'ip netns add' is not permitted here ($(head -c 200 "$WORK/err"))"
ip netns add "$NS_W"
ip -n "$NS_M" link add sgcm$TAG type veth peer name sgcw$TAG netns "$NS_W"
ip -n "$NS_M" addr add 10.78.0.1/24 dev sgcm$TAG
ip -n "$NS_W" addr add 10.78.0.2/24 dev sgcw$TAG
HAVE6=0
if [ -e /proc/net/if_inet6 ]; then
	ip -n "$NS_M" addr add fd78::1/64 dev sgcm$TAG nodad && ip -n "$NS_W" addr add fd78::2/64 dev sgcw$TAG nodad && HAVE6=1
fi
for ns in "$NS_M" "$NS_W"; do ip -n "$ns" link set lo up; done
ip -n "$NS_M" link set sgcm$TAG up
ip -n "$NS_W" link set sgcw$TAG up

# One small program plays every part: "serve NAME PORT" answers NAME; "guard PORT" answers "guard HOST:PORT"
# from SO_ORIGINAL_DST; "dial HOST PORT [MARK]" prints the answer (or "refused"/"timeout").
cat >"$WORK/peer.py" <<'EOF'
import socket, struct, sys, threading
SO_ORIGINAL_DST = 80  # also IP6T_SO_ORIGINAL_DST

def listen(port):
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port)); s.listen(64)
    return s

def original_dst(c):
    try:  # an IPv4 connection on a dual-stack socket: the IPv4 table
        raw = c.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, ip = struct.unpack("!H", raw[2:4])[0], socket.inet_ntop(socket.AF_INET, raw[4:8])
        return "%s:%d" % (ip, port)
    except OSError:
        pass
    try:
        raw = c.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
    except OSError:  # not redirected: no NAT entry (ENOENT); the real guard refuses such a connection
        return "none"
    else:
        port, ip = struct.unpack("!H", raw[2:4])[0], socket.inet_ntop(socket.AF_INET6, raw[8:24])
        return "[%s]:%d" % (ip, port)

def serve(answer, port):
    s = listen(port)
    while True:
        c, _ = s.accept()
        try:
            c.sendall((answer(c) + "\n").encode())
        except OSError as e:
            c.sendall(("error %s\n" % e).encode())
        c.close()

mode = sys.argv[1]
if mode == "serve":
    serve(lambda c: sys.argv[2], int(sys.argv[3]))
elif mode == "guard":
    serve(lambda c: "guard " + original_dst(c), int(sys.argv[2]))
elif mode == "dial":
    host, port = sys.argv[2], int(sys.argv[3])
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if len(sys.argv) > 4:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[4], 0))
    s.settimeout(2)
    try:
        s.connect((host, port)); print(s.makefile().readline().strip())
    except ConnectionRefusedError:
        print("refused")
    except (socket.timeout, TimeoutError):
        print("timeout")
EOF
bg() { "$@" >/dev/null 2>&1 & PIDS+=($!); }
bg ip netns exec "$NS_M" "$PY" "$WORK/peer.py" serve master "$MASTER_PORT"
bg ip netns exec "$NS_M" "$PY" "$WORK/peer.py" serve other "$OTHER_PORT"
bg ip netns exec "$NS_W" "$PY" "$WORK/peer.py" serve local "$MASTER_PORT"
bg ip netns exec "$NS_W" "$PY" "$WORK/peer.py" guard "$CONNECT_PORT"
for _ in $(seq 50); do
	n=$( (ip netns exec "$NS_M" ss -ltnH; ip netns exec "$NS_W" ss -ltnH) | wc -l)
	[ "$n" -ge 4 ] && break; sleep 0.1
done

dial() { ip netns exec "$NS_W" "$PY" "$WORK/peer.py" dial "$@"; }
dial_as_guard() { ip netns exec "$NS_W" setpriv --reuid "$GUARD_UID" --regid "$GUARD_UID" --clear-groups "$PY" "$WORK/peer.py" dial "$@"; }
expect() { # NAME WANT GOT
	if [ "$3" = "$2" ]; then pass "$1"; else fail "$1: want '$2', got '$3'"; fi
}

checks() { # LABEL
	local l=$1
	expect "$l R1 rank -> master:$MASTER_PORT lands on the guard with its original destination" "guard 10.78.0.1:$MASTER_PORT" "$(dial 10.78.0.1 "$MASTER_PORT")"
	if [ "$HAVE6" = 1 ]; then
		expect "$l R1b the same over IPv6" "guard [fd78::1]:$MASTER_PORT" "$(dial fd78::1 "$MASTER_PORT")"
	fi
	expect "$l R2 the guard's uid ($GUARD_UID) reaches the master directly" "master" "$(dial_as_guard 10.78.0.1 "$MASTER_PORT")"
	expect "$l R3 the guard's mark ($GUARD_MARK) reaches the master directly" "master" "$(dial 10.78.0.1 "$MASTER_PORT" "$GUARD_MARK")"
	expect "$l R4 a store on this host over loopback is reached directly" "local" "$(dial 127.0.0.1 "$MASTER_PORT")"
	expect "$l R4b ... and on this host's own address" "local" "$(dial 10.78.0.2 "$MASTER_PORT")"
	expect "$l R5 another port of the master is not touched" "other" "$(dial 10.78.0.1 "$OTHER_PORT")"
	expect "$l R6 the connect port is closed to other hosts" "timeout" "$(ip netns exec "$NS_M" "$PY" "$WORK/peer.py" dial 10.78.0.2 "$CONNECT_PORT")"
}

expect "R6c positive control: without rules another host reaches the connect port (no original destination)" "guard none" \
	"$(ip netns exec "$NS_M" "$PY" "$WORK/peer.py" dial 10.78.0.2 "$CONNECT_PORT")"

# storeguard firewall install connect: the same rules, loaded by netlink (no nft binary).
SG=(ip netns exec "$NS_W" "$STOREGUARD_BIN" firewall)
FLAGS=(--connect-port "$CONNECT_PORT" --guard-uid "$GUARD_UID" --guard-mark "$GUARD_MARK")
"${SG[@]}" install connect --master-ports "$MASTER_PORT" "${FLAGS[@]}" >/dev/null
"${SG[@]}" install connect --master-ports "$MASTER_PORT,$OTHER_PORT" "${FLAGS[@]}" >/dev/null
expect "storeguard install with another port list: the new port is redirected" "guard 10.78.0.1:$OTHER_PORT" "$(dial 10.78.0.1 "$OTHER_PORT")"
"${SG[@]}" install connect --master-ports "$MASTER_PORT" "${FLAGS[@]}" >/dev/null
"${SG[@]}" install connect --master-ports "$MASTER_PORT" "${FLAGS[@]}" >/dev/null # twice: idempotent
checks storeguard
n=$("${SG[@]}" check connect --master-ports "$MASTER_PORT" "${FLAGS[@]}" | awk '/chain output:/ {print $3}')
[ "${n:-0}" -ge 1 ] && pass "storeguard check: the redirect counted $n packets" || fail "storeguard check: redirect counter is ${n:-missing}"
"${SG[@]}" remove connect >/dev/null
"${SG[@]}" check connect --master-ports "$MASTER_PORT" "${FLAGS[@]}" >/dev/null 2>&1 \
	&& fail "storeguard check passed after remove" || pass "storeguard remove: the table is gone (check fails)"
expect "storeguard remove: another host reaches the connect port again" "guard none" \
	"$(ip netns exec "$NS_M" "$PY" "$WORK/peer.py" dial 10.78.0.2 "$CONNECT_PORT")"

if command -v nft >/dev/null; then
	sed -e "s/^define master_ports = .*/define master_ports = { $MASTER_PORT }/" \
		-e "s/^define connect_port = [0-9]*/define connect_port = $CONNECT_PORT/" \
		-e "s/^define guard_uid = [0-9]*/define guard_uid = $GUARD_UID/" \
		-e "s/^define guard_mark = [0-9a-fx]*/define guard_mark = $GUARD_MARK/" \
		"$ROOT/configs/nftables/storeguard-connect.nft" >"$WORK/connect.nft"
	ip netns exec "$NS_W" nft -f "$WORK/connect.nft"
	ip netns exec "$NS_W" nft -f "$WORK/connect.nft" # twice: idempotent
	checks nft
	n=$(ip netns exec "$NS_W" nft list chain inet storeguard_connect output | sed -n 's/.*counter packets \([0-9]*\).*redirect.*/\1/p')
	[ "${n:-0}" -ge 1 ] && pass "nft redirect counter rose ($n)" || fail "nft redirect counter is ${n:-missing}"
	ip netns exec "$NS_W" nft delete table inet storeguard_connect
else
	echo "connect-rules: nft not installed, nft checks skipped"
fi

for ipt in iptables-nft iptables-legacy; do
	command -v "$ipt" >/dev/null || { echo "connect-rules: $ipt not installed, skipped"; continue; }
	env IPTABLES="$ipt" MASTER_PORTS="$MASTER_PORT" CONNECT_PORT="$CONNECT_PORT" GUARD_UID="$GUARD_UID" GUARD_MARK="$GUARD_MARK" \
		ip netns exec "$NS_W" sh "$ROOT/configs/iptables/storeguard-connect.sh" add 2>/dev/null
	env IPTABLES="$ipt" MASTER_PORTS="$MASTER_PORT,$OTHER_PORT" CONNECT_PORT="$CONNECT_PORT" GUARD_UID="$GUARD_UID" GUARD_MARK="$GUARD_MARK" \
		ip netns exec "$NS_W" sh "$ROOT/configs/iptables/storeguard-connect.sh" add 2>/dev/null
	expect "$ipt add with another port list: the new port is redirected" "guard 10.78.0.1:$OTHER_PORT" "$(dial 10.78.0.1 "$OTHER_PORT")"
	env IPTABLES="$ipt" MASTER_PORTS="$MASTER_PORT" CONNECT_PORT="$CONNECT_PORT" GUARD_UID="$GUARD_UID" GUARD_MARK="$GUARD_MARK" \
		ip netns exec "$NS_W" sh "$ROOT/configs/iptables/storeguard-connect.sh" add 2>/dev/null
	checks "$ipt"
	jumps=$(ip netns exec "$NS_W" "$ipt-save" | grep -c -- '-j STOREGUARD-CONNECT' || true)
	expect "$ipt one jump per chain after three adds (IPv4)" 2 "$jumps"
	env IPTABLES="$ipt" ip netns exec "$NS_W" sh "$ROOT/configs/iptables/storeguard-connect.sh" remove 2>/dev/null
	left=$( (ip netns exec "$NS_W" "$ipt-save"; ip netns exec "$NS_W" "${ipt/iptables/ip6tables}-save") | grep -c STOREGUARD || true)
	expect "$ipt remove leaves nothing" 0 "$left"
done

echo "connect-rules: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
