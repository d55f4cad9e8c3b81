#!/usr/bin/env bash
# End-to-end test of mutual TLS between storeguards (issue #27) with a real torch TCPStore and a real torchrun job,
# in three private network namespaces on one bridge (a fourth namespace holds it). Nothing leaves them.
#
#   master ns 10.78.0.1                         worker ns 10.78.0.2                     intruder ns 10.78.0.3
#     torch TCPStore :STORE_PORT (wildcard;       torchrun agent + rank (node 2)          plaintext / other-CA / expired /
#       the firewall drops it from outside)       OUTPUT: tcp to 10.78.0.1:29500          not-allowed-identity clients,
#     relay.py --record 127.0.0.1:29511 -> it       without mark 0x5347 -> :15001         nmap -sV, the policy attacks
#     storeguard serve :29500 -> 127.0.0.1:29511  storeguard connect --transparent :15001
#       (mTLS; plaintext from its own addresses)    --mark 0x5347 -> mTLS -> 10.78.0.1:29500
#     torchrun agent + rank (node 1)
#
# The relay records every byte that reaches the store, per connection (conn<N>.c2s): a marker key that an intruder
# sends and that never shows up there, and a connection count that does not grow, prove 0 bytes reached the store.
#
# The job is torch's own, unchanged: the ranks get their environment from torchrun. The two hosts share one hostname
# here, so each agent gets --local-addr (its address) and GLOO_SOCKET_IFNAME=eth0, as any multi-homed host would.
#
# Checks (CHECKS="A B C D", any subset; A, B and C run during one job, in that order):
#   A  a torchrun --nnodes 2 c10d job (gloo all_reduce + a loop of store set/get ops on the rendezvous store, through
#      the guards) finishes rc 0 with the right sum; the master guard's audit names the worker's SPIFFE ID; the worker's
#      cert and key are replaced mid-job (same identity, new serial): 0 failed ops, and a new connection afterwards
#      presents the new serial
#   B  during a job, from the intruder: a plaintext torch client, TLS without a certificate, a certificate of another CA,
#      an expired one and one whose identity is not allowed: 0 bytes to the store, audited `denied` with tls_<why>; the
#      job finishes with 0 failed ops; nmap -sV -p 29500 does not grow the store (GETNUMKEYS on loopback, relay bytes);
#      the worker's client guard is not a relay for the intruder (10.78.0.2:15001); the ranks' own store (c10d: the
#      rank-0 agent's TCPStore on a free port of the master, which no guard fronts) does not answer the intruder and
#      does answer the worker, and the master's peer set holds the worker and not the intruder (serve --tls-peer-set
#      with the peers ruleset loaded on the master by storeguard firewall install peers)
#   C  during a job: 2 upgrades in place (storeguard upgrade --pid-file), 1 kill -9 of the forwarding process under
#      --keeper, and 2 upgrades whose new forwarding process is killed (kill -9) as it writes its pid file, on each
#      end: 0 failed ops
#   E  during a job (issue #43, "proof beats address"): a local user of the worker (uid nobody) opens 6 plaintext
#      connections to the master guard's own port (the kit's 29499, which the worker's redirect does not cover: here
#      a nat rule on the master takes it to the guard), and two addresses of the worker's IPv6 /64 (on the intruder)
#      4 each: the worker's address and the /64 are banned, plaintext from them stays refused, and new connections
#      of the worker's ranks through its client guard (IPv4, and IPv6 from inside the banned /64) are answered; the
#      job finishes with 0 failed ops, and C's upgrades reconnect the worker from its banned address
#   D  the policy issue's attack (a pickle running os.system SET into torchrun's rendezvous state, COMPARE_SET,
#      MULTI_SET; interop/policy_attack.py) with the policy stage off: from the intruder in plaintext and through the
#      intruder's own client guard (a valid certificate of a not-allowed identity) it reaches the store with 0 bytes;
#      control: the same attack from the worker (an allowed identity) does reach it (so the policy really is off)
#
# Until the binary has `storeguard connect` (HARNESS mode, or MTLS_HARNESS=1): the master guard serves plaintext, the
# worker has no client guard, and only what proves the harness runs (the job through the guard, the relay sees an
# intruder's bytes when nothing stops them); the mTLS checks print SKIP.
#
# Env: STOREGUARD_BIN   storeguard binary (default: go build ./cmd/storeguard into a temp dir)
#      TORCH_PY         python with torch (default /var/cache/storeguard/torch/2.15.0/bin/python); torchrun beside it
#      CHECKS="A B C D E" (any subset; A, B, E and C share one job when given together)
#      JOB_SECONDS=20   the ranks loop store ops at least this long, and until the checks during the job are done
#      C_STEPS="m-up w-up m-kill w-kill m-upkill w-upkill m-upkill w-upkill m-up w-up"  C's steps, 1.5 s apart (m/w: master/worker;
#                       up: upgrade in place, kill: kill -9 of the forwarding process, upkill: an upgrade, then kill -9 of
#                       the new forwarding process at once); e.g. C_STEPS="w-up" to see one end alone
#      MTLS_KEEP=1      keep the work dir (certificates, audit log, relay recordings, process logs)
#      MTLS_HARNESS=1   plaintext harness mode even when the binary has `connect`
# Exit: 0 on pass, or with a line starting "SKIP" when namespaces cannot be made here; 1 on failure.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_PY=${TORCH_PY:-/var/cache/storeguard/torch/2.15.0/bin/python}
TORCHRUN=${TORCHRUN:-$(dirname "$TORCH_PY")/torchrun}
CHECKS=${CHECKS:-A B C D E}
JOB_SECONDS=${JOB_SECONDS:-20}
C_STEPS=${C_STEPS:-m-up w-up m-kill w-kill m-upkill w-upkill m-upkill w-upkill m-up w-up}
GUARD_PORT=29500   # the master guard: the rendezvous endpoint's port
RELAY_PORT=29511   # the recording relay in front of the store (the guard's upstream)
STORE_PORT=29512   # the real TCPStore
CLIENT_PORT=15001  # the worker's client guard (transparent)
IN_CLIENT_PORT=15002 # the intruder's own client guard (check D)
MARK=0x5347
M_METRICS=9531
M_ADDR=10.78.0.1
W_ADDR=10.78.0.2
I_ADDR=10.78.0.3
# IPv6 (check E): one /64 for the three hosts, as a cloud subnet or a customer's prefix; the intruder has two addresses
M_ADDR6=fd78::1
W_ADDR6=fd78::2
I_ADDR6=fd78::3
I_ADDR6B=fd78::33
OWN_PORT=29499     # the master guard's own port in the kit (check E): a nat rule on the master takes it to the guard
TAG=$$
NS_S=sg-mtls-s-$TAG   # the switch: a bridge and nothing else
NS_M=sg-mtls-m-$TAG
NS_W=sg-mtls-w-$TAG
NS_I=sg-mtls-i-$TAG
WORK=$(mktemp -d /tmp/storeguard-netns-mtls.XXXXXX)
CERTS=$WORK/certs
WCERTS=$WORK/worker-certs   # what the worker's client guard reads (replaced in place for the rotation)
AUDIT=$WORK/audit-0.jsonl   # start_master sets it
REC=$WORK/relay             # relay recordings
PASSED=0
FAILED=0
SKIPPED=0
PIDS=()
T_START=$(date +%s)

log() { echo "netns-mtls: $*" >&2; }
pass() { PASSED=$((PASSED + 1)); echo "netns-mtls: PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "netns-mtls: FAIL $*"; }
skipc() { SKIPPED=$((SKIPPED + 1)); echo "netns-mtls: SKIP $*"; }
note() { echo "netns-mtls: NOTE $*"; }
die() { echo "netns-mtls: FAIL $*"; FAILED=$((FAILED + 1)); summary; exit 1; }
summary() { echo "netns-mtls: $PASSED passed, $FAILED failed, $SKIPPED skipped ($(($(date +%s) - T_START)) s)"; }
skip() { echo "SKIP: netns-mtls: $*"; exit 0; }
want() { case " $CHECKS " in *" $1 "*) return 0;; esac; return 1; }
elapsed() { echo "$(($(date +%s) - T_START))s"; }
inm() { ip netns exec "$NS_M" "$@"; }
inw() { ip netns exec "$NS_W" "$@"; }
ini() { ip netns exec "$NS_I" "$@"; }
cut_lines() { cut -c1-400; }

