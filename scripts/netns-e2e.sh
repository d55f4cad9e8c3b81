#!/usr/bin/env bash
# End-to-end test of the transparent sidecar deployment (configs/README.md) with a real torch TCPStore,
# in two private network namespaces joined by a veth pair. Nothing leaves those namespaces.
#
#   master ns (10.77.0.1/24, + IPv6 link-local)       worker ns (10.77.0.2/24, + IPv6 link-local)
#     torch TCPStore on :STORE_PORT (wildcard bind)      rank 1 / probes -> 10.77.0.1:STORE_PORT
#     storeguard :PROXY_PORT -> 127.0.0.1:STORE_PORT
#     firewall: storeguard firewall install sidecar (by netlink), or configs/nftables/storeguard.nft, or configs/iptables/storeguard.sh
#
# Checks:
#   A  a real two-process gloo job (rank 0 in master ns, rank 1 in worker ns, init_method tcp://10.77.0.1:STORE_PORT,
#      all_reduce) completes, and rank 1's store traffic went through storeguard (redirect counter, metrics)
#   B  the issue #106294 bytes from the worker are cut off by storeguard, the audit log has the violation from
#      10.77.0.2 (key_too_long, generation G0 on torch <= 2.0), and the store is still alive (loopback client)
#   B6 the same over IPv6 (link-local; torch's libuv store binds "::"), when the kernel has IPv6
#   C  the worker cannot reach the store except through storeguard:
#      C1 storeguard stopped   -> the worker's connection to STORE_PORT is refused (it lands on the closed proxy port)
#      C2 redirect removed     -> the worker's connection times out (the input drop catches the bypass)
#      C3 positive control     -> with no rules at all the worker does reach the store directly (so C1/C2 are meaningful)
#   D  torchrun across the two namespaces (a 2.x torchrun: TORCHRUN_PY), the rules back, a guard with --generation auto:
#      D1 static rendezvous (--master-addr/--master-port): rank 0's agent hosts the ranks' store on STORE_PORT, the
#         worker's agent and rank reach it only through storeguard, which counts no unguarded store
#      D2 c10d rendezvous through storeguard: the ranks' own store is on a free port of rank 0's host; storeguard
#         counts it (storeguard_unguarded_job_stores_total 1) and logs that port
#
# Env: STOREGUARD_BIN   storeguard binary (default: go build ./cmd/storeguard into a temp dir)
#      TORCH_PY         python with torch (default /usr/bin/python3, Debian's python3-torch 1.13)
#      E2E_FW           storeguard | nft | iptables (default storeguard: storeguard firewall loads the rules by
#                       netlink, no nft binary; nft loads configs/nftables/storeguard.nft);
#                       with iptables, IPTABLES=iptables-legacy selects the legacy backend
#      STORE_PORT=29500 PROXY_PORT=29499 METRICS_PORT=9529
#      TORCHRUN_PY      python of a torch 2.x with torchrun beside it, for D (default: the 2.15.0 env of scripts/torch-envs.sh;
#                       D is skipped, with a line saying so, when it is missing)
#      E2E_KEEP=1       keep the work dir (audit log, process logs) after the run
#      E2E_NO_INSTALL=1 do not apt-get install nftables when neither nft nor iptables is present (then: SKIP)
# Exit: 0 on pass, or with a line starting "SKIP" when namespaces cannot be made here; 1 on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STORE_PORT=${STORE_PORT:-29500}
PROXY_PORT=${PROXY_PORT:-29499}
METRICS_PORT=${METRICS_PORT:-9529}
TORCH_PY=${TORCH_PY:-/usr/bin/python3}
TORCHRUN_PY=${TORCHRUN_PY:-/var/cache/storeguard/torch/2.15.0/bin/python}   # D: Debian 1.13's torchrun does not run on Python 3.11
M_ADDR=10.77.0.1
W_ADDR=10.77.0.2
TAG=$$
NS_M=sg-e2e-m-$TAG
NS_W=sg-e2e-w-$TAG
VM=sgm$TAG      # veth end in the master ns (IFNAMSIZ: <= 15 chars)
VW=sgw$TAG      # veth end in the worker ns
WORK=$(mktemp -d /tmp/storeguard-netns-e2e.XXXXXX)
AUDIT=$WORK/audit.jsonl
PASSED=0
FAILED=0
PIDS=()
SG_PID=""
STORE_PID=""

