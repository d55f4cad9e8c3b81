#!/usr/bin/env bash
# Scale: a large job's start through storeguard's embedded defaults, against real torch stores,
# side by side in one run with a direct connection, storeguard with store pacing off
# (caps.store-dial-rate: 0) and HAProxy (mode tcp). Writes docs/benchmarks-scale.md and raw JSON
# under $OUT; kills everything it started on exit.
#
#   bench/scale.sh                 # from the repository root; about 15 minutes
#
# The start: N clients, PER_HOST from each loopback source (127.10.x.y), each connecting, ADDing 1
# to an init key and WAITing for a done key the last one sets (`storeguard bench --op rendezvous
# --per-host`), REPS times each; min / median / max, and each proxy's median over direct's.
# Beside each start's time: the SYNs the store's full accept queue dropped (TcpExtListenOverflows) and the
# proxy's CPU seconds.
# Stores: torch 2.4.1 libuv, torch 2.15 libuv in a mount namespace whose nsswitch.conf says
# `hosts: files` (a resolver that answers at once, as a cluster's does: torch 2.6+ resolves each new
# peer's name in the thread that serves every client), torch 1.13 legacy (Debian's).
#
# Then the stalled resolver (torch 2.15 with this machine's resolver, which stalls 5 s past some
# lookups a second, in a mount namespace whose /etc/hosts is Debian's and a pod's: 127.0.0.1 and ::1
# named localhost; this machine's names no ::1): a churn of 150 one-message connections a second
# for 8 s, from 1 source and from 15, with a new rank's first op timed at 2 s, 6 s and after
# (bench/churn.py), direct and through the defaults; and the 2,000-client start, through the
# defaults and direct.
#
# Then mutual TLS: the 2,000-client start through `storeguard connect` to `serve --tls-mode on` (a
# handshake a rank, resumption on), against plaintext through serve, both with the per-source caps
# lifted: one connect guard on loopback stands for the guards of 250 hosts, which serve would see as
# 250 sources.
#
# Knobs (environment): SIZES ("2000 8000"), REPS (3), PER_HOST (8), OUT (/tmp/sg-scale),
# DOC (docs/benchmarks-scale.md), STALLED (1: the stalled-resolver part; 0 skips it), MTLS (1: the
# mutual-TLS part; 0 skips it), MTLS_SIZE (2000), CLIENT_CPUS and SERVER_CPUS (CPU lists, as taskset
# takes them; both unset by default: every process on every CPU). With both set, the clients run
# on CLIENT_CPUS and the store and the proxies on SERVER_CPUS: a cluster's shape, where the ranks'
# CPU is not the store host's (`CLIENT_CPUS=0 SERVER_CPUS=1 DOC=docs/benchmarks-scale-split.md`).
# BENCH_DOC (docs/benchmarks.md when DOC is in docs/; empty: none) gets DOC's text as a block of its own, which
# bench/side-by-side.sh keeps when it writes that file anew.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZES=${SIZES:-2000 8000}
REPS=${REPS:-3}
PER_HOST=${PER_HOST:-8}
OUT=${OUT:-/tmp/sg-scale}
DOC=${DOC:-$ROOT/docs/benchmarks-scale.md}
case $DOC in "$ROOT"/docs/*) BENCH_DOC=${BENCH_DOC-$ROOT/docs/benchmarks.md} ;; *) BENCH_DOC=${BENCH_DOC-} ;; esac
STALLED=${STALLED:-1}
MTLS=${MTLS:-1}
MTLS_SIZE=${MTLS_SIZE:-2000}
TORCH=/var/cache/storeguard/torch
SG=$OUT/storeguard
BASE_PORT=${BASE_PORT:-29700} # below the ephemeral range, so that no client's port takes a listener's
CLIENT_CPUS=${CLIENT_CPUS:-}
SERVER_CPUS=${SERVER_CPUS:-}
if [ "${CLIENT_CPUS:+set}" != "${SERVER_CPUS:+set}" ]; then
	echo "set both CLIENT_CPUS and SERVER_CPUS, or neither" >&2
	exit 2
fi
# Prefixes that run a command on those CPUs (taskset execs it: $! stays the command's pid), or none.
ON_CLIENT=() ON_SERVER=()
[ -n "$CLIENT_CPUS" ] && ON_CLIENT=(taskset -c "$CLIENT_CPUS") ON_SERVER=(taskset -c "$SERVER_CPUS")
HAPROXY_ON=${ON_SERVER[*]} # start_haproxy's

PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '[scale %s] %s\n' "$(date +%T)" "$*" >&2; }

mkdir -p "$OUT/logs" "$OUT/runs"
rm -f "$OUT"/runs/*.json "$OUT"/runs/*.cost
(cd "$ROOT" && go build -o "$SG" ./cmd/storeguard) || { echo "go build failed" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\n' \
	>"$OUT/nsswitch-files.conf"
printf 'caps:\n  store-dial-rate: 0\n' >"$OUT/nopace.yaml"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$OUT/hosts" # Debian's, a pod's

wait_line() { # file pattern seconds
	local i
	for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
	return 1
}

# start_store NAME PORT: a real torch store; prints its pid
start_store() {
	local py backend="libuv" ns=""
	case "$1" in
	torch2.4.1-libuv) py=$TORCH/2.4.1/bin/python ;;
	torch2.15-libuv) py=$TORCH/2.15.0/bin/python; ns=files ;;
	torch2.15-libuv-stalled) py=$TORCH/2.15.0/bin/python; ns=hosts ;;
	torch1.13-legacy) py=/usr/bin/python3; backend=default ;;
	esac
	if [ -n "$ns" ]; then
		local bind="mount --bind '$OUT/nsswitch-files.conf' /etc/nsswitch.conf"
		[ "$ns" = hosts ] && bind="mount --bind '$OUT/hosts' /etc/hosts"
		"${ON_SERVER[@]}" unshare -m sh -c "$bind && exec '$py' '$ROOT/bench/torchstore.py' $2 $backend" \
			>"$OUT/logs/store-$1.log" 2>&1 &
	else
		"${ON_SERVER[@]}" "$py" "$ROOT/bench/torchstore.py" "$2" "$backend" >"$OUT/logs/store-$1.log" 2>&1 &
	fi
	echo $!
}

# start_guard TAG LISTEN UPSTREAM METRICS [ARGS...]: storeguard serve; prints its pid
start_guard() {
	local tag=$1 listen=$2 up=$3 metrics=$4; shift 4
	"${ON_SERVER[@]}" "$SG" serve --listen "127.0.0.1:$listen" --upstream "127.0.0.1:$up" --metrics-listen "127.0.0.1:$metrics" \
		--audit-log "$OUT/logs/audit-$tag.jsonl" "$@" >"$OUT/logs/guard-$tag.log" 2>&1 &
	echo $!
}

source "$ROOT/bench/haproxy.sh" # start_haproxy
HAPROXY_MAX=$((($(ulimit -n) - 200) / 2))

# rendezvous FILE PORT N GEN
rendezvous() {
	"${ON_CLIENT[@]}" "$SG" bench --addr "127.0.0.1:$2" --op rendezvous --conns "$3" --per-host "$PER_HOST" --generation "$4" \
		--timeout 180s --json >"$1" 2>>"$OUT/logs/bench.log" || true
}

overflows() { # the kernel's count of connections dropped by a full accept queue, since boot (0: no nstat)
	{ nstat -az TcpExtListenOverflows 2>/dev/null || true; } | awk '/ListenOverflows/ {n = $2} END {print n + 0}'
}
cputicks() { # pid: its user and system CPU time, in clock ticks (0 when none)
	awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

metric() { # port name-prefix: the sum of the series
	curl -s "127.0.0.1:$1/metrics" | awk -v p="$2" 'index($0, p) == 1 {s += $2} END {print s + 0}'
}

port=$BASE_PORT
for store in torch2.4.1-libuv torch2.15-libuv torch1.13-legacy; do
	case $store in torch1.13*) gen=1.13 ;; torch2.4*) gen=2.4 ;; *) gen=2.15 ;; esac
	sport=$((port + 1)) gport=$((port + 2)) nport=$((port + 3)) hport=$((port + 4)) m1=$((port + 5)) m2=$((port + 6))
	port=$((port + 10))
	spid=$(start_store "$store" "$sport"); PIDS+=("$spid")
	wait_line "$OUT/logs/store-$store.log" ready 60 || { log "$store did not start: $(tail -2 "$OUT/logs/store-$store.log")"; continue; }
	gpid=$(start_guard "$store-defaults" "$gport" "$sport" "$m1"); PIDS+=("$gpid")
	npid=$(start_guard "$store-nopace" "$nport" "$sport" "$m2" --config "$OUT/nopace.yaml"); PIDS+=("$npid")
	hpid=$(start_haproxy "$hport" "$sport" "$store" "$HAPROXY_MAX"); PIDS+=("$hpid")
	sleep 2
	kill -0 "$hpid" 2>/dev/null || log "HAProxy did not start: $(tail -1 "$OUT/logs/haproxy-$store.log")"
	for n in $SIZES; do
		for rep in $(seq "$REPS"); do
			for t in direct:$sport:0 storeguard:$gport:$gpid storeguard-nopace:$nport:$npid haproxy:$hport:$hpid; do
				IFS=: read -r name tport tpid <<<"$t"
				f="$OUT/runs/$store-$n-$name-$rep.json"
				o0=$(overflows) c0=$(cputicks "$tpid")
				rendezvous "$f" "$tport" "$n" "$gen"
				# what the start cost beside its time: SYNs the store's full accept queue dropped (each waits
				# out a retransmission, 1 s and more), and the proxy's CPU
				printf '{"overflows": %s, "proxy_cpu_s": %s}\n' "$(($(overflows) - o0))" \
					"$(awk -v a="$c0" -v b="$(cputicks "$tpid")" -v hz="$(getconf CLK_TCK)" 'BEGIN {print (b - a) / hz}')" >"$f.cost"
				log "$store $n $name #$rep: $(cat "$f.cost") $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["rendezvous"]["completed"], "in", round(r["rendezvous"]["total_s"], 3), "s")' "$f" 2>/dev/null || echo failed)"
			done
		done
	done
	printf '{"waits": %s, "refused": %s}\n' "$(metric "$m1" storeguard_store_connection_waits_total)" \
		"$(metric "$m1" storeguard_store_connections_refused_total)" >"$OUT/runs/$store-guard-metrics.json"
	kill "$gpid" "$npid" "$hpid" "$spid" 2>/dev/null
done

if [ "$STALLED" = 1 ]; then
	store=torch2.15-libuv-stalled sport=$((port + 1)) gport=$((port + 2)) m1=$((port + 5))
	spid=$(start_store "$store" "$sport"); PIDS+=("$spid")
	if wait_line "$OUT/logs/store-$store.log" ready 60; then
		gpid=$(start_guard "$store" "$gport" "$sport" "$m1"); PIDS+=("$gpid")
		sleep 2
		for src in 1 15; do
			for t in storeguard:$gport direct:$sport; do
				"${ON_CLIENT[@]}" python3 "$ROOT/bench/churn.py" "${t##*:}" 150 8 "$src" >"$OUT/runs/churn-$src-${t%%:*}.json" 2>>"$OUT/logs/bench.log"
				log "churn from $src sources, ${t%%:*}: $(cat "$OUT/runs/churn-$src-${t%%:*}.json")"
				sleep 20 # the resolver's stalls from one case must not fall on the next
			done
		done
		for t in storeguard:$gport direct:$sport; do
			rendezvous "$OUT/runs/stalled-2000-${t%%:*}.json" "${t##*:}" 2000 2.15
			log "stalled resolver, 2000 ${t%%:*}: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["rendezvous"])' "$OUT/runs/stalled-2000-${t%%:*}.json" 2>/dev/null)"
			sleep 20
		done
	fi
fi

if [ "$MTLS" = 1 ]; then
	PKI=$OUT/pki
	mkdir -p "$PKI"
	mkcert() { # name uri
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$1.key" 2>/dev/null &&
			openssl req -new -key "$PKI/$1.key" -subj "/CN=$1" -out "$PKI/$1.csr" &&
			printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
				"extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=URI:$2" >"$PKI/$1.ext" &&
			openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
				-days 1 -sha256 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
	}
	if openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null &&
		openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=scale CA" -days 1 -sha256 \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
			-out "$PKI/ca.crt" && mkcert master spiffe://sg.test/master && mkcert worker spiffe://sg.test/worker/w1; then
		store=torch2.15-libuv sport=$((port + 11)) pport=$((port + 12)) tport=$((port + 13)) cport=$((port + 14))
		spid=$(start_store "$store" "$sport"); PIDS+=("$spid")
		wait_line "$OUT/logs/store-$store.log" ready 60
		lift=(env STOREGUARD_CAPS_PER_SOURCE_CONNECTIONS=0 STOREGUARD_CAPS_PER_SOURCE_RATE=0
			STOREGUARD_CAPS_PER_SOURCE_STORE_CONNECTIONS=0 STOREGUARD_CAPS_PER_SOURCE_STORE_DIAL_RATE=0
			STOREGUARD_CAPS_PER_PREFIX_CONNECTIONS=0)
		"${lift[@]}" "${ON_SERVER[@]}" "$SG" serve --listen "127.0.0.1:$pport" --upstream "127.0.0.1:$sport" --metrics-listen '' \
			--audit-log "$OUT/logs/audit-mtls-plain.jsonl" >"$OUT/logs/guard-mtls-plain.log" 2>&1 &
		PIDS+=($!)
		"${lift[@]}" "${ON_SERVER[@]}" "$SG" serve --listen "127.0.0.1:$tport" --upstream "127.0.0.1:$sport" --metrics-listen '' \
			--audit-log "$OUT/logs/audit-mtls.jsonl" --tls-mode on --tls-cert "$PKI/master.crt" --tls-key "$PKI/master.key" \
			--tls-ca "$PKI/ca.crt" --tls-allow 'spiffe://sg.test/worker/*' --tls-plaintext-sources 10.255.255.255/32 \
			>"$OUT/logs/guard-mtls.log" 2>&1 &
		PIDS+=($!)
		"${ON_CLIENT[@]}" "$SG" connect --listen "127.0.0.1:$cport" --server "127.0.0.1:$tport" --tls-cert "$PKI/worker.crt" \
			--tls-key "$PKI/worker.key" --tls-ca "$PKI/ca.crt" --tls-allow spiffe://sg.test/master \
			>"$OUT/logs/connect-mtls.log" 2>&1 &
		PIDS+=($!)
		sleep 2
		for rep in $(seq "$REPS"); do
			for t in plaintext:$pport mtls:$cport; do
				f="$OUT/runs/mtls-$MTLS_SIZE-${t%%:*}-$rep.json"
				o0=$(overflows)
				rendezvous "$f" "${t##*:}" "$MTLS_SIZE" 2.15
				log "mutual TLS, $MTLS_SIZE ${t%%:*} #$rep: $(($(overflows) - o0)) overflows, $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["rendezvous"]["completed"], "in", round(r["rendezvous"]["total_s"], 3), "s")' "$f" 2>/dev/null || echo failed)"
			done
		done
	else
		log "could not make certificates: the mutual-TLS part was not run"
	fi
fi

CLIENT_CPUS=$CLIENT_CPUS SERVER_CPUS=$SERVER_CPUS python3 - "$OUT" "$DOC" "$REPS" "$PER_HOST" <<'EOF'
import glob, json, os, re, statistics, subprocess, sys
out, doc, reps, per_host = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runs = {}
for f in glob.glob(os.path.join(out, "runs", "*.json")):
    m = re.match(r"(torch[^-]+-[a-z]+)-(\d+)-(direct|storeguard|storeguard-nopace|haproxy)-(\d+)\.json$", os.path.basename(f))
    if not m:
        continue
    try:
        r = json.load(open(f))["rendezvous"]
    except Exception:
        r = None
    runs.setdefault((m[1], int(m[2])), {}).setdefault(m[3], []).append(r)
def cell(rs):
    ok = [r["total_s"] for r in rs if r and r["completed"] == r["clients"]]
    if len(ok) < len(rs):
        return "%d of %d runs incomplete" % (len(rs) - len(ok), len(rs)), None
    return "%.2f / %.2f / %.2f" % (min(ok), statistics.median(ok), max(ok)), statistics.median(ok)
cpus = (os.environ.get("CLIENT_CPUS", ""), os.environ.get("SERVER_CPUS", ""))
L = ["# A large job's start through storeguard" + (", the CPUs split as a cluster's" if cpus[0] else ""), "",
     "Measured by `bench/scale.sh` on this machine (%s, %d CPUs), %s." % (
         os.uname().release, os.cpu_count(), subprocess.run(["date", "-u", "+%Y-%m-%d"], capture_output=True, text=True).stdout.strip()),
     "N clients, %d from each loopback source address (127.10.x.y: %d ranks a host), each connecting, ADDing 1 to an init" % (per_host, per_host),
     "key and WAITing for a done key the last one sets; all connections open until every client is released. Each cell is",
     "min / median / max seconds of %d runs; the ratio is the median over direct's." % reps]
if cpus[0]:
    L += ["The CPUs are split as a cluster's are: the clients run on CPU %s, the store and the proxy on CPU %s (as the" % cpus,
          "store host's, shared by the two, which on a cluster's store host would have cores of their own). The ranks' CPU",
          "is not the store host's, and a proxy's own work (a second TCP connection per client) does not take the clients'.", ""]
else:
    L += ["Every party (the clients, the proxy and the store) shares the machine's %d cores: a proxy's own work (a second TCP" % os.cpu_count(),
          "connection per client, both directions) competes with the store's and the clients', which on a cluster run on",
          "other machines (`CLIENT_CPUS` and `SERVER_CPUS` split them: docs/benchmarks-scale-split.md).", ""]
L += [
     "| store | clients | direct | storeguard (defaults) | ratio | storeguard, pacing off | ratio | HAProxy | ratio |",
     "|---|---|---|---|---|---|---|---|---|"]
for (store, n) in sorted(runs, key=lambda k: (k[0], k[1])):
    t = runs[(store, n)]
    d, dm = cell(t.get("direct", []))
    row = ["%s | %d | %s" % (store, n, d)]
    for k in ("storeguard", "storeguard-nopace", "haproxy"):
        c, m = cell(t.get(k, []))
        row.append("%s | %s" % (c, "%.2fx" % (m / dm) if m and dm else "-"))
    L.append("| " + " | ".join(row) + " |")
L += ["", "What each start cost beside its time (medians): SYNs the store's full accept queue dropped (the kernel's",
      "TcpExtListenOverflows; each waits out a SYN retransmission of 1 s and more), and the proxy's CPU seconds.", "",
      "| store | clients | overflows: direct | storeguard | pacing off | HAProxy | proxy CPU s: storeguard | pacing off | HAProxy |",
      "|---|---|---|---|---|---|---|---|---|"]
def costs(store, n, target, key):
    vals = []
    for f in glob.glob(os.path.join(out, "runs", "%s-%d-%s-[0-9]*.json.cost" % (store, n, target))):
        try:
            vals.append(json.load(open(f))[key])
        except Exception:
            pass
    return ("%g" % statistics.median(vals)) if vals else "-"
for (store, n) in sorted(runs, key=lambda k: (k[0], k[1])):
    L.append("| %s | %d | %s | %s |" % (store, n,
        " | ".join(costs(store, n, t, "overflows") for t in ("direct", "storeguard", "storeguard-nopace", "haproxy")),
        " | ".join(costs(store, n, t, "proxy_cpu_s") for t in ("storeguard", "storeguard-nopace", "haproxy"))))
L.append("")
for f in sorted(glob.glob(os.path.join(out, "runs", "*-guard-metrics.json"))):
    L.append("- %s, through the defaults: %s" % (os.path.basename(f)[:-len("-guard-metrics.json")], open(f).read().strip()))
churn = sorted(glob.glob(os.path.join(out, "runs", "churn-*.json")))
if churn:
    L += ["", "## A stalled resolver", "",
          "torch 2.15's store with this machine's resolver (it stalls 5 s past some lookups a second), and an /etc/hosts",
          "as Debian and Kubernetes write it (127.0.0.1 and ::1 named localhost). The guard dials it at [::1]",
          "(upstream-loopback auto), so the store's lookup of each connection's peer is answered by /etc/hosts; a rank that",
          "connects directly costs it a DNS lookup. A churn of 150",
          "one-message connections a second for 8 s (VALIDATE, PING, GETNUMKEYS, close), from 1 source or spread over 15;",
          "a new rank from its own address times its first op (handshake and GETNUMKEYS answered) at 2 s, 6 s and after:", "",
          "| churn from | target | at 2 s | at 6 s | after |", "|---|---|---|---|---|"]
    for f in churn:
        src, tgt = re.match(r"churn-(\d+)-(.+)\.json", os.path.basename(f)).groups()
        try:
            r = json.load(open(f))["first_op_s"]
        except Exception:
            r = {}
        fmt = lambda v: ("%.3f s" % v) if isinstance(v, (int, float)) else str(v)
        L.append("| %s | %s | %s | %s | %s |" % (src, tgt, fmt(r.get("at 2 s")), fmt(r.get("at 6 s")), fmt(r.get("after"))))
    L.append("")
    for t, say in (("storeguard", "through the defaults"), ("direct", "direct")):
        try:
            r = json.load(open(os.path.join(out, "runs", "stalled-2000-%s.json" % t)))["rendezvous"]
            L.append("- The 2,000-client start %s, with the stalled resolver: %d of %d released in %.1f s." % (
                say, r["completed"], r["clients"], r["total_s"]))
        except Exception:
            pass
mt = {}
for f in glob.glob(os.path.join(out, "runs", "mtls-*.json")):
    m = re.match(r"mtls-(\d+)-(plaintext|mtls)-\d+\.json$", os.path.basename(f))
    try:
        r = json.load(open(f))["rendezvous"]
    except Exception:
        r = None
    mt.setdefault(m[2], []).append(r)
if mt:
    p, pm = cell(mt.get("plaintext", []))
    t_, tm = cell(mt.get("mtls", []))
    L += ["", "## Mutual TLS", "",
          "The start of %s clients (2.15, answering resolver) through `storeguard connect`, which carries each rank's" % m[1],
          "connection to `serve --tls-mode on` over its own mutual TLS 1.3 handshake (resumption on), against plaintext",
          "through `serve`; min / median / max seconds of %d runs. One connect guard on loopback stands for 250 hosts'" % reps,
          "guards: serve's per-source caps, which would see 250 sources, are lifted in both.", "",
          "| plaintext through serve | mutual TLS through connect and serve | ratio |", "|---|---|---|",
          "| %s | %s | %s |" % (p, t_, "%.2fx" % (tm / pm) if tm and pm else "-"), "",
          "What bounds it: each rank's handshake (an ECDSA P-256 signature and verification at each end, the key",
          "exchange, a session ticket), on the same 2 cores as the clients, both guards and the store."]
L += ["", "Rerun: `bench/scale.sh` (SIZES, REPS, PER_HOST; STALLED=0 and MTLS=0 skip those parts; CLIENT_CPUS and",
      "SERVER_CPUS split the CPUs, DOC names the file)."]
open(doc, "w").write("\n".join(L) + "\n")
print("wrote", doc)
EOF
[ -n "$BENCH_DOC" ] && [ -s "$DOC" ] && python3 "$ROOT/bench/docblock.py" put "$BENCH_DOC" "$(basename "$DOC" .md)" "$DOC" &&
	echo "wrote its block in $BENCH_DOC"