cleanup() {
	local rc=$?
	set +e
	trap - ERR
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	sleep 0.3
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	# Whatever is left in our namespaces was started by this script (forwarding processes under a keeper,
	# torchrun's ranks): end them by pid before the namespaces go.
	for ns in "$NS_M" "$NS_W" "$NS_I" "$NS_S"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
	done
	for ns in "$NS_I" "$NS_W" "$NS_M" "$NS_S"; do ip netns del "$ns" 2>/dev/null; rm -rf "/etc/netns/$ns"; done
	if [ "${MTLS_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
		log "logs kept in $WORK"
		for f in "$WORK"/*.log; do [ -s "$f" ] && { echo "--- $f (tail)" >&2; tail -n 20 "$f" | cut_lines >&2; }; done
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "netns-mtls: FAIL unexpected error (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT TERM

# --- preconditions -----------------------------------------------------------
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
if ! ip netns add "$NS_S" 2>"$WORK/netns.err"; then
	skip "'ip netns add' is not permitted here ($(head -c 200 "$WORK/netns.err"))"
fi
for ns in "$NS_M" "$NS_W" "$NS_I"; do ip netns add "$ns" || skip "'ip netns add $ns' failed"; done
command -v nft >/dev/null || skip "nft not installed (apt-get install nftables)"
command -v openssl >/dev/null || skip "openssl not installed"
# The version from the package metadata (importing torch takes 6-10 s here; the store's start imports it anyway).
TORCH_VER=$("$TORCH_PY" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])' 2>/dev/null) \
	|| skip "$TORCH_PY has no torch (set TORCH_PY; scripts/torch-envs.sh 2.15.0 installs one)"
[ -x "$TORCHRUN" ] || skip "no torchrun beside $TORCH_PY"
TORCH_MM=$(echo "$TORCH_VER" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2/')
case "$TORCH_MM" in 1.*|2.0|2.1|2.2|2.3) skip "torch $TORCH_VER: this test wants 2.4+ (torchrun's c10d rendezvous, multi_set)";; esac
PY=/usr/bin/python3   # torch-free helpers start fast
command -v "$PY" >/dev/null || PY=$TORCH_PY

if [ -z "${STOREGUARD_BIN:-}" ]; then
	command -v go >/dev/null || skip "no STOREGUARD_BIN and no go toolchain"
	log "building storeguard"
	(cd "$ROOT" && go build -o "$WORK/storeguard" ./cmd/storeguard) || die "go build ./cmd/storeguard failed"
	STOREGUARD_BIN=$WORK/storeguard
fi
[ -x "$STOREGUARD_BIN" ] || die "STOREGUARD_BIN=$STOREGUARD_BIN is not executable"
if [ "${MTLS_HARNESS:-0}" != 1 ] && "$STOREGUARD_BIN" connect --help >/dev/null 2>&1 \
	&& "$STOREGUARD_BIN" serve --help 2>&1 | grep -q -- '--tls-mode'; then
	TLS=on
else
	TLS=off
	note "HARNESS mode: $STOREGUARD_BIN has no 'connect' / --tls-mode (or MTLS_HARNESS=1): plaintext guard, no client guard"
fi
# The master's free ports for the job's hosts only (configs/nftables/storeguard-peers.nft, tls.peer-set), when the
# binary has it.
PEERS=off
if [ "$TLS" = on ] && "$STOREGUARD_BIN" serve --help 2>&1 | grep -q -- '--tls-peer-set'; then PEERS=on; fi
C_KEEPER=no
if [ "$TLS" = on ] && "$STOREGUARD_BIN" connect --help 2>&1 | grep -q -- '--keeper'; then C_KEEPER=yes; fi
log "torch $TORCH_VER ($TORCH_PY), mTLS $TLS (connect --keeper: $C_KEEPER, peer set: $PEERS), checks: $CHECKS, binary $STOREGUARD_BIN"

# --- certificates ------------------------------------------------------------------
mkdir -p "$CERTS" "$WCERTS"
# gen_ca NAME ORG
gen_ca() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$CERTS/$1.key" -out "$CERTS/$1.crt" \
		-days 3 -subj "/O=$2/CN=$2 test CA" -addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
# gen_leaf NAME CA URI SERIAL [IP]: a leaf for both TLS roles, valid now for 3 days
gen_leaf() {
	local san="URI:$3"; [ -n "${5:-}" ] && san="$san,IP:$5"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$CERTS/$1.key" -out "$CERTS/$1.csr" \
		-subj "/O=sg.test/CN=$1" 2>/dev/null
	printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' \
		"$san" >"$CERTS/$1.ext"
	openssl x509 -req -in "$CERTS/$1.csr" -CA "$CERTS/$2.crt" -CAkey "$CERTS/$2.key" -set_serial "$4" -days 3 \
		-extfile "$CERTS/$1.ext" -out "$CERTS/$1.crt" 2>/dev/null
}
# gen_expired NAME CA URI SERIAL: valid for January 2024 only (openssl x509 -days cannot go negative; openssl ca can)
gen_expired() {
	local d=$CERTS/ca-db
	mkdir -p "$d"; : >"$d/index.txt"; echo "${4#0x}" >"$d/serial"
	cat >"$d/ca.cnf" <<-EOF
	[ca]
	default_ca = dflt
	[dflt]
	database = $d/index.txt
	new_certs_dir = $d
	serial = $d/serial
	default_md = sha256
	policy = pol
	unique_subject = no
	copy_extensions = none
	[pol]
	commonName = supplied
	organizationName = optional
	[leaf]
	basicConstraints = critical,CA:FALSE
	keyUsage = critical,digitalSignature
	extendedKeyUsage = serverAuth,clientAuth
	subjectAltName = URI:$3
	EOF
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$CERTS/$1.key" -out "$CERTS/$1.csr" \
		-subj "/O=sg.test/CN=$1" 2>/dev/null
	openssl ca -batch -config "$d/ca.cnf" -cert "$CERTS/$2.crt" -keyfile "$CERTS/$2.key" -in "$CERTS/$1.csr" \
		-out "$CERTS/$1.crt" -notext -extensions leaf -startdate 20240101000000Z -enddate 20240201000000Z 2>"$d/ca.err"
}
# Serials are distinctive in hex and decimal, so that an audit field in either form is found.
SER_W1=0x5a17c0ffee01
SER_W1_NEW=0x5a17c0ffee02
gen_ca ca "sg.test"
gen_ca evilca "evil.test"
gen_leaf master ca spiffe://sg.test/master 0x5a17c0ffee00 "$M_ADDR"
gen_leaf w1 ca spiffe://sg.test/worker/w1 "$SER_W1"
gen_leaf w1-new ca spiffe://sg.test/worker/w1 "$SER_W1_NEW"
gen_leaf other ca spiffe://sg.test/other 0x5a17c0ffee03
gen_leaf evil-w1 evilca spiffe://sg.test/worker/w1 0x5a17c0ffee04
gen_expired w1-expired ca spiffe://sg.test/worker/w1 0x5a17c0ffee05 || die "openssl ca (expired cert): $(cat "$CERTS/ca-db/ca.err")"
for c in master w1 w1-new other evil-w1 w1-expired; do
	[ -s "$CERTS/$c.crt" ] || die "certificate $c was not made"
done
openssl verify -CAfile "$CERTS/ca.crt" "$CERTS/w1.crt" >/dev/null || die "w1 does not verify against the CA"
if openssl verify -CAfile "$CERTS/ca.crt" "$CERTS/w1-expired.crt" >/dev/null 2>&1; then die "w1-expired verifies"; fi
cp "$CERTS/w1.crt" "$WCERTS/tls.crt"; cp "$CERTS/w1.key" "$WCERTS/tls.key"
# serial_forms 0xHEX: the forms an audit field may take (hex lower/upper, colon-separated, decimal)
serial_forms() {
	local h=${1#0x}; [ $((${#h} % 2)) = 1 ] && h=0$h
	echo "$h"; echo "$h" | tr a-f A-F; echo "$h" | sed 's/../&:/g; s/:$//'; echo "$h" | sed 's/../&:/g; s/:$//' | tr a-f A-F
	echo $((16#$h))
}

# --- helpers -----------------------------------------------------------------------
cat >"$WORK/store.py" <<'EOF'
# store.py PORT SECONDS: a torch TCPStore master (torch binds the wildcard; the firewall keeps it local)
import datetime, sys, time
import torch.distributed as d
port, secs = int(sys.argv[1]), float(sys.argv[2])
s = d.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=secs), wait_for_workers=False)
print("store up", flush=True)
time.sleep(secs)
EOF

cat >"$WORK/numkeys.py" <<'EOF'
# numkeys.py HOST PORT: GETNUMKEYS with raw bytes (VALIDATE, GETNUMKEYS; no torch): prints the count
import socket, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(bytes.fromhex("00cef7853c") + bytes([7]))
b = b""
while len(b) < 8:
    d = s.recv(8 - len(b))
    if not d:
        sys.exit("closed")
    b += d
print(struct.unpack("<q", b)[0])
EOF

cat >"$WORK/job.py" <<'EOF'
# job.py HOST PORT SECONDS OUT: one torchrun rank (env from torchrun, unchanged): gloo all_reduce, then a loop of
# set/get on the rendezvous store (a TCPStore client of HOST:PORT, as any job code may open) for at least SECONDS and
# until OUT/stop exists (at most 150 s), counting failed ops (a failed op reconnects); then barrier.
# Writes OUT/started<R> (MASTER_ADDR:MASTER_PORT) once the loop runs, OUT/rank<R>.json at the end.
import datetime, json, os, sys, time
import torch, torch.distributed as dist
host, port, secs, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
def client():
    return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=30), wait_for_workers=False)
store, ops, failed, errors, reconnects = client(), 0, 0, [], 0
with open(os.path.join(out, "started%d" % rank), "w") as f:
    f.write("%s:%s" % (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")))
t0 = time.time()
i = 0
while time.time() - t0 < 150 and (time.time() - t0 < secs or not os.path.exists(os.path.join(out, "stop"))):
    k, v = "job/r%d/k%d" % (rank, i % 8), "v%d-%d" % (rank, i)
    try:
        store.set(k, v)
        got = store.get(k)
        if got != v.encode():
            raise RuntimeError("get %s: %r, want %r" % (k, got, v))
        ops += 2
    except Exception as e:
        failed += 1
        errors.append("%s %s" % (time.strftime("%H:%M:%S"), str(e).splitlines()[0][:200] if str(e) else repr(e)))
        time.sleep(0.2)
        try:
            store, reconnects = client(), reconnects + 1
        except Exception as e2:
            errors.append("%s reconnect: %s" % (time.strftime("%H:%M:%S"), str(e2).splitlines()[0][:200]))
    i += 1
    time.sleep(0.01)
secs = time.time() - t0
dist.barrier()
res = {"rank": rank, "world": world, "reduced": t.item(), "expected": world * (world + 1) / 2.0, "ops": ops,
       "failed": failed, "reconnects": reconnects, "errors": errors[:10], "seconds": round(secs, 1),
       "master": "%s:%s" % (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))}
with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
    json.dump(res, f)
print(json.dumps(res), flush=True)
dist.destroy_process_group()
EOF

cat >"$WORK/intrude.py" <<'EOF'
# intrude.py HOST PORT MARKER [CERT KEY | nocert]: a TLS 1.3 client (no server check: an intruder does not care) that
# sends TCPStore bytes after the handshake: VALIDATE, SET <MARKER> (a key of its own), GETNUMKEYS. Without CERT/KEY
# and without "nocert": plaintext, the same bytes. Prints one JSON line: what the handshake and the read saw.
import json, socket, ssl, struct, sys
host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rest = sys.argv[4:]
key = marker.encode()
msg = bytes.fromhex("00cef7853c") + bytes([1]) + struct.pack("<Q", len(key)) + key + struct.pack("<Q", 2) + b"x1" + bytes([7])
r = {"tls": bool(rest), "handshake": None, "sent": 0, "read": None}
s = socket.create_connection((host, port), timeout=5)
try:
    if rest:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if rest[0] != "nocert":
            ctx.load_cert_chain(rest[0], rest[1])
        s = ctx.wrap_socket(s)
        r["handshake"] = "ok " + s.version()
    s.sendall(msg)
    r["sent"] = len(msg)
    d = s.recv(64)
    r["read"] = "eof" if d == b"" else "data:" + d.hex()
except ssl.SSLError as e:
    r["read" if r["handshake"] else "handshake"] = "ssl:" + (e.reason or str(e))
except (ConnectionResetError, BrokenPipeError) as e:
    r["read" if r["handshake"] or not rest else "handshake"] = type(e).__name__
except (socket.timeout, TimeoutError):
    r["read"] = "timeout"
except OSError as e:
    r["read"] = "error:%s" % e
print(json.dumps(r))
EOF

cat >"$WORK/plainclient.py" <<'EOF'
# plainclient.py HOST PORT MARKER GATE: torch's own TCPStore client sets MARKER once the file GATE exists (torch takes
# seconds to import: it imports beside the other checks, and connects when they are done); prints ok or the error
import datetime, os, sys, time
import torch.distributed as d
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
try:
    s = d.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, datetime.timedelta(seconds=8), wait_for_workers=False)
    s.set(sys.argv[3], "x")
    s.num_keys()
    print("ok")
except Exception as e:
    print("error:%s" % (str(e).splitlines()[0][:200] if str(e) else repr(e)))
EOF

cat >"$WORK/audit.py" <<'EOF'
# audit.py SECONDS FILE... -- COND...: the first audit line (events and flows files) meeting every COND, within
# SECONDS; prints it (exit 0) or "missing" and what the files hold (exit 1).
#   COND: field=value (exact), field~text (substring), *~text (any field's value contains text),
#         field^prefix, field>number, field? (present)
import glob, json, sys, time
i = sys.argv.index("--")
secs, files, conds = float(sys.argv[1]), sys.argv[2:i], sys.argv[i + 1:]
def values(e):
    for v in e.values():
        if isinstance(v, dict):
            yield from values(v)
        elif isinstance(v, list):
            for x in v:
                yield str(x)
        else:
            yield str(v)
def get(e, k):
    if k in e:
        return e[k]
    cur = e
    for p in k.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur
def ok(e, c):
    if c.endswith("?"):
        return get(e, c[:-1]) is not None
    for op in ("=", "~", "^", ">"):
        if op in c:
            k, v = c.split(op, 1)
            break
    alts = v.split("|") if op == "~" else [v]
    if k == "*":
        return any(a in x for x in values(e) for a in alts)
    x = get(e, k)
    if x is None:
        return False
    if op == ">":
        return isinstance(x, (int, float)) and x > float(v)
    x = str(x)
    return x == v if op == "=" else (any(a in x for a in alts) if op == "~" else x.startswith(v))
deadline = time.time() + secs
while True:
    lines = []
    for pat in files:
        for f in sorted(glob.glob(pat)):
            try:
                lines += open(f, errors="replace").read().splitlines()
            except OSError:
                pass
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if all(ok(e, c) for c in conds):
            print(line); sys.exit(0)
    if time.time() >= deadline:
        print("missing (%d lines)" % len(lines)); sys.exit(1)
    time.sleep(0.25)
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
http_ok() { inm "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=3)" "$1" 2>/dev/null; }
audit_find() { local s=$1; shift; "$PY" "$WORK/audit.py" "$s" "$AUDIT" "$AUDIT.flows*" -- "$@" | cut_lines; }
# relay_conns: connections the relay forwarded to the store so far; relay_has TEXT: files holding TEXT (client side)
# audit_count SOURCE ACTION REASON: events of the guard's audit log
audit_count() { { grep -a -h "\"source.ip\":\"$1\"" "$AUDIT" 2>/dev/null || true; } | { grep -a "\"event.action\":\"$2\"" || true; } \
	| { grep -a -c "\"event.reason\":\"$3\"" || true; }; }
relay_conns() { ls "$REC" 2>/dev/null | grep -c '\.c2s$' || true; }
relay_has() { { grep -l -a -F -- "$1" "$REC"/*.c2s 2>/dev/null || true; } | wc -l; }
relay_bytes() { cat "$REC"/*.c2s 2>/dev/null | wc -c; }
numkeys() { inm "$PY" "$WORK/numkeys.py" 127.0.0.1 "$STORE_PORT" 2>&1; }
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# --- topology: a bridge in the switch namespace, one veth to each host -----------------
# The hosts share this machine's hostname (one UTS namespace), which /etc/hosts gives as 127.0.0.1: torch 2.4's c10d
# rendezvous sends its ranks to the rank-0 agent's socket.getfqdn(), here "localhost" on every host. As on a cluster,
# each host's name is its own address, with a fully qualified alias (which getfqdn() prefers) the other host resolves
# too (ip netns exec mounts /etc/netns/NS/hosts).
H=$(hostname)
mkdir -p "/etc/netns/$NS_M" "/etc/netns/$NS_W"
printf '127.0.0.1 localhost\n::1 localhost\n%s %s sgm.test\n%s sgw.test\n' "$M_ADDR" "$H" "$W_ADDR" >"/etc/netns/$NS_M/hosts"
printf '127.0.0.1 localhost\n::1 localhost\n%s %s sgw.test\n%s sgm.test\n' "$W_ADDR" "$H" "$M_ADDR" >"/etc/netns/$NS_W/hosts"
for ns in "$NS_S" "$NS_M" "$NS_W" "$NS_I"; do ip netns exec "$ns" ip link set lo up; done
ip netns exec "$NS_S" ip link add br0 type bridge
ip netns exec "$NS_S" ip link set br0 up
i=0
for pair in "$NS_M:$M_ADDR" "$NS_W:$W_ADDR" "$NS_I:$I_ADDR"; do
	ns=${pair%%:*}; addr=${pair#*:}; i=$((i + 1))
	ip netns exec "$NS_S" ip link add "p$i" type veth peer name eth0 netns "$ns"
	ip netns exec "$NS_S" ip link set "p$i" master br0 up
	ip netns exec "$ns" ip addr add "$addr/24" dev eth0
	ip netns exec "$ns" ip -6 addr add "fd78::${addr##*.}/64" dev eth0 nodad
	ip netns exec "$ns" ip link set eth0 up
done
ini ip -6 addr add "$I_ADDR6B/64" dev eth0 nodad
# The store and the relay are for the master host's own processes (torch binds the store's wildcard).
inm nft -f - <<EOF
table inet sgmtls {
	chain input {
		type filter hook input priority 0; policy accept;
		iif != "lo" tcp dport { $RELAY_PORT, $STORE_PORT } counter drop
	}
	chain prerouting {
		type nat hook prerouting priority -100; policy accept;
		tcp dport $OWN_PORT counter redirect to :$GUARD_PORT
	}
}
EOF
# The kit's peer-set rule: the master's free ports (where torch puts the ranks' store of a c10d rendezvous, and gloo's
# listeners) for hosts in the set the master's guard fills only.
if [ "$PEERS" = on ]; then
	# Loaded by storeguard itself, by netlink (storeguard firewall: the file's rules, rule for rule).
	inm "$STOREGUARD_BIN" firewall install peers >/dev/null && inm "$STOREGUARD_BIN" firewall check peers >/dev/null \
		|| die "storeguard firewall install peers failed"
fi
# The worker's client side (the issue's kit style): its ranks' connections to the master's store port, except the
# client guard's own (marked), go to the client guard.
if [ "$TLS" = on ]; then
	inw nft -f - <<EOF
table ip sgmtls {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr $M_ADDR tcp dport $GUARD_PORT meta mark != $MARK counter redirect to :$CLIENT_PORT
	}
}
table ip6 sgmtls6 {
	chain output {
		type nat hook output priority -100; policy accept;
		ip6 daddr $M_ADDR6 tcp dport $GUARD_PORT meta mark != $MARK counter redirect to :$CLIENT_PORT
	}
}
EOF
fi
got=$(inw "$PY" -c "import socket;s=socket.create_connection(('$M_ADDR',22),timeout=3)" 2>&1 | tail -1) || true
case "$got" in *refused*) pass "topology: the worker reaches the master over the bridge ($(elapsed))";;
	*) die "topology: worker -> $M_ADDR: $got";; esac

# --- the store and its recording relay (for the whole run) ------------------------------
ip netns exec "$NS_M" "$TORCH_PY" "$WORK/store.py" "$STORE_PORT" 900 >"$WORK/store.log" 2>&1 &
PIDS+=("$!")
wait_listen "$NS_M" "$STORE_PORT" 60 || die "the TCPStore did not listen on :$STORE_PORT: $(tail -n 3 "$WORK/store.log")"
ip netns exec "$NS_M" "$PY" "$ROOT/interop/relay.py" "$RELAY_PORT" "$STORE_PORT" --record "$REC" >"$WORK/relay.log" 2>&1 &
PIDS+=("$!")
wait_listen "$NS_M" "$RELAY_PORT" 10 || die "relay.py did not listen on :$RELAY_PORT"
got=$(ini "$PY" -c "import socket;s=socket.create_connection(('$M_ADDR',$STORE_PORT),timeout=2)" 2>&1 | tail -1) || true
case "$got" in *timed\ out*|*timeout*) pass "the store port is not reachable from the intruder (dropped)";;
	*) fail "intruder -> store port $STORE_PORT directly: ${got:-connected} (want a timeout)";; esac

# --- guards --------------------------------------------------------------------------
M_GUARD_PID=""
W_GUARD_PID=""
# start_master EXTRA_CONFIG_YAML: the master's guard under its keeper (as the kit runs it), config in a file
M_STARTS=0
start_master() {
	M_STARTS=$((M_STARTS + 1))
	AUDIT=$WORK/audit-$M_STARTS.jsonl   # each guard's own: one check's events do not answer another's
	{
		if [ "$TLS" = on ]; then
			printf 'tls:\n  plaintext-sources: ["127.0.0.0/8", "::1/128", "%s/32"]\n' "$M_ADDR"
		fi
		printf '%s\n' "${1:-}"
	} >"$WORK/master.yaml"
	local tls=()
	[ "$TLS" = on ] && tls=(--tls-mode on --tls-cert "$CERTS/master.crt" --tls-key "$CERTS/master.key"
		--tls-ca "$CERTS/ca.crt" --tls-allow 'spiffe://sg.test/worker/*')
	[ "$PEERS" = on ] && tls+=(--tls-peer-set "inet storeguard_peers peers")
	# PATH=/nonexistent: the guard keeps the peer set by netlink, with no nft (or any other) binary to run.
	ip netns exec "$NS_M" env PATH=/nonexistent "$STOREGUARD_BIN" serve --keeper --pid-file "$WORK/master.pid" --config "$WORK/master.yaml" \
		--listen ":$GUARD_PORT" --upstream "127.0.0.1:$RELAY_PORT" --metrics-listen "127.0.0.1:$M_METRICS" \
		--audit-log "$AUDIT" --generation "$TORCH_MM" "${tls[@]}" >>"$WORK/master-guard.log" 2>&1 &
	M_GUARD_PID=$!
	PIDS+=("$M_GUARD_PID")
	wait_listen "$NS_M" "$GUARD_PORT" 15 || die "the master guard did not listen on :$GUARD_PORT"
	local n=50
	until http_ok "http://127.0.0.1:$M_METRICS/healthz"; do
		n=$((n - 1)); [ $n -gt 0 ] || die "master guard /healthz not answering"; sleep 0.1
	done
}
# stop_guard NS PID PIDFILE PORT: the process we started and, after upgrades, the one its pid file names now (an
# upgraded client guard is not our child); then the port must be free for the next guard
stop_guard() {
	[ -n "$2" ] && stop_pid "$2"
	local p; p=$(cat "$3" 2>/dev/null) || true
	[ -n "$p" ] && [ "$p" != "$2" ] && kill "$p" 2>/dev/null || true
	local n=50
	while ip netns exec "$1" ss -ltnH "sport = :$4" | grep -q LISTEN && [ $n -gt 0 ]; do n=$((n - 1)); sleep 0.1; done
	[ $n -gt 0 ] || { [ -n "$p" ] && kill -9 "$p" 2>/dev/null; sleep 0.3; }
	rm -f "$3"
}
stop_master() { stop_guard "$NS_M" "$M_GUARD_PID" "$WORK/master.pid" "$GUARD_PORT"; M_GUARD_PID=""; }
# start_client NS PIDFILE LOG ARGS...: a client guard, under its keeper when connect has one
start_client() {
	local ns=$1 pidf=$2 logf=$3 keeper=(); shift 3
	[ "$C_KEEPER" = yes ] && keeper=(--keeper)
	ip netns exec "$ns" "$STOREGUARD_BIN" connect "${keeper[@]}" --pid-file "$pidf" "$@" >>"$logf" 2>&1 &
	PIDS+=("$!")
	echo $!
}
start_worker_guard() {
	[ "$TLS" = on ] || return 0
	W_GUARD_PID=$(start_client "$NS_W" "$WORK/worker-guard.pid" "$WORK/worker-guard.log" --listen ":$CLIENT_PORT" \
		--transparent --mark "$MARK" --tls-cert "$WCERTS/tls.crt" --tls-key "$WCERTS/tls.key" \
		--tls-ca "$CERTS/ca.crt" --tls-allow 'spiffe://sg.test/master')
	wait_listen "$NS_W" "$CLIENT_PORT" 15 || die "the worker's client guard did not listen on :$CLIENT_PORT"
}
stop_worker_guard() {
	[ "$TLS" = on ] || return 0
	stop_guard "$NS_W" "$W_GUARD_PID" "$WORK/worker-guard.pid" "$CLIENT_PORT"; W_GUARD_PID=""
}

# --- the torchrun job ---------------------------------------------------------------
JOB_N=0
JOB_M=""
JOB_W=""
# job_start: one torchrun agent per host (node 1 on the master, node 2 on the worker), the same command line but
# --local-addr (the hosts share a hostname here); rendezvous through the master guard: the master's agent in plaintext
# from its own address, the worker's through its client guard. The ranks loop store ops for JOB_SECONDS at least and
# until job_stop. Sets JOB_OUT, JOB_M, JOB_W.
job_start() {
	JOB_N=$((JOB_N + 1))
	JOB_OUT=$WORK/job$JOB_N
	mkdir -p "$JOB_OUT"
	local id=sgmtls$TAG-$JOB_N ns addr name
	for name in m w; do
		if [ $name = m ]; then ns=$NS_M; addr=$M_ADDR; else ns=$NS_W; addr=$W_ADDR; fi
		ip netns exec "$ns" env GLOO_SOCKET_IFNAME=eth0 timeout 240 "$TORCHRUN" --nnodes 2 --nproc-per-node 1 \
			--rdzv-backend c10d --rdzv-endpoint "$M_ADDR:$GUARD_PORT" --rdzv-id "$id" --rdzv-conf is_host=false \
			--local-addr "$addr" --max-restarts 0 --monitor-interval 1 \
			"$WORK/job.py" "$M_ADDR" "$GUARD_PORT" "$JOB_SECONDS" "$JOB_OUT" >"$WORK/job$JOB_N-$name.log" 2>&1 &
		PIDS+=("$!")
		if [ $name = m ]; then JOB_M=$!; else JOB_W=$!; fi
	done
}
# job_wait_started SECONDS: both ranks run their op loop
job_wait_started() {
	local n=$(($1 * 10))
	while [ $n -gt 0 ]; do
		[ -e "$JOB_OUT/started0" ] && [ -e "$JOB_OUT/started1" ] && return 0
		kill -0 "$JOB_M" 2>/dev/null && kill -0 "$JOB_W" 2>/dev/null || return 1
		sleep 0.1; n=$((n - 1))
	done
	return 1
}
job_stop() { touch "$JOB_OUT/stop"; }
# job_finish LABEL: waits; PASS/FAIL on rc, the sum and 0 failed ops (the ranks' errors carry their time)
job_finish() {
	local label=$1 rcm=0 rcw=0 bad="" r ops=0 secs=""
	wait "$JOB_M" || rcm=$?
	wait "$JOB_W" || rcw=$?
	for r in 0 1; do
		if [ ! -s "$JOB_OUT/rank$r.json" ]; then bad="$bad rank $r: no result;"; continue; fi
		bad="$bad$("$PY" - "$JOB_OUT/rank$r.json" <<-'EOF'
		import json, sys
		r = json.load(open(sys.argv[1]))
		p = []
		if r["reduced"] != r["expected"] or r["world"] != 2: p.append("all_reduce %s, want %s" % (r["reduced"], r["expected"]))
		if r["failed"]: p.append("%d failed ops: %s" % (r["failed"], r["errors"]))
		if r["ops"] < 100: p.append("only %d ops" % r["ops"])
		print(" rank %d: %s;" % (r["rank"], ", ".join(p)) if p else "", end="")
		EOF
		)"
		ops=$((ops + $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ops"])' "$JOB_OUT/rank$r.json")))
		secs="$secs $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$JOB_OUT/rank$r.json")"
	done
	if [ $rcm = 0 ] && [ $rcw = 0 ] && [ -z "$bad" ]; then
		pass "$label: torchrun job $JOB_N rc 0/0, all_reduce 3.0 on both ranks, $ops store ops in${secs% } s, 0 failed ($(elapsed))"
	else
		fail "$label: torchrun job $JOB_N rc master=$rcm worker=$rcw;$bad"
		tail -n 8 "$WORK/job$JOB_N-m.log" "$WORK/job$JOB_N-w.log" | cut_lines >&2
	fi
	local ma
	ma=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["master"])' "$JOB_OUT/rank1.json" 2>/dev/null) || ma="?"
	# Not the issue's target, but where its promise ends: the ranks' default store is the rank-0 agent's own TCPStore
	# (torch 2.15's c10d rendezvous shares it with the workers), on a free port no guard fronts. The master guard saw
	# its port written (or read) through it, and must say so.
	if grep 'does not front' "$WORK/master-guard.log" | grep -Eq "master_port[^0-9]{1,3}${ma##*:}([^0-9]|\$)"; then
		pass "job $JOB_N: the ranks' own store $ma passes no guard, and the master guard's log says so"
	else
		fail "job $JOB_N: the master guard did not report the ranks' own store $ma as unguarded"
	fi
	JOB_M=""; JOB_W=""
}

# --- A: the worker's certificate rotated mid-job ----------------------------------------
phase_A() {
	if [ "$TLS" != on ]; then skipc "A3-A5 (rotation, identity in the audit, the new serial): HARNESS mode"; return; fi
	# Replace both files as a kubelet updates a secret (a new file moved over the old), key first.
	cp "$CERTS/w1-new.key" "$WCERTS/.tls.key.new"; cp "$CERTS/w1-new.crt" "$WCERTS/.tls.crt.new"
	mv "$WCERTS/.tls.key.new" "$WCERTS/tls.key"; mv "$WCERTS/.tls.crt.new" "$WCERTS/tls.crt"
	log "A: the worker's certificate replaced at $(elapsed) (serial $SER_W1 -> $SER_W1_NEW)"
	sleep 3   # the guard polls its files about every 2 s
	# A new connection through the worker's client guard: a short one, so that its flow record (written at its end)
	# is in the audit at once. It must present the new certificate.
	local got ev forms
	got=$(inw "$PY" "$WORK/numkeys.py" "$M_ADDR" "$GUARD_PORT" 2>&1 | tail -1 | cut_lines) || true
	case "$got" in [0-9]*) ;; *) fail "A4 a new connection from the worker after the rotation: $got";; esac
	forms=$(serial_forms "$SER_W1_NEW" | paste -sd'|')
	if ev=$(audit_find 8 "source.ip=$W_ADDR" "*~$forms"); then
		pass "A4 a new connection from the worker after the rotation presents the new serial $SER_W1_NEW: $ev"
	else
		fail "A4 no audit line from $W_ADDR carries the new serial $SER_W1_NEW in any form ($forms)"
		grep -a -h "$W_ADDR" "$AUDIT" "$AUDIT".flows* 2>/dev/null | tail -n 2 | cut_lines >&2 || true
	fi
	# An OpenSSL peer with the new certificate: the master's certificate verifies against the CA, and a GETNUMKEYS
	# sent over the connection is answered (8 bytes). From the intruder's namespace: in the worker's, the OUTPUT rule
	# would hand openssl's connection to the client guard.
	got=$({ printf '\000\316\367\205\074\007'; sleep 2; } | ini timeout 8 openssl s_client -quiet -connect "$M_ADDR:$GUARD_PORT" \
		-tls1_3 -cert "$WCERTS/tls.crt" -key "$WCERTS/tls.key" -CAfile "$CERTS/ca.crt" -verify_return_error \
		2>"$WORK/s_client.err" | od -An -tx1 | tr -d ' \n') || true
	if [ ${#got} = 16 ]; then
		pass "A5 openssl s_client with the worker's new certificate: the master's chain verifies, GETNUMKEYS answered ($got)"
	else
		fail "A5 openssl s_client with the worker's new certificate: reply '$got', $(grep -a -E 'verify|alert|error' "$WORK/s_client.err" | head -3 | tr '\n' ' ' | cut_lines)"
	fi	# That connection proved the worker's identity from the intruder's address, so the master's guard put that address
	# in its peer set. The connection is closed: take the address out, as its timeout would, and the guard must not put
	# it back (B-set).
	[ "$PEERS" = on ] && inm nft delete element inet storeguard_peers peers "{ $I_ADDR }" 2>/dev/null || true
}
# after the job: its flows are written
post_A() {
	local c1 ev; c1=$(relay_conns)
	if [ "$(relay_has "job/r1/k")" -ge 1 ] && [ "$(relay_has "job/r0/k")" -ge 1 ]; then
		pass "A2 both ranks' store ops reached the store through the guards (relay: $c1 connections so far)"
	else
		fail "A2 the relay did not see both ranks' ops ($c1 connections so far)"
	fi
	[ "$TLS" = on ] || return 0
	# The flow of the worker rank's own store connection (thousands of messages; not A4's short one) names it.
	if ev=$(audit_find 10 "source.ip=$W_ADDR" "storeguard.messages>500" "*~spiffe://sg.test/worker/w1"); then
		pass "A3 the master guard's flow of the worker rank's store connection names the worker's identity: $ev"
	else
		fail "A3 no flow of a job connection from $W_ADDR (> 500 messages) names spiffe://sg.test/worker/w1: $ev"
		grep -a -h "$W_ADDR" "$AUDIT" "$AUDIT".flows* 2>/dev/null | tail -n 3 | cut_lines >&2 || true
	fi
}

# --- B: the intruder ----------------------------------------------------------------
# intrude LABEL REASON ARGS...: one intruder connection with its own marker key; PASS when the store got none of it
# and the audit has the denial with the reason
intrude() {
	local label=$1 reason=$2 marker=intruder/$1-$TAG; shift 2
	local c0 got ev seen
	c0=$(relay_conns)
	got=$(ini "$PY" "$WORK/intrude.py" "$M_ADDR" "$GUARD_PORT" "$marker" "$@" 2>&1 | tail -1 | cut_lines) || true
	sleep 0.3
	seen=$(relay_has "$marker")
	if [ "$TLS" != on ]; then
		[ "$seen" -ge 1 ] && pass "B-$label harness control: with no TLS the intruder's bytes reach the store [$got]" \
			|| note "B-$label harness: the plaintext guard stopped it by itself [$got]"
		return 0
	fi
	if [ "$seen" = 0 ] && [ "$(relay_conns)" = "$c0" ]; then
		pass "B-$label 0 bytes to the store (no relay connection, the marker nowhere) [$got]"
	else
		fail "B-$label the store got the intruder's bytes: marker in $seen recordings, relay connections $c0 -> $(relay_conns) [$got]"
	fi
	if ev=$(audit_find 8 "source.ip=$I_ADDR" "event.action=denied" "event.reason=tls_$reason"); then
		pass "B-$label audited: $ev"
	else
		fail "B-$label no 'denied' tls_$reason event from $I_ADDR: $ev"
		grep -a -h "$I_ADDR" "$AUDIT" 2>/dev/null | tail -n 3 | cut_lines >&2 || true
	fi
}
phase_B() {
	local marker=intruder/torch-$TAG c0 got ev pc
	c0=$(relay_conns)
	# torch's client (10 s to import here, then retries until its timeout) runs beside the raw intruders
	# torch's client imports beside the raw intruders and connects after them: its retries count towards the intruder's
	# ban, and a ban before B-notallowed would answer that case as "banned" (it did, on a loaded machine)
	rm -f "$WORK/plainclient.go"
	ip netns exec "$NS_I" "$TORCH_PY" "$WORK/plainclient.py" "$M_ADDR" "$GUARD_PORT" "$marker" "$WORK/plainclient.go" \
		>"$WORK/plainclient.log" 2>&1 &
	pc=$!
	PIDS+=("$pc")
	intrude raw not_tls
	intrude nocert no_certificate nocert
	intrude otherca unknown_ca "$CERTS/evil-w1.crt" "$CERTS/evil-w1.key"
	intrude expired expired "$CERTS/w1-expired.crt" "$CERTS/w1-expired.key"
	intrude notallowed identity_not_allowed "$CERTS/other.crt" "$CERTS/other.key"
	touch "$WORK/plainclient.go"
	wait "$pc" || true
	got=$(tail -1 "$WORK/plainclient.log" | cut_lines)
	if [ "$TLS" = on ]; then
		[ "$(relay_has "$marker")" = 0 ] && [ "$(relay_conns)" = "$c0" ] \
			&& pass "B-plain torch's TCPStore client from the intruder: 0 bytes to the store [$got]" \
			|| fail "B-plain torch's client from the intruder reached the store (marker in $(relay_has "$marker"), relay $c0 -> $(relay_conns)) [$got]"
		# By now the five refusals above have banned the intruder (ban.violations 5, the default). A source that must
		# handshake is let through its ban to the handshake (proof beats address), so torch's client is refused as
		# tls_not_tls again: counted exactly in the metrics; in the audit log the intruder's refusals past its first 10
		# are counted in a sampled_summary (audit.md), so the log holds B-raw's tls_not_tls and the ban.
		local nb nt nm
		nb=$({ grep -a -h "\"source.ip\":\"$I_ADDR\"" "$AUDIT" 2>/dev/null || true; } | { grep -a -c '"event.action":"banned"' || true; })
		nt=$(audit_count "$I_ADDR" denied tls_not_tls)
		nm=$(inm "$PY" -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())" \
			"http://127.0.0.1:$M_METRICS/metrics" 2>/dev/null | awk '/^storeguard_tls_handshakes_total\{result="not_tls"\}/ {print $2}')
		if [ "$nt" -ge 1 ] && [ "$nb$nm" != "" ] && [ "${nm%.*}" -ge 2 ] 2>/dev/null; then
			pass "B-plain audited: torch's client refused at its handshake ($nm tls_not_tls handshakes counted, $nt in the audit log from $I_ADDR, $nb banned event)"
		else
			fail "B-plain torch's client not counted: ${nm:-no} tls_not_tls handshakes in the metrics (one is B-raw's), $nt tls_not_tls denials from $I_ADDR in the audit"
		fi
	else
		[ "$(relay_has "$marker")" -ge 1 ] \
			&& pass "B-plain harness control: torch's client from the intruder reaches the store when nothing stops it [$got]" \
			|| fail "B-plain harness control: the relay never saw the torch client's marker [$got]"
	fi
	# The ranks' own store (torchrun's shared TCPStore, on a free port of the master, which no guard fronts): with the
	# peer set, the intruder's connection is dropped and the worker's is not.
	local ma wgot pset ll got6; ma=$(cat "$JOB_OUT/started0" 2>/dev/null) || true
	if [ -n "$ma" ]; then
		got=$(ini "$PY" "$WORK/numkeys.py" "${ma%:*}" "${ma##*:}" 2>&1 | tail -1 | cut_lines) || true
		if [ "$PEERS" != on ]; then
			case "$got" in [0-9]*) note "B-shared the ranks' own store $ma (the rank-0 agent's TCPStore, MASTER_ADDR:MASTER_PORT) answers the intruder in plaintext: GETNUMKEYS = $got";;
				*) note "B-shared the ranks' own store $ma does not answer the intruder: $got";; esac
		else
			wgot=$(inw "$PY" "$WORK/numkeys.py" "${ma%:*}" "${ma##*:}" 2>&1 | tail -1 | cut_lines) || true
			# and over IPv6: torch binds the store's wildcard (libuv: "::", dual-stack), and every link has a link-local
			# address, so the rule must hold for IPv6 too
			ll=$(inm ip -6 addr show dev eth0 scope link | awk '/inet6/ {sub(/\/.*/, "", $2); print $2; exit}')
			if [ -n "$ll" ]; then
				got6=$(ini "$PY" "$WORK/numkeys.py" "$ll%eth0" "${ma##*:}" 2>&1 | tail -1 | cut_lines) || true
				case "$got6" in [0-9]*) fail "B-shared6 the ranks' own store answers the intruder over IPv6 at [$ll%eth0]:${ma##*:} (GETNUMKEYS = $got6)";;
					*) pass "B-shared6 nor over IPv6, at the master's link-local address [$ll]:${ma##*:} [$got6] (the store listens on $(inm ss -ltnH "sport = :${ma##*:}" | awk '{print $4}' | tr '\n' ' '))";; esac
			fi
			pset=$(inm nft list set inet storeguard_peers peers 2>&1 | tr -s ' \t\n' ' ')
			case "$got/$wgot" in
			[0-9]*/*) fail "B-shared the ranks' own store $ma answers the intruder (GETNUMKEYS = $got) with the peer set on; set: $pset";;
			*/[0-9]*) pass "B-shared the ranks' own store $ma (a free port of the master) does not answer the intruder [$got]; the worker, whose handshake passed, reaches it (GETNUMKEYS = $wgot)";;
			*) fail "B-shared the ranks' own store $ma answers neither the intruder [$got] nor the worker [$wgot]; set: $pset";;
			esac
			case "$pset" in
			*"$W_ADDR "*) if [[ "$pset" == *"$I_ADDR "* ]]; then fail "B-set the intruder $I_ADDR is in the master's peer set: $pset"
				else pass "B-set the master's peer set holds the worker $W_ADDR and not the intruder $I_ADDR"; fi;;
			*) fail "B-set the worker $W_ADDR is not in the master's peer set: $pset";;
			esac
		fi
	fi
}
# after the job (what it does to the worker's guard must not decide the job's outcome): the intruder connects to the
# worker's client guard itself. It carries the worker's identity: it must carry nobody else's connections, and a
# connection that no rule redirected must not make it dial itself (SO_ORIGINAL_DST is then its own address).
relay_B() {
	local marker=intruder/via-worker-$TAG got n
	got=$(ini "$PY" "$WORK/intrude.py" "$W_ADDR" "$CLIENT_PORT" "$marker" 2>&1 | tail -1 | cut_lines) || true
	sleep 1
	n=$(inw ss -tnH state established "( sport = :$CLIENT_PORT or dport = :$CLIENT_PORT )" | wc -l)
	[ "$(relay_has "$marker")" = 0 ] \
		&& pass "B-relay1 the worker's client guard ($W_ADDR:$CLIENT_PORT) does not carry the intruder's bytes to the store [$got]" \
		|| fail "B-relay1 the intruder reached the store through the worker's client guard at $W_ADDR:$CLIENT_PORT, with the worker's identity (marker in $(relay_has "$marker") recordings) [$got]"
	if [ "$n" -le 4 ]; then
		pass "B-relay2 no connection loop: $n connections at :$CLIENT_PORT a second after the intruder's"
	else
		fail "B-relay2 one connection from the intruder to $W_ADDR:$CLIENT_PORT left $n connections at :$CLIENT_PORT a second later: the transparent client guard dials its own address (SO_ORIGINAL_DST of a connection no rule redirected) again and again; log lines naming $W_ADDR:$CLIENT_PORT so far: $(grep -c "$W_ADDR:$CLIENT_PORT" "$WORK/worker-guard.log" || true)"
	fi
	sleep 2
	got=$(inw "$PY" "$WORK/numkeys.py" "$M_ADDR" "$GUARD_PORT" 2>&1 | tail -1 | cut_lines) || true
	case "$got" in [0-9]*) pass "B-relay3 the worker's own connections still go through its client guard (GETNUMKEYS $got)";;
		*) fail "B-relay3 after the intruder's connection, the worker's own connection through its client guard: $got; $(grep -c 'too many open files' "$WORK/worker-guard.log" || true) 'too many open files' in its log";; esac
}
# after the job, with the store quiet: nmap -sV against the guard's port
post_B() {
	command -v nmap >/dev/null || { skipc "B-nmap: nmap not installed"; return 0; }
	local k0 k1 b0 b1 c0 t0 svc
	t0=$(date +%s); c0=$(relay_conns); k0=$(numkeys); b0=$(relay_bytes)
	ini timeout 120 nmap -sV -Pn -n -p "$GUARD_PORT" "$M_ADDR" >"$WORK/nmap.log" 2>&1 || true
	sleep 0.5
	k1=$(numkeys); b1=$(relay_bytes)
	svc=$(grep -a "^$GUARD_PORT/" "$WORK/nmap.log" | head -1 | tr -s ' ') || true
	if [ "$TLS" = on ]; then
		if [ "$k0" = "$k1" ] && [ "$(relay_conns)" = "$c0" ] && [ "$b0" = "$b1" ]; then
			pass "B-nmap nmap -sV ($(($(date +%s) - t0)) s, '$svc'): store keys $k0 -> $k1, relay connections ($c0) and bytes ($b0) unchanged"
		else
			fail "B-nmap nmap -sV grew the store: keys $k0 -> $k1, relay connections $c0 -> $(relay_conns), bytes $b0 -> $b1"
		fi
		local n; n=$(grep -a -c "\"$I_ADDR\"" "$AUDIT" 2>/dev/null) || true
		note "B-nmap: $n audit lines name $I_ADDR; reasons: $({ grep -a "\"$I_ADDR\"" "$AUDIT" 2>/dev/null || true; } | { grep -a -o '"event.reason": *"[a-z_]*"' || true; } | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
	else
		note "B-nmap harness: nmap -sV through the plaintext guard ($(($(date +%s) - t0)) s, '$svc'): keys $k0 -> $k1, relay connections $c0 -> $(relay_conns), bytes $b0 -> $b1"
	fi
}