log() { echo "netns-e2e: $*" >&2; }
pass() { PASSED=$((PASSED + 1)); echo "netns-e2e: PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "netns-e2e: FAIL $*"; }
die() { echo "netns-e2e: FAIL $*"; FAILED=$((FAILED + 1)); summary; exit 1; }
summary() { echo "netns-e2e: $PASSED passed, $FAILED failed"; }
skip() { echo "SKIP: netns-e2e: $*"; exit 0; }
inm() { ip netns exec "$NS_M" "$@"; }
inw() { ip netns exec "$NS_W" "$@"; }

cleanup() {
	local rc=$?
	set +e
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	sleep 0.3
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	ip netns del "$NS_W" 2>/dev/null
	ip netns del "$NS_M" 2>/dev/null
	if [ "${E2E_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
		log "logs kept in $WORK"
		for f in "$WORK"/*.log; do [ -s "$f" ] && { echo "--- $f (tail)" >&2; tail -n 25 "$f" >&2; }; done
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "netns-e2e: FAIL unexpected error (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT TERM

# --- preconditions -----------------------------------------------------------
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
if ! ip netns add "$NS_M" 2>"$WORK/netns.err"; then
	skip "'ip netns add' is not permitted here ($(head -c 200 "$WORK/netns.err"))"
fi
ip netns add "$NS_W" || skip "'ip netns add' failed for the second namespace"

E2E_FW=${E2E_FW:-storeguard}
if [ "$E2E_FW" != storeguard ] && ! command -v nft >/dev/null && ! command -v iptables >/dev/null && [ "${E2E_NO_INSTALL:-0}" != 1 ] \
	&& [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	log "installing nftables (E2E_NO_INSTALL=1 to skip instead)"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q install --no-install-recommends nftables >&2 \
		|| { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q update >&2 \
		     && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q install --no-install-recommends nftables >&2; } \
		|| log "apt-get install nftables failed"
fi
case "$E2E_FW" in
	storeguard) ;;
	nft) command -v nft >/dev/null || skip "nft not installed (apt-get install nftables)";;
	iptables) command -v iptables >/dev/null || skip "iptables not installed (apt-get install iptables)";;
	*) die "E2E_FW=$E2E_FW: want storeguard, nft or iptables";;
esac

"$TORCH_PY" -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null \
	|| skip "$TORCH_PY has no torch.distributed (set TORCH_PY; scripts/torch-envs.sh installs one)"
TORCH_VER=$("$TORCH_PY" -c 'import torch; print(torch.__version__)')
TORCH_MM=$(echo "$TORCH_VER" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2/')
case "$TORCH_MM" in 1.*|2.0) EXPECT_GEN=G0;; *) EXPECT_GEN="";; esac   # newer: whatever storeguard maps the release to

if [ -z "${STOREGUARD_BIN:-}" ]; then
	command -v go >/dev/null || skip "no STOREGUARD_BIN and no go toolchain"
	log "building storeguard"
	(cd "$ROOT" && go build -o "$WORK/storeguard" ./cmd/storeguard) || die "go build ./cmd/storeguard failed"
	STOREGUARD_BIN=$WORK/storeguard
fi
[ -x "$STOREGUARD_BIN" ] || die "STOREGUARD_BIN=$STOREGUARD_BIN is not executable"
log "torch $TORCH_VER ($TORCH_PY), firewall $E2E_FW, store :$STORE_PORT, storeguard :$PROXY_PORT, binary $STOREGUARD_BIN"

# --- helpers (python snippets run inside a namespace) --------------------------
cat >"$WORK/connect.py" <<'EOF'
# connect.py HOST PORT TIMEOUT -> prints connected | refused | timeout | error:<e>
import socket, sys
host, port, t = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    ai = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
    s = socket.socket(ai[0], socket.SOCK_STREAM)
    s.settimeout(t)
    s.connect(ai[4])
    print("connected")
except ConnectionRefusedError:
    print("refused")
except (socket.timeout, TimeoutError):
    print("timeout")
except OSError as e:
    print("error:%s" % e)
EOF

cat >"$WORK/probe.py" <<'EOF'
# probe.py HOST PORT: send the issue #106294 bytes and report what the far end did.
#   closed   the peer closed (EOF or RST) within the timeout   <- storeguard's answer
#   open     nothing happened for 5 s                          <- a bare store blocks in recv of a 0xe0060b0000-byte key
#   refused / timeout / error:...  the connection itself failed
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
payload = bytes.fromhex("03 00 00 0b 06 e0 00 00 00 00 00")
assert len(payload) == 11
ai = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
s = socket.socket(ai[0], socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(ai[4])
except ConnectionRefusedError:
    print("refused"); sys.exit()
except (socket.timeout, TimeoutError):
    print("timeout"); sys.exit()
s.sendall(payload)
try:
    data = s.recv(64)
    print("closed" if data == b"" else "data:" + data.hex())
except ConnectionResetError:
    print("closed")
except (socket.timeout, TimeoutError):
    print("open")
EOF

cat >"$WORK/store.py" <<'EOF'
# store.py PORT SECONDS: a torch TCPStore master (binds the wildcard, as torch always does).
import datetime, sys, time
import torch.distributed as d
port, secs = int(sys.argv[1]), float(sys.argv[2])
s = d.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=secs), wait_for_workers=False)
s.set("e2e/alive", "yes")
print("store up", flush=True)
time.sleep(secs)
EOF

cat >"$WORK/client.py" <<'EOF'
# client.py HOST PORT: a torch TCPStore client: get e2e/alive, set e2e/from-<argv3>; prints ok or the error.
import datetime, sys
import torch.distributed as d
host, port, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    s = d.TCPStore(host, port, None, False, datetime.timedelta(seconds=10))
    assert s.get("e2e/alive") == b"yes", "e2e/alive missing"
    s.set("e2e/from-" + who, "ok")
    print("ok")
except Exception as e:
    print("error:%s" % str(e).splitlines()[0] if str(e) else "error:%r" % e)
EOF

cat >"$WORK/steady.py" <<'EOF'
# steady.py HOST PORT SECONDS: one torch TCPStore client adding every 20 ms on one connection for SECONDS;
# prints "ok N" when every add succeeded and the counter is exactly N, else the error.
import datetime, sys, time
import torch.distributed as d
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    s = d.TCPStore(host, port, None, False, datetime.timedelta(seconds=20))
    n, end = 0, time.time() + secs
    while time.time() < end:
        s.add("e2e/steady", 1)
        n += 1
        time.sleep(0.02)
    total = s.add("e2e/steady", 0)
    print("ok %d" % n if total == n else "error:counter %d after %d adds" % (total, n))
except Exception as e:
    print("error:%s" % str(e).splitlines()[0] if str(e) else "error:%r" % e)
EOF

cat >"$WORK/audit_check.py" <<'EOF'
# audit_check.py AUDIT_LOG SOURCE_PREFIX RULES EXPECT_GEN: find a blocked event from the source; prints it or "missing".
import json, sys, time
path, src, rules, gen = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
deadline = time.time() + 10
while True:
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not str(e.get("source.ip", "")).startswith(src) or e.get("event.reason") not in rules:
            continue
        if e.get("event.action") != "blocked":
            continue
        if gen and e.get("storeguard.generation") != gen:
            print("wrong-generation:" + line); sys.exit(1)
        if not e.get("storeguard.generation"):
            print("no-generation:" + line); sys.exit(1)
        print(line); sys.exit(0)
    if time.time() > deadline:
        print("missing (%d lines in the audit log)" % len(lines)); sys.exit(1)
    time.sleep(0.2)
EOF

cat >"$WORK/metric.py" <<'EOF'
# metric.py URL NAME [LABEL=VALUE...]: sum of the matching series in a Prometheus text page
import sys, urllib.request
url, name, want = sys.argv[1], sys.argv[2], sys.argv[3:]
total = 0.0
for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
    if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
        continue
    series, value = line.rsplit(" ", 1)
    if all(('%s="%s"' % tuple(w.split("=", 1))) in series for w in want):
        total += float(value)
print(int(total) if total == int(total) else total)
EOF

# wait_listen NS PORT SECONDS
wait_listen() {
	local ns=$1 port=$2 n=$(($3 * 10))
	while [ $n -gt 0 ]; do
		if ip netns exec "$ns" ss -ltnH "sport = :$port" | grep -q LISTEN; then return 0; fi
		sleep 0.1; n=$((n - 1))
	done
	return 1
}
http_ok() { inm "$TORCH_PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=3)" "$1" 2>/dev/null; }
metric() { inm "$TORCH_PY" "$WORK/metric.py" "http://127.0.0.1:$METRICS_PORT/metrics" "$@"; }

# --- firewall -------------------------------------------------------------------
# iptables variant: IPTABLES=iptables-legacy (and IP6TABLES) pass through to configs/iptables/storeguard.sh.
IPT4=${IPTABLES:-iptables}
IPT6=${IP6TABLES:-$(echo "$IPT4" | sed 's/iptables/ip6tables/')}
fw_add() {
	case $E2E_FW in
		storeguard) inm "$STOREGUARD_BIN" firewall install sidecar --store-port "$STORE_PORT" --proxy-port "$PROXY_PORT" >/dev/null \
		            && inm "$STOREGUARD_BIN" firewall check sidecar --store-port "$STORE_PORT" --proxy-port "$PROXY_PORT" >/dev/null;;
		nft) sed -e "s/^define store_port = [0-9]*/define store_port = $STORE_PORT/" \
		         -e "s/^define proxy_port = [0-9]*/define proxy_port = $PROXY_PORT/" \
		         "$ROOT/configs/nftables/storeguard.nft" | inm nft -f -;;
		iptables) inm env STORE_PORT="$STORE_PORT" PROXY_PORT="$PROXY_PORT" STOREGUARD_IPV6="$V6" \
		         sh "$ROOT/configs/iptables/storeguard.sh" add;;
	esac
}
fw_remove_redirect() {
	case $E2E_FW in
		storeguard) inm "$STOREGUARD_BIN" firewall install explicit --private-port "$STORE_PORT" >/dev/null;; # the drop alone
		nft) inm nft flush chain inet storeguard prerouting;;
		iptables) inm "$IPT4" -w -t nat -F STOREGUARD-PREROUTING
		          [ "$V6" = off ] || inm "$IPT6" -w -t nat -F STOREGUARD-PREROUTING;;
	esac
}
fw_remove_all() {
	case $E2E_FW in
		storeguard) inm "$STOREGUARD_BIN" firewall remove sidecar >/dev/null;;
		nft) inm nft delete table inet storeguard;;
		iptables) inm env STOREGUARD_IPV6="$V6" sh "$ROOT/configs/iptables/storeguard.sh" remove;;
	esac
}
# fw_count redirect|drop: packets matched, both address families
fw_count() {
	case $E2E_FW in
		storeguard) local rs=sidecar chain=prerouting args=(--store-port "$STORE_PORT" --proxy-port "$PROXY_PORT")
		     [ "$1" = drop ] && chain=input
		     # after fw_remove_redirect, the table holds the explicit ruleset (its drop only)
		     if ! inm "$STOREGUARD_BIN" firewall check sidecar "${args[@]}" >/dev/null 2>&1; then rs=explicit args=(--private-port "$STORE_PORT"); fi
		     inm "$STOREGUARD_BIN" firewall check "$rs" "${args[@]}" | awk -v c="chain $chain:" 'index($0, c) {s+=$3} END {print s+0}';;
		nft) local chain=prerouting; [ "$1" = drop ] && chain=input
		     inm nft list chain inet storeguard "$chain" | sed -n 's/.*counter packets \([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s+0}';;
		iptables) local t=nat c=STOREGUARD-PREROUTING; [ "$1" = drop ] && { t=filter; c=STOREGUARD-INPUT; }
		     { inm "$IPT4" -w -t $t -L $c -n -v -x; [ "$V6" = off ] || inm "$IPT6" -w -t $t -L $c -n -v -x; } 2>/dev/null \
		         | awk '$1 ~ /^[0-9]+$/ {s+=$1} END {print s+0}';;
	esac
}

