#!/usr/bin/env bash
# Mutual TLS between two guards, side by side with stunnel and HAProxy doing the same at both ends,
# in one interleaved run on loopback against a real torch TCPStore (issue 27's benchmark):
#
#   direct            bench -> store                                         (reference)
#   sg-plain          bench -> storeguard serve -> store                     (reference)
#   sg-tls            bench -> storeguard connect =mTLS=> storeguard serve -> store
#   stunnel           bench -> stunnel client =mTLS=> stunnel server -> store
#   haproxy-tls       bench -> haproxy (server ... ssl) =mTLS=> haproxy (bind ... ssl) -> store
#
# Every TLS hop is TLS 1.3 with client certificates required at the server end and the server's
# certificate verified at the client end, all from one throw-away CA made here with openssl (EC
# P-256; SPIFFE URI SANs spiffe://sg.test/master and spiffe://sg.test/worker/w1). Workloads are
# `storeguard bench` runs: get at 1, 16 and 64 connections (ops/s, p50 added over direct) and
# connect (dial + handshake + one GET per new connection: the set-up p99 through the whole chain).
# Before measuring, each TLS server end is probed (bench/tlsprobe.py, a plaintext bench client);
# after, one set-up burst per chain is captured with tshark to show what the handshakes negotiate
# (suite, key exchange group, resumption). Writes docs/benchmarks-tls.md and raw JSON under $OUT.
#
#   bench/tls-side-by-side.sh          # from the repository root; ~10 minutes with the defaults
#
# Knobs (environment): DURATION (per run, 2s), WARMUP (300ms), REPS (5), WORKLOADS ("get:1 get:16
# get:64 connect:1 connect:16"), STORE (torch2.6-libuv | torch2.6-legacy | torch1.13-legacy),
# CAPTURE (1: the tshark handshake capture), BUDGET_S (600: later repetitions are skipped past
# this), OUT (/tmp/sg-tlsbench), DOC (docs/benchmarks-tls.md), BASE_PORT (29940; 8 ports),
# CONNECT_ARGS (extra flags for `storeguard connect`), SG_TLS_ARGS (extra flags for both storeguard
# ends, such as "--tls-key-exchange x25519", the group stunnel and HAProxy negotiate here).
#
# The storeguard chain needs `storeguard connect` and serve's --tls-* flags; a build without them
# runs the other four targets and says so in the doc. Kills only the processes it started.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-2s}
WARMUP=${WARMUP:-300ms}
REPS=${REPS:-5}
read -r -a WORKLOADS <<<"${WORKLOADS:-get:1 get:16 get:64 connect:1 connect:16}"
STORE=${STORE:-torch2.6-libuv}
CAPTURE=${CAPTURE:-1}
BUDGET_S=${BUDGET_S:-600}
OUT=${OUT:-/tmp/sg-tlsbench}
DOC=${DOC:-$ROOT/docs/benchmarks-tls.md}
BASE_PORT=${BASE_PORT:-29940}
read -r -a CONNECT_ARGS <<<"${CONNECT_ARGS:-}"
read -r -a SG_TLS_ARGS <<<"${SG_TLS_ARGS:-}"
SG=$OUT/storeguard
TORCH=/var/cache/storeguard/torch
PKI=$OUT/pki

case $STORE in
torch2.6-libuv) PY=$TORCH/2.6.0/bin/python BACKEND=libuv GEN=2.6 ;;
torch2.6-legacy) PY=$TORCH/2.6.0/bin/python BACKEND=legacy GEN=2.6 ;;
torch1.13-legacy) PY=/usr/bin/python3 BACKEND=default GEN=1.13 ;;
*) echo "unknown STORE $STORE" >&2; exit 2 ;;
esac
SG_BACKEND=${BACKEND/default/legacy}

# Ports: the store, then each target's entry (what the bench dials) and, for two-ended chains,
# the server end (what the client end dials over TLS).
P_STORE=$BASE_PORT
P_SG_PLAIN=$((BASE_PORT + 1))
P_SG_SERVER=$((BASE_PORT + 2)) P_SG_CLIENT=$((BASE_PORT + 3))
P_ST_SERVER=$((BASE_PORT + 4)) P_ST_CLIENT=$((BASE_PORT + 5))
P_HA_SERVER=$((BASE_PORT + 6)) P_HA_CLIENT=$((BASE_PORT + 7))

PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	sleep 0.5
	for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
	wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%4ds] %s\n' "$SECONDS" "$*" >&2; }
over_budget() { [ "$SECONDS" -ge "$BUDGET_S" ]; }
wait_port() { # wait until 127.0.0.1:$1 listens
	for _ in $(seq 300); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.1
	done
	log "port $1 never opened"
	return 1
}

for tool in stunnel4 haproxy openssl; do
	command -v $tool >/dev/null || { log "$tool is missing: scripts/install-deps.sh installs it"; exit 1; }
done
[ -x "$PY" ] || { log "no $PY: scripts/install-deps.sh installs the torch environments"; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/runs" "$OUT/logs" "$PKI"
log "building storeguard"
(cd "$ROOT" && go build -o "$SG" ./cmd/storeguard) || exit 1
ulimit -n "$(ulimit -Hn)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- certificates
# One CA; SPIFFE X.509-SVID-shaped leaves (URI SAN, both server and client auth as the SPIFFE
# spec has them), valid for a day. The master's also names 127.0.0.1, for clients that check
# addresses; none here does (the proxies check the chain, storeguard the SPIFFE ID).
mkcert() { # name uri [extra SANs]
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$1.key" 2>/dev/null &&
		openssl req -new -key "$PKI/$1.key" -subj "/O=storeguard bench/CN=$1" -out "$PKI/$1.csr" &&
		printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
			"extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=URI:$2${3:+,$3}" >"$PKI/$1.ext" &&
		openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
			-days 1 -sha256 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null &&
		cat "$PKI/$1.crt" "$PKI/$1.key" >"$PKI/$1.pem" # HAProxy's crt: certificate and key in one file
}
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null &&
	openssl req -x509 -new -key "$PKI/ca.key" -subj "/O=storeguard bench/CN=bench CA" -days 1 -sha256 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$PKI/ca.crt" &&
	mkcert master spiffe://sg.test/master "IP:127.0.0.1,DNS:localhost" &&
	mkcert worker spiffe://sg.test/worker/w1 &&
	openssl verify -CAfile "$PKI/ca.crt" "$PKI/master.crt" "$PKI/worker.crt" >"$OUT/logs/pki.log" ||
	{ log "could not make the certificates"; exit 1; }
# A CA of its own and a leaf under it: a client the servers must refuse.
mkdir -p "$PKI/other" && (
	PKI=$PKI/other
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null &&
		openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=other CA" -days 1 -out "$PKI/ca.crt" &&
		mkcert worker spiffe://sg.test/worker/w1
) || { log "could not make the foreign certificate"; exit 1; }

# ---------------------------------------------------------------- parties
# The torch 2.x stores call getnameinfo() per accepted connection; with no resolver on this
# loopback-only host that stalls them seconds a lookup (see side-by-side.sh): a private resolv.conf.
echo "nameserver 127.0.0.1" >"$OUT/resolv.conf"
start_store() { # port
	if unshare -m true 2>/dev/null; then
		unshare -m sh -c "mount --bind '$OUT/resolv.conf' /etc/resolv.conf && exec '$PY' '$ROOT/bench/torchstore.py' $1 $BACKEND" \
			>"$OUT/logs/store.out" 2>"$OUT/logs/store.err" &
	else
		RES_OPTIONS="attempts:1 timeout:1" "$PY" "$ROOT/bench/torchstore.py" $1 $BACKEND \
			>"$OUT/logs/store.out" 2>"$OUT/logs/store.err" &
	fi
	PIDS+=($!)
	STORE_PID=$!
}

start_sg_serve() { # listen tag [serve flags...] -> $LAST
	STOREGUARD_CAPS_MAX_CONNECTIONS=1000000 STOREGUARD_CAPS_PER_SOURCE_CONNECTIONS=0 \
		STOREGUARD_CAPS_PER_SOURCE_RATE=0 STOREGUARD_CAPS_PER_SOURCE_STORE_CONNECTIONS=0 \
		STOREGUARD_CAPS_STORE_DIAL_RATE=0 STOREGUARD_CAPS_PER_SOURCE_STORE_DIAL_RATE=0 \
		"$SG" serve --listen "127.0.0.1:$1" --upstream "127.0.0.1:$P_STORE" --metrics-listen '' \
		--generation "$GEN" --backend "$SG_BACKEND" --audit-log "$OUT/logs/audit-$2.jsonl" --log-level warn \
		"${@:3}" >"$OUT/logs/sg-$2.log" 2>&1 &
	PIDS+=($!)
	LAST=$!
}

start_sg_connect() { # listen server -> $LAST
	"$SG" connect --listen "127.0.0.1:$1" --server "127.0.0.1:$2" --tls-cert "$PKI/worker.crt" \
		--tls-key "$PKI/worker.key" --tls-ca "$PKI/ca.crt" --tls-allow spiffe://sg.test/master --log-level warn \
		"${SG_TLS_ARGS[@]}" "${CONNECT_ARGS[@]}" >"$OUT/logs/sg-connect.log" 2>&1 &
	PIDS+=($!)
	LAST=$!
}

# stunnel: Debian's stunnel4 (a thread per connection). Log level warning, as storeguard's; its
# default (notice) writes two lines per connection.
start_stunnel() { # tag conf-lines... -> $LAST
	printf '%s\n' "foreground = yes" "pid =" "debug = 4" "[$1]" "${@:2}" >"$OUT/stunnel-$1.conf"
	stunnel4 "$OUT/stunnel-$1.conf" >"$OUT/logs/stunnel-$1.log" 2>&1 &
	PIDS+=($!)
	LAST=$!
}

# HAProxy 2.6, mode tcp, 2 threads per process (as in side-by-side.sh).
start_haproxy() { # tag bind-line server-line -> $LAST
	cat >"$OUT/haproxy-$1.cfg" <<EOF
global
    maxconn 8000
    nbthread 2
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend fe
    $2
    default_backend be
backend be
    $3
EOF
	haproxy -db -f "$OUT/haproxy-$1.cfg" >"$OUT/logs/haproxy-$1.log" 2>&1 &
	PIDS+=($!)
	LAST=$!
}

SG_TLS=1
if [[ $("$SG" serve --help 2>&1) != *--tls-mode* ]] || ! "$SG" connect --help >/dev/null 2>&1; then
	SG_TLS=0
	echo "this build has no \`storeguard connect\` or no \`serve --tls-mode\`: the storeguard chain was not run" \
		>"$OUT/missing.txt"
	log "storeguard has no connect/--tls-mode: sg-tls skipped"
fi

log "$STORE: store on $P_STORE"
start_store $P_STORE
wait_port $P_STORE || exit 1
declare -A ADDR WATCH
TARGETS=(direct sg-plain)
ADDR[direct]=$P_STORE
WATCH[direct]="--watch-pid $STORE_PID"

start_sg_serve $P_SG_PLAIN plain
ADDR[sg-plain]=$P_SG_PLAIN
WATCH[sg-plain]="--watch-pid $STORE_PID --watch-pid $LAST"

if [ $SG_TLS = 1 ]; then
	start_sg_serve $P_SG_SERVER tls --tls-mode on --tls-cert "$PKI/master.crt" --tls-key "$PKI/master.key" \
		--tls-ca "$PKI/ca.crt" --tls-allow 'spiffe://sg.test/worker/*' --tls-plaintext-sources 10.255.255.255/32 \
		"${SG_TLS_ARGS[@]}"
	s=$LAST
	start_sg_connect $P_SG_CLIENT $P_SG_SERVER
	TARGETS+=(sg-tls)
	ADDR[sg-tls]=$P_SG_CLIENT
	WATCH[sg-tls]="--watch-pid $STORE_PID --watch-pid $LAST --watch-pid $s"
fi

TLS13="sslVersionMin = TLSv1.3"
start_stunnel server "accept = 127.0.0.1:$P_ST_SERVER" "connect = 127.0.0.1:$P_STORE" \
	"cert = $PKI/master.crt" "key = $PKI/master.key" "CAfile = $PKI/ca.crt" "verify = 2" "$TLS13"
s=$LAST
start_stunnel client "client = yes" "accept = 127.0.0.1:$P_ST_CLIENT" "connect = 127.0.0.1:$P_ST_SERVER" \
	"cert = $PKI/worker.crt" "key = $PKI/worker.key" "CAfile = $PKI/ca.crt" "verify = 2" "$TLS13"
TARGETS+=(stunnel)
ADDR[stunnel]=$P_ST_CLIENT
WATCH[stunnel]="--watch-pid $STORE_PID --watch-pid $LAST --watch-pid $s"

start_haproxy server \
	"bind 127.0.0.1:$P_HA_SERVER ssl crt $PKI/master.pem ca-file $PKI/ca.crt verify required ssl-min-ver TLSv1.3" \
	"server store 127.0.0.1:$P_STORE"
s=$LAST
start_haproxy client "bind 127.0.0.1:$P_HA_CLIENT" \
	"server master 127.0.0.1:$P_HA_SERVER ssl crt $PKI/worker.pem ca-file $PKI/ca.crt verify required ssl-min-ver TLSv1.3"
TARGETS+=(haproxy-tls)
ADDR[haproxy-tls]=$P_HA_CLIENT
WATCH[haproxy-tls]="--watch-pid $STORE_PID --watch-pid $LAST --watch-pid $s"

declare -A SERVER_END=([stunnel]=$P_ST_SERVER [haproxy-tls]=$P_HA_SERVER)
[ $SG_TLS = 1 ] && SERVER_END[sg-tls]=$P_SG_SERVER
for t in "${TARGETS[@]}"; do wait_port "${ADDR[$t]}" || exit 1; done
for t in "${!SERVER_END[@]}"; do wait_port "${SERVER_END[$t]}" || exit 1; done
# Under --keeper (SG_TLS_ARGS) the forwarding process is each keeper's child: its CPU is watched too.
for t in sg-plain sg-tls; do
	for p in ${WATCH[$t]:-}; do
		[ "$p" = --watch-pid ] && continue
		for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do
			[ "$(readlink /proc/"$c"/exe 2>/dev/null)" = "$(readlink -f "$SG")" ] && WATCH[$t]+=" --watch-pid $c"
		done
	done
done
head -1 "$OUT/logs/store.out" >"$OUT/store.txt"

bench() { # file args...: one bench run, JSON into file
	local f=$1
	shift
	timeout 120 "$SG" bench --json --generation "$GEN" "$@" >"$f" 2>>"$OUT/logs/bench.err" || true
}

# ---------------------------------------------------------------- the TLS server ends refuse what they must
# Each server end, asked directly (the bench's own traffic goes through the client ends): the
# worker's certificate; none; one of another CA; the master's (the right CA, an identity not on
# storeguard's list: the two OpenSSL proxies check the chain only, so they take it); and a
# plaintext torch client (a bench run: how many GETs got a reply).
log "probing the TLS server ends"
for t in sg-tls stunnel haproxy-tls; do
	p=${SERVER_END[$t]:-}
	[ -n "$p" ] || continue
	probe() { printf '%s\t%s\t%s\n' "$t" "$1" "$(timeout 10 python3 "$ROOT/bench/tlsprobe.py" "127.0.0.1:$p" "$PKI/ca.crt" "${@:2}")"; }
	probe "worker certificate (spiffe://sg.test/worker/w1)" "$PKI/worker.crt" "$PKI/worker.key"
	probe "no client certificate"
	probe "certificate of another CA" "$PKI/other/worker.crt" "$PKI/other/worker.key"
	probe "right CA, identity not allowed (spiffe://sg.test/master)" "$PKI/master.crt" "$PKI/master.key"
	timeout 30 "$SG" bench --json --generation "$GEN" --addr "127.0.0.1:$p" --op get --conns 1 --duration 500ms \
		--timeout 2s --dial-timeout 2s >"$OUT/plaintext-$t.json" 2>"$OUT/logs/plaintext-$t.err"
	printf '%s\tplaintext torch client\t%s\n' "$t" "$(python3 -c '
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:  # no result at all
    r = {"ops": 0, "errors": 0}
err = open(sys.argv[2]).read().strip().splitlines()
why = "" if r["ops"] else ": " + (err[-1] if err else "no result")  # its prefill failed, say how
print("%d GETs answered, %d errors%s" % (r["ops"], r["errors"], why))' "$OUT/plaintext-$t.json" "$OUT/logs/plaintext-$t.err")"
done >"$OUT/probes.tsv"
cat "$OUT/probes.tsv" >&2

# ---------------------------------------------------------------- interleaved runs
# For each repetition, each workload runs against every target in turn; the order of the
# targets rotates from one repetition to the next, so none always runs first or last.
for rep in $(seq "$REPS"); do
	if over_budget; then log "budget spent: repetition $rep and later skipped"; break; fi
	n=${#TARGETS[@]}
	order=()
	for k in $(seq 0 $((n - 1))); do order+=("${TARGETS[$(((k + rep - 1) % n))]}"); done
	for wl in "${WORKLOADS[@]}"; do
		op=${wl%:*} conns=${wl#*:}
		for t in "${order[@]}"; do
			mkdir -p "$OUT/runs/$t"
			bench "$OUT/runs/$t/$op-$conns-$rep.json" --addr "127.0.0.1:${ADDR[$t]}" --op "$op" \
				--conns "$conns" --duration "$DURATION" --warmup "$WARMUP" --timeout 10s --dial-timeout 10s \
				${WATCH[$t]}
		done
	done
	log "repetition $rep of $REPS done (${order[*]})"
done

# ---------------------------------------------------------------- what the handshakes negotiate
# One second of connect:1 per chain, its TLS hop captured: ServerHellos with their suite, key
# exchange group and whether they accepted a pre-shared key (a resumed session).
if [ "$CAPTURE" = 1 ] && command -v tshark >/dev/null; then
	for t in sg-tls stunnel haproxy-tls; do
		p=${SERVER_END[$t]:-}
		[ -n "$p" ] || continue
		f=$OUT/capture-$t.pcap
		tshark -q -i lo -f "tcp port $p" -w "$f" >"$OUT/logs/tshark-$t.log" 2>&1 &
		cap=$!
		PIDS+=($cap)
		for _ in $(seq 50); do grep -qs Capturing "$OUT/logs/tshark-$t.log" && break; sleep 0.1; done
		sleep 0.3
		bench "$OUT/capture-$t.json" --addr "127.0.0.1:${ADDR[$t]}" --op connect --conns 1 --duration 1s
		sleep 0.3
		kill -INT $cap 2>/dev/null
		wait $cap 2>/dev/null
		tshark -r "$f" -d "tcp.port==$p,tls" -Y "tls.handshake.type == 2" -T fields \
			-e tls.handshake.ciphersuite -e tls.handshake.extensions_key_share_group \
			-e tls.handshake.extension.type 2>/dev/null |
			awk -v t="$t" -F'\t' '{
				n++; suite[$1]++; group[$2]++
				if ($3 ~ /(^|,)41(,|$)/) psk++ # pre_shared_key in a ServerHello: the server resumed
			} END {
				s = ""; for (k in suite) s = s k " x" suite[k] ";"
				g = ""; for (k in group) g = g k " x" group[k] ";"
				printf "%s\t%d\t%d\t%s\t%s\n", t, n, psk, s, g
			}'
	done >"$OUT/handshakes.tsv"
	cat "$OUT/handshakes.tsv" >&2
fi

# ---------------------------------------------------------------- machine and report
{
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
	echo "cores: $(nproc)"
	echo "kernel: $(uname -r)"
	echo "go: $(cd "$ROOT" && go version | awk '{print $3}')"
	echo "storeguard: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- . ':!docs' || echo ' (+ uncommitted changes)')"
	echo "stunnel: $(stunnel4 -version 2>&1 | grep -m1 '^stunnel' | awk '{print $2}'), $(stunnel4 -version 2>&1 | grep -m1 '^Running' | sed 's/^Running *with *//')"
	echo "haproxy: $(haproxy -v | head -1 | awk '{print $3}'), $(haproxy -vv | sed -n 's/^Running on OpenSSL version : //p')"
	echo "load average (1, 5, 15 min) at the start: $LOAD_BEFORE; at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "store: $STORE ($(cat "$OUT/store.txt"))"
	echo "extra storeguard flags: both ends: ${SG_TLS_ARGS[*]:-none}; connect: ${CONNECT_ARGS[*]:-none}"
} >"$OUT/machine.txt"
log "writing $DOC"
python3 "$ROOT/bench/summarize-tls.py" "$OUT" "$DURATION" "$REPS" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC" && cat "$DOC"
log "done in ${SECONDS}s"