# --- C: upgrades and kill -9 on both ends during the job ---------------------------------
# upgrade NS PIDFILE LABEL
upgrade() {
	local out old; old=$(cat "$2")
	if out=$(ip netns exec "$1" "$STOREGUARD_BIN" upgrade --pid-file "$2" --timeout 30s 2>&1); then
		pass "$3 upgrade in place ($old -> $(cat "$2")): $(echo "$out" | tail -1 | cut_lines)"
	else
		fail "$3 upgrade in place: $(echo "$out" | tail -3 | cut_lines)"
	fi
}
# kill9 PIDFILE LABEL: kill -9 of the forwarding process; its keeper starts another
kill9() {
	local old n=100; old=$(cat "$1")
	kill -9 "$old"
	while [ "$(cat "$1")" = "$old" ] && [ $n -gt 0 ]; do n=$((n - 1)); sleep 0.1; done
	[ "$(cat "$1")" != "$old" ] && pass "$2 kill -9 of the forwarding process $old: the keeper started $(cat "$1")" \
		|| fail "$2 no new forwarding process after kill -9 of $old"
}
# upkill NS PIDFILE LABEL: an upgrade in place, and kill -9 of the new forwarding process as soon as it writes the pid
# file (read in a tight loop, with no process started per read): it has just taken every connection over, and is still
# telling its keeper so; the keeper starts another
upkill() {
	local old new p="" up end=$((SECONDS + 30)); old=$(cat "$2")
	ip netns exec "$1" "$STOREGUARD_BIN" upgrade --pid-file "$2" --timeout 30s >/dev/null 2>&1 &
	up=$!
	while [ $SECONDS -lt $end ]; do
		read -r p <"$2" || p=""
		[ -n "$p" ] && [ "$p" != "$old" ] && break
	done
	new=$p
	if [ -z "$new" ] || [ "$new" = "$old" ]; then
		fail "$3 upgrade in place: no new forwarding process in 30 s"
		wait "$up" || true
		return
	fi
	kill -9 "$new"
	wait "$up" || true
	while [ "$(cat "$2")" = "$new" ] && [ $SECONDS -lt $((end + 10)) ]; do sleep 0.1; done
	[ "$(cat "$2")" != "$new" ] && pass "$3 upgrade in place ($old -> $new), then kill -9 of $new as it wrote its pid file: the keeper started $(cat "$2")" \
		|| fail "$3 no new forwarding process after kill -9 of $new, the process an upgrade had just started"
}
phase_C() {
	if [ "$TLS" != on ]; then skipc "C (upgrades and kill -9 with mTLS): HARNESS mode"; return; fi
	log "C: $C_STEPS from $(elapsed)"
	local step i=0
	for step in $C_STEPS; do
		i=$((i + 1))
		case $step in
			m-up) upgrade "$NS_M" "$WORK/master.pid" "C$i master:";;
			w-up) upgrade "$NS_W" "$WORK/worker-guard.pid" "C$i worker:";;
			m-kill) kill9 "$WORK/master.pid" "C$i master:";;
			m-upkill) upkill "$NS_M" "$WORK/master.pid" "C$i master:";;
			# Without a keeper, a kill -9 of the worker's client guard would end it and the job with it: the step
			# fails at once instead, and the others still run.
			w-kill) if [ "$C_KEEPER" = yes ]; then kill9 "$WORK/worker-guard.pid" "C$i worker:"
				else fail "C$i worker: storeguard connect has no --keeper in this binary: no kill -9 of the worker's forwarding process"; continue; fi;;
			w-upkill) if [ "$C_KEEPER" = yes ]; then upkill "$NS_W" "$WORK/worker-guard.pid" "C$i worker:"
				else fail "C$i worker: storeguard connect has no --keeper in this binary: no kill -9 of the worker's forwarding process"; continue; fi;;
			*) fail "C: unknown step '$step' in C_STEPS"; continue;;
		esac
		sleep 1.5
	done
}

