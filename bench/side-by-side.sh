#!/usr/bin/env bash
# Side-by-side benchmark: real torch TCPStores measured directly, through storeguard and through
# HAProxy (mode tcp), with the same `storeguard bench` workloads; then idle memory per connection.
# Writes docs/benchmarks.md (and raw JSON under $OUT). Bounded to ~20 minutes; kills everything
# it started on exit.
#
#   bench/side-by-side.sh            # from the repository root
#
# The closed-loop workloads also run through a second storeguard with event-loops -1 (every
# connection on goroutines), to show what the event loops change. Every run also reports the
# machine's busy time and the store's and the proxy's CPU over its measured interval
# (`storeguard bench --watch-pid`): CPU per operation and per storm client in the doc.
#
# Knobs (environment): DURATION (per closed-loop run, default 2s), REPS (3), STORM (4096, every
# target, REPS times), STORM_PROXY (9000, every target, once), STORM_BIG (16384, direct once;
# through each proxy once on the libuv store with a short timeout, to show what happens; 0
# skips), IDLE_CONNS (20000, capped by the fd limit), PERF (1: perf profile of both proxies
# under get x16), BUDGET_S (1080: later steps are skipped past this), OUT (/tmp/sg-bench), DOC
# (docs/benchmarks.md).
#
# File descriptors: a proxy holds two per proxied connection. The script raises RLIMIT_NOFILE to
# the hard limit; if that cannot be raised (this machine: 20000 and root may not raise it), the
# storms through a proxy and the idle test are capped at (hard limit - 300) / 2 connections.
#
# All parties (bench client, proxy, store) share the machine's cores: nothing is pinned, so
# every number includes the client's and the store's CPU competing with the proxy's. That is
# the same for the three targets, which is what the ratios compare.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-2s}
WARMUP=${WARMUP:-300ms}
REPS=${REPS:-3}
STORM=${STORM:-4096}
STORM_PROXY=${STORM_PROXY:-9000}
STORM_BIG=${STORM_BIG:-16384}
IDLE_CONNS=${IDLE_CONNS:-20000}
PERF=${PERF:-1}
BUDGET_S=${BUDGET_S:-1080}
OUT=${OUT:-/tmp/sg-bench}
DOC=${DOC:-$ROOT/docs/benchmarks.md}
SG=$OUT/storeguard
TORCH=/var/cache/storeguard/torch
PY_DEBIAN=/usr/bin/python3
PY_2X=${PY_2X:-$TORCH/2.6.0/bin/python}
BASE_PORT=${BASE_PORT:-29810}

# store name | python | backend argument | storeguard --generation | storeguard --backend
STORES=(
	"torch1.13-legacy|$PY_DEBIAN|default|1.13|legacy"
	"torch2.6-legacy|$PY_2X|legacy|2.6|legacy"
	"torch2.6-libuv|$PY_2X|libuv|2.6|libuv"
)
WORKLOADS=(get:1 get:16 get:64 mix:1 mix:16 mix:64)

PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null
	done
	sleep 0.5
	for pid in "${PIDS[@]}"; do
		kill -9 "$pid" 2>/dev/null
	done
	wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%4ds] %s\n' "$SECONDS" "$*" >&2; }
over_budget() { [ "$SECONDS" -ge "$BUDGET_S" ]; }

stop_pid() { # stop one process we started
	kill "$1" 2>/dev/null
	for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
	kill -9 "$1" 2>/dev/null
}

wait_port() { # wait until 127.0.0.1:$1 listens
	for _ in $(seq 300); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.1
	done
	log "port $1 never opened"
	return 1
}

