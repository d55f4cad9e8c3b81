#!/usr/bin/env bash
# Two storeguard builds side by side, in one interleaved run: the working tree's and a baseline
# commit's, each in front of the same real torch store, with `storeguard bench` workloads and the
# direct connection as the reference. For a refactor that must not cost speed: it prints, per
# workload, the medians and the ratio new / baseline with its per-repetition range.
#
#   bench/compare-builds.sh [BASE_REV]      # default: origin/main if it exists, else HEAD~1
#
# Knobs (environment): REPS (5), DURATION (2s per closed-loop run), STORM (4096 clients; 0 skips),
# STORES (space-separated: torch2.6-libuv torch1.13-legacy), OUT (/tmp/sg-compare), BASE_PORT (29870; three per store),
# NEW_ARGS (extra serve flags for the new build only: NEW_ARGS=--keeper with BASE_REV HEAD measures what the keeper costs).
# Kills only what it started. Needs the torch environments scripts/install-deps.sh installs.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE_REV=${1:-$(git -C "$ROOT" rev-parse --verify -q origin/main || git -C "$ROOT" rev-parse HEAD~1)}
REPS=${REPS:-5}
NEW_ARGS=${NEW_ARGS:-}
DURATION=${DURATION:-2s}
STORM=${STORM:-4096}
STORES=${STORES:-"torch2.6-libuv torch1.13-legacy"}
OUT=${OUT:-/tmp/sg-compare}
TORCH=/var/cache/storeguard/torch
WORKLOADS=(get:1 mix:1 get:16 mix:64)
BASE_PORT=${BASE_PORT:-29870}

PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	sleep 0.5
	for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
	wait 2>/dev/null
	[ -d "$OUT/base-src" ] && git -C "$ROOT" worktree remove --force "$OUT/base-src" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '[%4ds] %s\n' "$SECONDS" "$*" >&2; }
wait_port() {
	for _ in $(seq 300); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.1; done
	log "port $1 never opened"; return 1
}

rm -rf "$OUT"; mkdir -p "$OUT/runs" "$OUT/logs"
log "building the working tree and $BASE_REV"
(cd "$ROOT" && go build -o "$OUT/sg-new" ./cmd/storeguard) || exit 1
git -C "$ROOT" worktree add -q --detach "$OUT/base-src" "$BASE_REV" || exit 1
(cd "$OUT/base-src" && go build -o "$OUT/sg-base" ./cmd/storeguard) || exit 1
ulimit -n "$(ulimit -Hn)"

# The torch 2.x stores call getnameinfo() per accepted connection; with no resolver on this
# loopback-only host that stalls them seconds a lookup (see side-by-side.sh): a private resolv.conf.
echo "nameserver 127.0.0.1" >"$OUT/resolv.conf"
start_store() { # port python backend
	unshare -m sh -c "mount --bind '$OUT/resolv.conf' /etc/resolv.conf && exec '$2' '$ROOT/bench/torchstore.py' $1 $3" \
		>"$OUT/logs/store-$1.out" 2>"$OUT/logs/store-$1.err" &
	PIDS+=($!)
}
start_sg() { # binary listen upstream generation backend tag [serve flags...]
	local extra=("${@:7}")
	STOREGUARD_CAPS_MAX_CONNECTIONS=1000000 STOREGUARD_CAPS_PER_SOURCE_CONNECTIONS=0 STOREGUARD_CAPS_PER_SOURCE_RATE=0 \
		STOREGUARD_CAPS_PER_SOURCE_STORE_CONNECTIONS=0 STOREGUARD_CAPS_STORE_DIAL_RATE=0 \
		STOREGUARD_CAPS_PER_SOURCE_STORE_DIAL_RATE=0 \
		"$1" serve --listen "127.0.0.1:$2" --upstream "127.0.0.1:$3" --metrics-listen '' --generation "$4" \
		--backend "$5" --audit-log "$OUT/logs/audit-$6.jsonl" --log-level warn "${extra[@]}" >"$OUT/logs/sg-$6.log" 2>&1 &
	PIDS+=($!)
}