# --- D: the policy issue's attacks, with the policy stage off -----------------------------
# attack NS HOST PORT RUNID LABEL: policy_attack.py's pickle (os.system) into torchrun's rendezvous state by SET,
# COMPARE_SET and MULTI_SET, each on a connection of its own; the run id is the marker
attack() {
	local key="torch.rendezvous.$4" v="{\"pickle_system\":\"touch $WORK/pwned-$4\"}" spec
	spec="[{\"op\":\"set\",\"key\":\"$key\",\"value\":$v,\"tag\":\"set\"},{\"op\":\"compare_set\",\"key\":\"$key\",\"value\":$v,\"tag\":\"cas\"},"
	spec="$spec{\"op\":\"multi_set\",\"key\":\"$key\",\"value\":$v,\"tag\":\"mset\"}]"
	ip netns exec "$1" timeout 90 "$TORCH_PY" -W ignore "$ROOT/interop/policy_attack.py" "$2" "$3" "$spec" --timeout 3 \
		>"$WORK/attack-$5.log" 2>&1 || true
}
raised() { grep -c '"raised": true' "$WORK/attack-$1.log" || true; }
check_D() {
	# Nothing but identity may stop the intruder: the policy stage off, and bans off (else the refusals of D1 and D2
	# would soon be for the ban they earned).
	start_master $'policy:\n  rendezvous-state: "off"\n  pickle-globals: "off"\n  write-once: "off"\nban:\n  violations: 0'
	start_worker_guard
	local run c0 ev ipid
	if [ "$TLS" != on ]; then
		run=harness$TAG
		attack "$NS_I" "$M_ADDR" "$GUARD_PORT" "$run" harness
		[ "$(relay_has "torch.rendezvous.$run")" -ge 1 ] \
			&& pass "D0 harness control: policy off, plaintext guard: the intruder's pickle SET reaches the store" \
			|| fail "D0 harness control: policy off, the intruder's attack never reached the store: $(head -c 600 "$WORK/attack-harness.log")"
		skipc "D1-D2 (blocked by identity): HARNESS mode"
		stop_worker_guard; stop_master; return
	fi
	# Control: from the allowed worker, through its client guard, the same attack reaches the store.
	run=ctl$TAG
	attack "$NS_W" "$M_ADDR" "$GUARD_PORT" "$run" worker
	[ "$(relay_has "torch.rendezvous.$run")" -ge 1 ] \
		&& pass "D0 control: policy off, the pickle SET from the allowed worker reaches the store (so what stops the intruder is identity)" \
		|| fail "D0 control: the worker's attack never reached the store: is the policy stage off? $(head -c 600 "$WORK/attack-worker.log")"
	# D1 in plaintext and D2 through the intruder's own client guard (a certificate of the right CA, an identity not on
	# the list), side by side: neither may open a connection to the store.
	ipid=$(start_client "$NS_I" "$WORK/intruder-guard.pid" "$WORK/intruder-guard.log" --listen "127.0.0.1:$IN_CLIENT_PORT" \
		--server "$M_ADDR:$GUARD_PORT" --tls-cert "$CERTS/other.crt" --tls-key "$CERTS/other.key" \
		--tls-ca "$CERTS/ca.crt" --tls-allow 'spiffe://sg.test/master')
	wait_listen "$NS_I" "$IN_CLIENT_PORT" 15 || fail "D2 the intruder's client guard did not listen on :$IN_CLIENT_PORT"
	c0=$(relay_conns)
	attack "$NS_I" "$M_ADDR" "$GUARD_PORT" "plain$TAG" plain &
	local d1=$!
	attack "$NS_I" 127.0.0.1 "$IN_CLIENT_PORT" "mtls$TAG" other
	wait "$d1" || true
	if [ "$(relay_has "torch.rendezvous.plain$TAG")" = 0 ] && [ "$(relay_conns)" = "$c0" ]; then
		pass "D1 the attacks in plaintext from the intruder: 0 bytes to the store ($(raised plain) of 3 raised)"
	else
		fail "D1 the intruder's plaintext attacks reached the store (relay $c0 -> $(relay_conns))"
	fi
	ev=$(audit_find 8 "source.ip=$I_ADDR" "event.action=denied" "event.reason=tls_not_tls") \
		&& pass "D1 audited: $ev" || fail "D1 no tls_not_tls denial from $I_ADDR: $ev"
	run=mtls$TAG
	if [ "$(relay_has "torch.rendezvous.$run")" = 0 ] && [ "$(relay_conns)" = "$c0" ]; then
		pass "D2 the attacks through the intruder's own client guard (spiffe://sg.test/other): 0 bytes to the store ($(raised other) of 3 raised)"
	else
		fail "D2 the attacks with a not-allowed identity reached the store (relay $c0 -> $(relay_conns))"
	fi
	ev=$(audit_find 8 "source.ip=$I_ADDR" "event.action=denied" "event.reason=tls_identity_not_allowed") \
		&& pass "D2 audited: $ev" || fail "D2 no tls_identity_not_allowed denial from $I_ADDR: $ev"
	stop_pid "$ipid"
	stop_worker_guard
	stop_master
}