# start_storeguard [GENERATION]: the guard for TORCH_PY's release unless told
start_storeguard() {
	# Background jobs call "ip netns exec" directly (not through inm): $! must be the process itself.
	# As the sidecar runs it (configs/kubernetes/sidecar/pod-sidecar.yaml): under its keeper, with a pid file.
	ip netns exec "$NS_M" "$STOREGUARD_BIN" serve --keeper --listen ":$PROXY_PORT" --upstream "127.0.0.1:$STORE_PORT" \
		--metrics-listen "127.0.0.1:$METRICS_PORT" --audit-log "$AUDIT" --generation "${1:-$TORCH_MM}" --mode enforce \
		--pid-file "$WORK/worker.pid" >>"$WORK/storeguard.log" 2>&1 &
	SG_PID=$!
	PIDS+=("$SG_PID")
	wait_listen "$NS_M" "$PROXY_PORT" 15 || die "storeguard did not listen on :$PROXY_PORT"
	local n=50
	until http_ok "http://127.0.0.1:$METRICS_PORT/healthz"; do
		n=$((n - 1)); [ $n -gt 0 ] || die "storeguard /healthz not answering"; sleep 0.1
	done
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# --- topology ---------------------------------------------------------------------
inm ip link set lo up
inw ip link set lo up
inm ip link add "$VM" type veth peer name "$VW" netns "$NS_W"
inm ip addr add "$M_ADDR/24" dev "$VM"
inw ip addr add "$W_ADDR/24" dev "$VW"
inm ip link set "$VM" up
inw ip link set "$VW" up

V6=off
M_LL=""
if [ -e /proc/net/if_inet6 ]; then
	# Link-local addresses appear by themselves on the veth ends: no address outside this pair is used.
	for _ in $(seq 50); do
		M_LL=$(inm ip -6 -o addr show dev "$VM" scope link | awk '!/tentative/ {split($4, a, "/"); print a[1]; exit}')
		W_LL=$(inw ip -6 -o addr show dev "$VW" scope link | awk '!/tentative/ {split($4, a, "/"); print a[1]; exit}')
		[ -n "$M_LL" ] && [ -n "$W_LL" ] && break
		sleep 0.1
	done
	[ -n "$M_LL" ] && V6=on || log "no IPv6 link-local address on the veth: IPv6 checks skipped"
else
	log "kernel without IPv6: IPv6 checks skipped"
fi
inw "$TORCH_PY" "$WORK/connect.py" "$M_ADDR" 9 2 >/dev/null  # warm ARP; port 9 is closed in the fresh namespace

fw_add || die "installing the $E2E_FW rules failed"
pass "firewall rules ($E2E_FW) installed in the master namespace"

# --- A: real gloo job, rank 1 through storeguard ---------------------------------
start_storeguard
R0=$(fw_count redirect)
INIT="tcp://$M_ADDR:$STORE_PORT"
ip netns exec "$NS_M" env GLOO_SOCKET_IFNAME="$VM" timeout 120 "$TORCH_PY" "$ROOT/scripts/gloo-rank.py" 0 "$INIT" >"$WORK/rank0.log" 2>&1 &
RANK0=$!
PIDS+=("$RANK0")
# Start rank 1 only once the store listens: a client that reaches storeguard before the store exists gets a
# closed connection (storeguard cannot dial upstream), not the "connection refused" torch retries on.
wait_listen "$NS_M" "$STORE_PORT" 60 || die "rank 0's TCPStore never listened on :$STORE_PORT"
ip netns exec "$NS_W" env GLOO_SOCKET_IFNAME="$VW" timeout 120 "$TORCH_PY" "$ROOT/scripts/gloo-rank.py" 1 "$INIT" >"$WORK/rank1.log" 2>&1 &
RANK1=$!
PIDS+=("$RANK1")
rc0=0; rc1=0
wait "$RANK0" || rc0=$?
wait "$RANK1" || rc1=$?
if [ $rc0 = 0 ] && [ $rc1 = 0 ] && grep -q "all_reduce ok: 3.0" "$WORK/rank1.log"; then
	pass "A1 two-process gloo job (rank 1 in the worker namespace) completed all_reduce via $INIT"
else
	fail "A1 gloo job: rank0 rc=$rc0 rank1 rc=$rc1"
	tail -n 15 "$WORK/rank0.log" "$WORK/rank1.log" >&2
fi
R1=$(fw_count redirect)
ACC=$(metric storeguard_connections_accepted_total) || ACC=-1
MSGS=$(metric storeguard_messages_total) || MSGS=-1
if [ "$R1" -gt "$R0" ] && [ "$ACC" -ge 1 ] && [ "$MSGS" -ge 1 ]; then
	pass "A2 rank 1's store traffic went through storeguard (redirected packets $R0 -> $R1, accepted $ACC, messages $MSGS)"
else
	fail "A2 store traffic not seen by storeguard (redirected packets $R0 -> $R1, accepted $ACC, messages $MSGS)"
fi

# --- B: the #106294 bytes from the worker ------------------------------------------
ip netns exec "$NS_M" timeout 600 "$TORCH_PY" "$WORK/store.py" "$STORE_PORT" 300 >"$WORK/store.log" 2>&1 &
STORE_PID=$!
PIDS+=("$STORE_PID")
wait_listen "$NS_M" "$STORE_PORT" 30 || die "standalone TCPStore did not listen on :$STORE_PORT"
n=50; until http_ok "http://127.0.0.1:$METRICS_PORT/readyz"; do
	n=$((n - 1)); [ $n -gt 0 ] || { fail "B0 storeguard /readyz not ready with the store up"; break; }; sleep 0.1
done
[ $n -gt 0 ] && pass "B0 storeguard /readyz ok with the store up"

got=$(inw "$TORCH_PY" "$WORK/client.py" "$M_ADDR" "$STORE_PORT" worker)
[ "$got" = ok ] && pass "B1 torch client in the worker namespace uses the store through storeguard" \
	|| fail "B1 worker torch client: $got"

RULES=key_too_long
[ "$EXPECT_GEN" = G0 ] || RULES=key_too_long,validate_missing   # G2+ servers expect VALIDATE first
got=$(inw "$TORCH_PY" "$WORK/probe.py" "$M_ADDR" "$STORE_PORT")
[ "$got" = closed ] && pass "B2 #106294 bytes from $W_ADDR: connection closed" || fail "B2 #106294 probe from $W_ADDR: $got (want closed)"
if ev=$("$TORCH_PY" "$WORK/audit_check.py" "$AUDIT" "$W_ADDR" "$RULES" "$EXPECT_GEN"); then
	pass "B3 audit event: $ev"
	src=$(echo "$ev" | "$TORCH_PY" -c 'import json,sys; print(json.load(sys.stdin)["source.ip"])')
	[ "$src" = "$W_ADDR" ] || fail "B3b audit source.ip is $src, not exactly $W_ADDR"
else
	fail "B3 audit event for $RULES from $W_ADDR${EXPECT_GEN:+ generation $EXPECT_GEN}: $ev"
fi
VIOL=$(metric storeguard_violations_total mode=enforce) || VIOL=-1
[ "$VIOL" -ge 1 ] && pass "B4 storeguard_violations_total{mode=enforce} = $VIOL" || fail "B4 violations metric is $VIOL"

got=$(inm "$TORCH_PY" "$WORK/client.py" 127.0.0.1 "$STORE_PORT" master)
[ "$got" = ok ] && pass "B5 store still serves loopback clients directly after the probe" || fail "B5 loopback client: $got"

# Zero downtime: a client in the worker namespace keeps one connection through an upgrade in place and a
# kill -9 of the forwarding process (the keeper restarts it with every socket).
inw "$TORCH_PY" "$WORK/steady.py" "$M_ADDR" "$STORE_PORT" 6 >"$WORK/steady.log" 2>&1 &
STEADY=$!
PIDS+=("$STEADY")
sleep 1.5
OLD=$(cat "$WORK/worker.pid")
up=$(ip netns exec "$NS_M" "$STOREGUARD_BIN" upgrade --pid-file "$WORK/worker.pid" --timeout 30s 2>&1) \
	&& pass "B8 upgrade in place: $up" || fail "B8 upgrade in place: $up"
sleep 1.5
MID=$(cat "$WORK/worker.pid")
kill -9 "$MID" 2>/dev/null
n=100; while [ "$(cat "$WORK/worker.pid")" = "$MID" ] && [ $n -gt 0 ]; do n=$((n - 1)); sleep 0.1; done
[ "$(cat "$WORK/worker.pid")" != "$MID" ] && pass "B9 kill -9 of the forwarding process ($MID): the keeper restarted it ($(cat "$WORK/worker.pid"))" \
	|| fail "B9 no new forwarding process after kill -9 of $MID"
wait "$STEADY"
got=$(cat "$WORK/steady.log")
case "$got" in
	ok*) pass "B10 the worker's store connection lived through both ($OLD -> $MID -> $(cat "$WORK/worker.pid")): $got adds, none failed";;
	*) fail "B10 the worker's client across the upgrade and the kill: $got";;