i=0
for name in $STORES; do
	case $name in
	torch2.6-libuv) py=$TORCH/2.6.0/bin/python backend=libuv gen=2.6 ;;
	torch2.6-legacy) py=$TORCH/2.6.0/bin/python backend=legacy gen=2.6 ;;
	torch1.13-legacy) py=/usr/bin/python3 backend=default gen=1.13 ;;
	*) log "unknown store $name"; continue ;;
	esac
	sport=$((BASE_PORT + 3 * i)); bport=$((sport + 1)); nport=$((sport + 2)); i=$((i + 1))
	start_store $sport "$py" $backend
	wait_port $sport || continue
	sgb=${backend/default/legacy}
	start_sg "$OUT/sg-base" $bport $sport $gen $sgb "$name-base"
	start_sg "$OUT/sg-new" $nport $sport $gen $sgb "$name-new" ${NEW_ARGS:-}
	wait_port $bport && wait_port $nport || continue
	declare -A ADDR=([direct]=$sport [base]=$bport [new]=$nport)
	for rep in $(seq "$REPS"); do
		for wl in "${WORKLOADS[@]}" ${STORM:+rendezvous:$STORM}; do
			[ "$wl" = rendezvous:0 ] && continue
			op=${wl%:*} conns=${wl#*:}
			for target in direct base new; do
				args=(--duration "$DURATION" --warmup 300ms)
				[ "$op" = rendezvous ] && args=(--timeout 90s --dial-timeout 60s)
				mkdir -p "$OUT/runs/$name/$target"
				timeout 300 "$OUT/sg-new" bench --json --addr "127.0.0.1:${ADDR[$target]}" --generation $gen \
					--op "$op" --conns "$conns" "${args[@]}" >"$OUT/runs/$name/$target/$op-$conns-$rep.json" \
					2>>"$OUT/logs/bench.err"
			done
		done
		log "$name: rep $rep of $REPS"
	done
done

python3 - "$OUT/runs" "$BASE_REV" "$(git -C "$ROOT" rev-parse --short HEAD)" <<'EOF'
import json, os, statistics, sys
runs, base_rev, head = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"new = working tree at {head} (+ uncommitted changes), base = {base_rev[:12]}; medians over repetitions")
print()
print("| store | workload | metric | direct | base | new | new/base | new/base per rep | errors d/b/n |")
print("|---|---|---|---:|---:|---:|---:|---|---|")
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
for store in sorted(os.listdir(runs)):
    names = sorted({f.rsplit("-", 1)[0] for f in os.listdir(os.path.join(runs, store, "direct"))})
    for wl in names:
        res = {}
        for t in ("direct", "base", "new"):
            d = os.path.join(runs, store, t)
            res[t] = [load(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.rsplit("-", 1)[0] == wl]
        storm = wl.startswith("rendezvous")
        metrics = [("wall s", lambda r: r["rendezvous"]["total_s"])] if storm else [
            ("ops/s", lambda r: r["ops_per_sec"]), ("p50 µs", lambda r: r["latency_us"]["p50"])]
        for label, f in metrics:
            vals = {t: [f(r) for r in res[t] if r and (not storm or r.get("rendezvous"))] for t in res}
            if not all(vals.values()):
                continue
            med = {t: statistics.median(v) for t, v in vals.items()}
            per = [n / b for n, b in zip(vals["new"], vals["base"]) if b]
            errs = "/".join(str(sum(r["errors"] for r in res[t] if r)) for t in ("direct", "base", "new"))
            print(f"| {store} | `{wl.replace('-', ':')}` | {label} | {med['direct']:,.1f} | {med['base']:,.1f} | "
                  f"{med['new']:,.1f} | {med['new'] / med['base']:.2f} | {min(per):.2f}–{max(per):.2f} | {errs} |")
EOF