# --- E: proof beats address -----------------------------------------------------------
cat >"$WORK/plainprobe.py" <<'EOF'
# plainprobe.py HOST PORT N [SRC]: N plaintext TCPStore connections (VALIDATE, GETNUMKEYS) from SRC; prints how many the
# peer answered
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = sys.argv[4] if len(sys.argv) > 4 else None
answered = 0
for _ in range(n):
    s = socket.create_connection((host, port), timeout=5, source_address=(src, 0) if src else None)
    try:
        s.sendall(bytes.fromhex("00cef7853c07"))
        if s.recv(8):
            answered += 1
    except OSError:
        pass
    s.close()
print(answered)
EOF
cat >"$WORK/burst.py" <<'EOF'
# burst.py HOST PORT N: N TCPStore connections open at once (a host restarting its ranks), each VALIDATE, GETNUMKEYS;
# prints how many were answered
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns, answered = [], 0
for _ in range(n):
    try:
        conns.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        pass
for s in conns:
    try:
        s.sendall(bytes.fromhex("00cef7853c07"))
        b = b""
        while len(b) < 8:
            d = s.recv(8 - len(b))
            if not d:
                break
            b += d
        answered += len(b) == 8
    except OSError:
        pass
print(answered)
EOF
phase_E() {
	if [ "$TLS" != on ]; then skipc "E (proof beats address): HARNESS mode"; return; fi
	local got
	# E1 a local user of the worker: plaintext to the guard's own port, past the worker's redirect
	got=$(inw setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" - "$M_ADDR" "$OWN_PORT" 6 <"$WORK/plainprobe.py" 2>&1 \
		| tail -1 | cut_lines) || true
	sleep 0.5
	if [ "$(audit_count "$W_ADDR" banned tls_not_tls)" -ge 1 ] && [ "$got" = 0 ]; then
		pass "E1 a local user's 6 plaintext connections from the worker (uid 65534, to :$OWN_PORT): 0 answered, the worker's address banned"
	else
		fail "E1 the local user's plaintext: '$got' answered, $(audit_count "$W_ADDR" banned tls_not_tls) banned events for $W_ADDR"
	fi
	# E2 two addresses of the /64 (the intruder's): 4 plaintext connections each
	ini "$PY" "$WORK/plainprobe.py" "$M_ADDR6" "$GUARD_PORT" 4 "$I_ADDR6" >/dev/null 2>&1 || true
	got=$(ini "$PY" "$WORK/plainprobe.py" "$M_ADDR6" "$GUARD_PORT" 4 "$I_ADDR6B" 2>&1 | tail -1 | cut_lines) || true
	sleep 0.5
	local nb6=$(($(audit_count "$I_ADDR6" banned tls_not_tls) + $(audit_count "$I_ADDR6B" banned tls_not_tls)))
	if [ "$nb6" -ge 1 ]; then
		pass "E2 8 plaintext connections from two addresses of the worker's /64 ban it ('$got' of the last 4 answered)"
	else
		fail "E2 the /64 was not banned: $nb6 banned events from $I_ADDR6 and $I_ADDR6B"
	fi
	# E3 the worker's ranks come back through its client guard, from the banned address and the banned /64
	local v4 v6 p4 ev
	v4=$(inw "$PY" "$WORK/numkeys.py" "$M_ADDR" "$GUARD_PORT" 2>&1 | tail -1 | cut_lines) || true
	v6=$(inw "$PY" "$WORK/numkeys.py" "$M_ADDR6" "$GUARD_PORT" 2>&1 | tail -1 | cut_lines) || true
	p4=$(inw setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" - "$M_ADDR" "$OWN_PORT" 1 <"$WORK/plainprobe.py" 2>&1 \
		| tail -1 | cut_lines) || true
	case "$v4/$v6" in
		[0-9]*/[0-9]*) pass "E3 new connections of the worker's ranks over mutual TLS from the banned $W_ADDR and the banned /64 ($W_ADDR6): answered ($v4, $v6 keys)";;
		*) fail "E3 the worker's proven connections were refused: IPv4 '$v4', IPv6 '$v6'";;
	esac
	[ "$p4" = 0 ] && pass "E3 plaintext from the banned worker address is still refused" \
		|| fail "E3 plaintext from the banned worker address: '$p4' answered"
	if ev=$(audit_find 8 "source.ip=$W_ADDR6" "storeguard.identity=spiffe://sg.test/worker/w1"); then
		pass "E3 the master guard's audit has the IPv6 connection as the worker's identity: $ev"
	else
		fail "E3 no audit line from $W_ADDR6 names the worker's identity: $ev"
	fi
}
# after the job, the bans still on: the worker holds no connection now (as at a job's start, between rounds, at an
# elastic restart), so no "serving a job" throttle lets it in; its ranks must be, all at once
post_E() {
	[ "$TLS" = on ] || return 0
	local v4 v6
	sleep 1
	v4=$(inw "$PY" "$WORK/burst.py" "$M_ADDR" "$GUARD_PORT" 16 2>&1 | tail -1 | cut_lines) || true
	v6=$(inw "$PY" "$WORK/burst.py" "$M_ADDR6" "$GUARD_PORT" 16 2>&1 | tail -1 | cut_lines) || true
	if [ "$v4" = 16 ] && [ "$v6" = 16 ]; then
		pass "E4 after the job, still banned, holding no connection: 16 new connections of the worker at once answered from $W_ADDR and 16 from the /64"
	else
		fail "E4 after the job, the banned worker's 16 new connections: '$v4' answered (IPv4), '$v6' (IPv6 /64), want 16 each"
	fi
}