esac

if [ "$V6" = on ]; then
	got=$(inw "$TORCH_PY" "$WORK/probe.py" "$M_LL%$VW" "$STORE_PORT")
	[ "$got" = closed ] && pass "B6 IPv6: #106294 bytes to [$M_LL]:$STORE_PORT redirected and cut off" \
		|| fail "B6 IPv6 probe to [$M_LL%$VW]:$STORE_PORT: $got (want closed)"
	if ev=$("$TORCH_PY" "$WORK/audit_check.py" "$AUDIT" "fe80:" "$RULES" "$EXPECT_GEN"); then
		pass "B7 IPv6 audit event: $ev"
	else
		fail "B7 IPv6 audit event: $ev"
	fi
fi

# --- C: no way around storeguard -----------------------------------------------------
stop_pid "$SG_PID"
got=$(inw "$TORCH_PY" "$WORK/connect.py" "$M_ADDR" "$STORE_PORT" 3)
[ "$got" = refused ] && pass "C1 storeguard stopped: worker -> $M_ADDR:$STORE_PORT refused (redirected to the closed proxy port)" \
	|| fail "C1 storeguard stopped: worker -> $M_ADDR:$STORE_PORT: $got (want refused)"
if [ "$V6" = on ]; then
	got=$(inw "$TORCH_PY" "$WORK/connect.py" "$M_LL%$VW" "$STORE_PORT" 3)
	[ "$got" = refused ] && pass "C1b IPv6 likewise refused" || fail "C1b IPv6 with storeguard stopped: $got (want refused)"