rss_kib() { # VmRSS of a pid, KiB
	awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

rm -rf "$OUT"
mkdir -p "$OUT/runs" "$OUT/logs"
log "building storeguard"
(cd "$ROOT" && go build -o "$SG" ./cmd/storeguard) || exit 1
ulimit -Hn 1048576 2>/dev/null
ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
PROXY_MAX=$(((NOFILE - 300) / 2))
if [ "$STORM_PROXY" -gt "$PROXY_MAX" ]; then STORM_PROXY=$PROXY_MAX; fi
if [ "$IDLE_CONNS" -gt "$PROXY_MAX" ]; then
	log "idle test capped at $PROXY_MAX connections (RLIMIT_NOFILE $NOFILE, 2 fds per proxied connection)"
	IDLE_CONNS=$PROXY_MAX
fi

# torch 2.x stores resolve every client's address with getnameinfo() on their accept path (the
# libuv backend in its single event-loop thread). This machine's resolver is unreachable (loopback
# only) and a burst of reverse lookups stalls the store for seconds per connection. Give the
# stores a private resolv.conf pointing at nothing, so lookups fail at once, as they would
# answer at once on a host with working DNS.
echo "nameserver 127.0.0.1" >"$OUT/resolv.conf"
start_store() { # port python backend -> pid
	local port=$1 py=$2 backend=$3
	if unshare -m true 2>/dev/null; then
		unshare -m sh -c \
			"mount --bind '$OUT/resolv.conf' /etc/resolv.conf && exec '$py' '$ROOT/bench/torchstore.py' $port $backend" \
			>"$OUT/logs/store-$port.out" 2>"$OUT/logs/store-$port.err" &
	else
		RES_OPTIONS="attempts:1 timeout:1" "$py" "$ROOT/bench/torchstore.py" $port $backend \
			>"$OUT/logs/store-$port.out" 2>"$OUT/logs/store-$port.err" &
	fi
	echo $!
}

start_storeguard() { # listen upstream generation backend tag [event-loops] -> pid
	STOREGUARD_EVENT_LOOPS=${6:-0} STOREGUARD_CAPS_MAX_CONNECTIONS=1000000 STOREGUARD_CAPS_PER_SOURCE_CONNECTIONS=0 \
		STOREGUARD_CAPS_PER_SOURCE_RATE=0 STOREGUARD_CAPS_PER_SOURCE_STORE_CONNECTIONS=0 \
		STOREGUARD_CAPS_STORE_DIAL_RATE=0 STOREGUARD_CAPS_PER_SOURCE_STORE_DIAL_RATE=0 \
		"$SG" serve --listen "127.0.0.1:$1" --upstream "127.0.0.1:$2" --metrics-listen '' \
		--generation "$3" --backend "$4" --audit-log "$OUT/logs/audit-$5.jsonl" --log-level warn \
		>"$OUT/logs/storeguard-$5.log" 2>&1 &
	echo $!
}

source "$ROOT/bench/haproxy.sh" # start_haproxy

bench() { # file args...: one bench run, JSON into file
	local f=$1
	shift
	timeout 300 "$SG" bench --json "$@" >"$f" 2>>"$OUT/logs/bench.err" || true
}

# ---------------------------------------------------------------- stores x targets x workloads
i=0
for spec in "${STORES[@]}"; do
	IFS='|' read -r name py backend gen sgbackend <<<"$spec"
	sport=$((BASE_PORT + 4 * i)); gport=$((sport + 1)); hport=$((sport + 2)); oport=$((sport + 3))
	i=$((i + 1))
	if over_budget; then log "budget spent: skipping $name"; continue; fi
	if [ ! -x "$py" ]; then log "no $py: skipping $name"; continue; fi
	log "$name: starting store on $sport, storeguard on $gport, haproxy on $hport"
	spid=$(start_store $sport "$py" "$backend"); PIDS+=("$spid")
	wait_port $sport || { stop_pid "$spid"; continue; }
	gpid=$(start_storeguard $gport $sport "$gen" "$sgbackend" "$name"); PIDS+=("$gpid")
	hpid=$(start_haproxy $hport $sport "$name" "$PROXY_MAX"); PIDS+=("$hpid")
	# The same storeguard with event-loops -1: every connection on two goroutines, as before the loops.
	opid=$(start_storeguard $oport $sport "$gen" "$sgbackend" "$name-goroutines" -1); PIDS+=("$opid")
	wait_port $gport; wait_port $hport; wait_port $oport
	head -1 "$OUT/logs/store-$sport.out" | sed "s/^/$name: /" >>"$OUT/stores.txt"
	declare -A ADDR=([direct]=$sport [storeguard]=$gport [haproxy]=$hport [storeguard-goroutines]=$oport)
	# Each run reports the machine's CPU and the store's and the proxy's over its measured interval.
	declare -A WATCH=([direct]="--watch-pid $spid" [storeguard]="--watch-pid $spid --watch-pid $gpid"
		[haproxy]="--watch-pid $spid --watch-pid $hpid" [storeguard-goroutines]="--watch-pid $spid --watch-pid $opid")
	for rep in $(seq "$REPS"); do
		for wl in "${WORKLOADS[@]}"; do
			op=${wl%:*}; conns=${wl#*:}
			for target in direct storeguard haproxy storeguard-goroutines; do
				d="$OUT/runs/$name/$target"; mkdir -p "$d"
				bench "$d/$op-$conns-$rep.json" --addr "127.0.0.1:${ADDR[$target]}" --generation "$gen" \
					--op "$op" --conns "$conns" --duration "$DURATION" --warmup "$WARMUP" ${WATCH[$target]}
			done
		done
		for target in direct storeguard haproxy; do
			d="$OUT/runs/$name/$target"
			bench "$d/rendezvous-$STORM-$rep.json" --addr "127.0.0.1:${ADDR[$target]}" --generation "$gen" \
				--op rendezvous --conns "$STORM" --timeout 90s --dial-timeout 60s ${WATCH[$target]}
		done
		log "$name: rep $rep done"
	done
	if [ "$STORM_PROXY" -gt 0 ] && ! over_budget; then
		for target in direct storeguard haproxy; do
			bench "$OUT/runs/$name/$target/rendezvous-$STORM_PROXY-1.json" --addr "127.0.0.1:${ADDR[$target]}" \
				--generation "$gen" --op rendezvous --conns "$STORM_PROXY" --timeout 120s --dial-timeout 100s
		done
		log "$name: $STORM_PROXY storm done"
	fi
	if [ "$STORM_BIG" -gt 0 ] && ! over_budget; then
		targets=(direct)
		# Through a proxy, STORM_BIG needs 2 x STORM_BIG fds in one process: try it once, on the
		# libuv store, with a short timeout, when that exceeds the limit (to show what happens).
		if [ "$backend" = libuv ] || [ "$STORM_BIG" -le "$PROXY_MAX" ]; then targets+=(storeguard haproxy); fi
		for target in "${targets[@]}"; do
			t=120s; [ "$STORM_BIG" -gt "$PROXY_MAX" ] && [ "$target" != direct ] && t=20s
			bench "$OUT/runs/$name/$target/rendezvous-$STORM_BIG-1.json" --addr "127.0.0.1:${ADDR[$target]}" \
				--generation "$gen" --op rendezvous --conns "$STORM_BIG" --timeout $t --dial-timeout 100s
		done
		log "$name: $STORM_BIG storm done"
	fi
	if [ "$PERF" = 1 ] && [ "$backend" = libuv ] && command -v perf >/dev/null && ! over_budget; then
		for target in storeguard haproxy; do
			pid=$gpid; [ $target = haproxy ] && pid=$hpid
			perf record -F 1999 -g -p "$pid" -o "$OUT/perf-$target.data" -- sleep 5 >/dev/null 2>&1 &
			ppid=$!
			sleep 0.3
			bench "$OUT/perf-$target-bench.json" --addr "127.0.0.1:${ADDR[$target]}" --generation "$gen" \
				--op get --conns 16 --duration 4s
			wait $ppid
			perf report -i "$OUT/perf-$target.data" --no-children --sort symbol --stdio 2>/dev/null |
				grep -E '^ +[0-9]' | sed 's/ *- *- *$//' | head -40 >"$OUT/perf-$target-self.txt"
			perf report -i "$OUT/perf-$target.data" --no-children --sort dso --stdio 2>/dev/null |
				grep -E '^ +[0-9]' | sed 's/ *- *- *$//' | head -8 >"$OUT/perf-$target-dso.txt"
			perf report -i "$OUT/perf-$target.data" --children --sort symbol --stdio 2>/dev/null |
				grep -E '^ +[0-9]' | sed 's/ *- *- *$//' | head -60 >"$OUT/perf-$target-children.txt"
		done
		log "$name: perf profiles written"
	fi
	stop_pid "$gpid"; stop_pid "$hpid"; stop_pid "$opid"; stop_pid "$spid"
	unset ADDR
done

# ---------------------------------------------------------------- idle memory
# The torch stores are not asked to hold $IDLE_CONNS connections: the sink is storeguard's own
# fake store (Go), the same for both proxies.
idle() { # target listen-port pid
	local target=$1 port=$2 pid=$3
	local before after
	sleep 1
	before=$(rss_kib "$pid")
	"$SG" bench --json --addr "127.0.0.1:$port" --op idle --conns "$IDLE_CONNS" --duration 8s \
		--generation G3 --dial-timeout 60s >"$OUT/idle-$target.json" 2>"$OUT/logs/idle-$target.err" &
	local bpid=$!
	PIDS+=("$bpid")
	for _ in $(seq 900); do grep -q '^ready' "$OUT/logs/idle-$target.err" && break; sleep 0.1; done
	sleep 2
	after=$(rss_kib "$pid")
	local fds
	fds=$(ls "/proc/$pid/fd" | wc -l)
	wait "$bpid"
	echo "$target $IDLE_CONNS $before $after $fds" >>"$OUT/idle.txt"
	log "idle $target: RSS $before -> $after KiB, $fds fds"
}
if ! over_budget; then
	"$SG" bench fake-store --listen 127.0.0.1:$((BASE_PORT + 40)) --generation G3 >"$OUT/logs/sink.log" 2>&1 &
	sink=$!; PIDS+=("$sink")
	wait_port $((BASE_PORT + 40))
	gpid=$(start_storeguard $((BASE_PORT + 41)) $((BASE_PORT + 40)) G3 libuv idle); PIDS+=("$gpid")
	wait_port $((BASE_PORT + 41)) && idle storeguard $((BASE_PORT + 41)) "$gpid"
	stop_pid "$gpid"
	hpid=$(start_haproxy $((BASE_PORT + 42)) $((BASE_PORT + 40)) idle "$PROXY_MAX"); PIDS+=("$hpid")
	wait_port $((BASE_PORT + 42)) && idle haproxy $((BASE_PORT + 42)) "$hpid"
	stop_pid "$hpid"; stop_pid "$sink"
fi

# ---------------------------------------------------------------- machine and report
{
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
	echo "cores: $(nproc)"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "kernel: $(uname -r)"
	echo "go: $(cd "$ROOT" && go version | awk '{print $3}')"
	echo "haproxy: $(haproxy -v | head -1 | awk '{print $3}')"
	echo "storeguard: $("$SG" --version 2>/dev/null | head -1)"
	echo "somaxconn: $(cat /proc/sys/net/core/somaxconn)"
	echo "ephemeral ports: $(tr '\t' '-' </proc/sys/net/ipv4/ip_local_port_range)"
	echo "RLIMIT_NOFILE: $NOFILE (hard; not raisable here), so at most $PROXY_MAX connections through one proxy process"
} >"$OUT/machine.txt"
log "writing $DOC"
kept=$(python3 "$ROOT/bench/docblock.py" keep "$DOC") # other scripts' blocks (bench/scale.sh's)
python3 "$ROOT/bench/summarize.py" "$OUT" >"$DOC" && { [ -z "$kept" ] || printf '%s\n' "$kept" >>"$DOC"; } &&
	cat "$DOC"
log "done in ${SECONDS}s"