# --- run -----------------------------------------------------------------------------
for c in $CHECKS; do case $c in A|B|C|D|E) ;; *) die "unknown check '$c' (CHECKS takes A B C D E)";; esac; done
# A, B, E and C share one job (in that order: the rotation, the intruder, the banned worker, then the upgrades, which
# reconnect the worker from its banned address; the ranks' failed ops carry their time); each also runs alone.
if want A || want B || want C || want E; then
	start_master
	start_worker_guard
	job_start
	t0=$(date +%s)
	if job_wait_started 150; then
		log "the job's ranks loop store ops from $(elapsed) (torchrun start: $(($(date +%s) - t0)) s)"
		sleep 2
		for c in A B E C; do
			want $c || continue
			t0=$(date +%s); "phase_$c"; log "phase $c took $(($(date +%s) - t0)) s"
		done
	else
		fail "the job's ranks never started their op loop"
		tail -n 15 "$WORK/job$JOB_N-"*.log | cut_lines >&2
	fi
	job_stop
	job_finish "A1/B1/C1 the job ($(for c in A B E C; do want $c && printf '%s' "$c"; done) during it)"
	want A && post_A
	want B && post_B
	want E && post_E
	want B && [ "$TLS" = on ] && relay_B
	stop_worker_guard
	stop_master
fi
if want D; then t0=$(date +%s); check_D; log "check D took $(($(date +%s) - t0)) s"; fi
summary
[ "$FAILED" = 0 ] || exit 1