fi
got=$(inm "$TORCH_PY" "$WORK/client.py" 127.0.0.1 "$STORE_PORT" master2)
[ "$got" = ok ] && pass "C1c the store itself is up all along (loopback client ok)" || fail "C1c loopback client: $got"

fw_remove_redirect
D0=$(fw_count drop)  # after: with E2E_FW=storeguard the drop's table is loaded again, its counters from 0
got=$(inw "$TORCH_PY" "$WORK/connect.py" "$M_ADDR" "$STORE_PORT" 3)
D1=$(fw_count drop)
if [ "$got" = timeout ] && [ "$D1" -gt "$D0" ]; then
	pass "C2 redirect removed: worker -> store port dropped by the input rule (drop counter $D0 -> $D1)"
else
	fail "C2 redirect removed: worker -> store port: $got, drop counter $D0 -> $D1 (want timeout and a rising counter)"
fi
if [ "$V6" = on ]; then
	got=$(inw "$TORCH_PY" "$WORK/connect.py" "$M_LL%$VW" "$STORE_PORT" 3)
	[ "$got" = timeout ] && pass "C2b IPv6 likewise dropped" || fail "C2b IPv6 without redirect: $got (want timeout)"
fi

fw_remove_all
got=$(inw "$TORCH_PY" "$WORK/client.py" "$M_ADDR" "$STORE_PORT" bare)
[ "$got" = ok ] && pass "C3 positive control: without the rules the worker reaches the wildcard-bound store directly" \
	|| fail "C3 positive control (no rules): $got (want ok: otherwise C1/C2 prove nothing)"

stop_pid "$STORE_PID"

# --- D: torchrun across the hosts, and the ranks' own store ---------------------------------
cat >"$WORK/trun.py" <<'EOF'
# trun.py OUTDIR: a torchrun worker: gloo all_reduce; writes rank<R>.json with the sum and the store it was given.
import datetime, json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
dist.barrier()
with open(os.path.join(sys.argv[1], "rank%d.json" % r), "w") as fh:
    json.dump({"rank": r, "reduced": t.item(), "store": "%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])}, fh)
dist.destroy_process_group()
EOF
# trun static|c10d: one torchrun agent per namespace (node 0 on the master, node 1 on the worker; they share a
# hostname, hence --local-addr); waits for both. Sets TRUN_OK (both rc 0, both ranks' sum 3.0) and TRUN_STORE (the
# ranks' MASTER_ADDR:MASTER_PORT, from rank 1's environment).
trun() {
	local mode=$1 out=$WORK/trun-$1 node ns addr dev pids=() rc=0 args
	mkdir -p "$out"
	for node in 0 1; do
		if [ $node = 0 ]; then ns=$NS_M addr=$M_ADDR dev=$VM; else ns=$NS_W addr=$W_ADDR dev=$VW; fi
		case $mode in
			static) args=(--node-rank "$node" --master-addr "$M_ADDR" --master-port "$STORE_PORT");;
			c10d) args=(--rdzv-backend c10d --rdzv-endpoint "$M_ADDR:$STORE_PORT" --rdzv-id "e2e$TAG" --rdzv-conf is_host=false);;
		esac
		ip netns exec "$ns" env GLOO_SOCKET_IFNAME="$dev" timeout 180 "$TORCHRUN" --nnodes 2 --nproc-per-node 1 \
			--local-addr "$addr" --max-restarts 0 --monitor-interval 1 "${args[@]}" "$WORK/trun.py" "$out" \
			>"$WORK/trun-$mode-$node.log" 2>&1 &
		pids+=("$!"); PIDS+=("$!")
		# static: node 0's agent hosts the store; a client redirected to storeguard before it listens is closed
		# (the guard cannot dial it), not refused, which torch would retry
		if [ "$mode" = static ] && [ $node = 0 ]; then
			wait_listen "$NS_M" "$STORE_PORT" 60 || log "D: node 0's store never listened on :$STORE_PORT"
		fi
	done
	for p in "${pids[@]}"; do wait "$p" || rc=$?; done
	TRUN_OK=no
	TRUN_STORE=$("$TORCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["store"])' "$out/rank1.json" 2>/dev/null) || TRUN_STORE="?"
	if [ $rc = 0 ] && "$TORCH_PY" -c 'import json,sys; assert all(json.load(open(f))["reduced"] == 3.0 for f in sys.argv[1:])' \
		"$out/rank0.json" "$out/rank1.json" 2>/dev/null; then TRUN_OK=yes; fi
}
TORCHRUN=$(dirname "$TORCHRUN_PY")/torchrun
if [ ! -x "$TORCHRUN" ] || ! "$TORCHRUN_PY" -c 'import torch.distributed' 2>/dev/null; then
	log "D skipped: no torch 2.x torchrun at $TORCHRUN (TORCHRUN_PY; scripts/torch-envs.sh installs one)"
else
	fw_add || die "installing the $E2E_FW rules again failed"
	: >"$WORK/storeguard.log"
	start_storeguard auto
	A0=$(metric storeguard_connections_accepted_total) || A0=-1
	trun static
	A1=$(metric storeguard_connections_accepted_total) || A1=-1
	U=$(metric storeguard_unguarded_job_stores_total) || U=-1
	if [ $TRUN_OK = yes ] && [ "$TRUN_STORE" = "$M_ADDR:$STORE_PORT" ] && [ $((A1 - A0)) -ge 2 ] && [ "$U" = 0 ]; then
		pass "D1 torchrun static rendezvous across the hosts: all_reduce 3.0, the ranks' store $TRUN_STORE, the worker's agent and rank through storeguard ($((A1 - A0)) connections), 0 unguarded stores"
	else
		fail "D1 torchrun static: ok=$TRUN_OK store=$TRUN_STORE connections through the guard $A0 -> $A1, unguarded $U"
		tail -n 8 "$WORK/trun-static-0.log" "$WORK/trun-static-1.log" >&2
	fi
	ip netns exec "$NS_M" timeout 600 "$TORCHRUN_PY" "$WORK/store.py" "$STORE_PORT" 300 >"$WORK/store-d.log" 2>&1 &
	STORE_PID=$!
	PIDS+=("$STORE_PID")
	wait_listen "$NS_M" "$STORE_PORT" 30 || die "the rendezvous TCPStore did not listen on :$STORE_PORT"
	trun c10d
	U=$(metric storeguard_unguarded_job_stores_total) || U=-1
	port=${TRUN_STORE##*:}
	if [ $TRUN_OK = yes ] && [ "$port" != "$STORE_PORT" ] && [ "$U" = 1 ] \
		&& grep 'does not front' "$WORK/storeguard.log" | grep -Eq "master_port[^0-9]{1,3}$port([^0-9]|\$)"; then
		pass "D2 torchrun c10d rendezvous through storeguard: all_reduce 3.0; the ranks' own store $TRUN_STORE passes no guard, and storeguard says so (storeguard_unguarded_job_stores_total $U, its log names port $port)"
	else
		fail "D2 torchrun c10d: ok=$TRUN_OK ranks' store $TRUN_STORE, unguarded $U, log: $(grep 'does not front' "$WORK/storeguard.log" | head -1 | cut -c1-400)"
		tail -n 8 "$WORK/trun-c10d-0.log" "$WORK/trun-c10d-1.log" >&2
	fi
	stop_pid "$STORE_PID"
	stop_pid "$SG_PID"
	fw_remove_all
fi
summary
[ "$FAILED" = 0 ] || exit 1
