#!/usr/bin/env bash
# Counts the functions and files one client's happy path visits in storeguard: a torch client
# connects through `serve`, SETs a key and GETs it back. Two runs of a coverage build against the
# same real store, one with the client and one without; the functions covered only in the first
# are the client's path (startup, the store's learning and background ticks are in both).
# Usage: bench/happy-path.sh [REV]   (REV: build that commit instead of the working tree)
# Env: SERVE_ARGS (more serve flags, e.g. "--event-loops -1" for the goroutine transport),
#      PYTHON (a python with torch; default the newest cached torch venv, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=.
if [ -n "${1:-}" ]; then
  git archive "$1" | tar -x -C "$work" && mkdir -p "$work/src" && src="$work"
fi
( cd "$src" && go build -cover -coverpkg=./... -o "$work/storeguard" ./cmd/storeguard )
py=${PYTHON:-$(ls -d /var/cache/storeguard/torch/*/bin/python 2>/dev/null | sort -V | tail -1)}
py=${py:-python3}
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
store=$(port)
"$py" -c "
import time, datetime, torch.distributed as d
s = d.TCPStore('127.0.0.1', $store, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
time.sleep(60)" &
store_pid=$!
trap 'kill $store_pid 2>/dev/null; rm -rf "$work"' EXIT
sleep 3
one_run() { # $1: coverage dir, $2: 1 to run the client
  local listen; listen=$(port)
  mkdir -p "$1"
  GOCOVERDIR="$1" "$work/storeguard" serve --listen "127.0.0.1:$listen" --upstream "127.0.0.1:$store" \
    --metrics-listen "" ${SERVE_ARGS:-} >"$1.log" 2>&1 &
  local pid=$!
  sleep 2
  if [ "$2" = 1 ]; then
    "$py" -c "
import datetime, torch.distributed as d
c = d.TCPStore('127.0.0.1', $listen, is_master=False, timeout=datetime.timedelta(seconds=20))
c.set('happy', b'path'); assert c.get('happy') == b'path'"
  fi
  sleep 1
  kill -TERM "$pid"; wait "$pid" || true
}
one_run "$work/with" 1
one_run "$work/without" 0
go tool covdata func -i "$work/with" | awk '$NF != "0.0%" {print $1" "$2}' | sort -u >"$work/f.with"
go tool covdata func -i "$work/without" | awk '$NF != "0.0%" {print $1" "$2}' | sort -u >"$work/f.without"
comm -23 "$work/f.with" "$work/f.without" >"$work/path"
sed 's/:[0-9]*:* .*//; s/:$//' "$work/path" | sed 's/:.*//' >"$work/files"
echo "functions on the client's path: $(wc -l <"$work/path")"
echo "files: $(sort -u "$work/files" | wc -l) ($(grep -c '/proxy/' <(sort -u "$work/files")) in proxy/)"
sort -u "$work/files" | sed 's|.*/storeguard/storeguard/||' | awk -F/ '{n[$1]++} END {for (p in n) printf "  %s %d\n", p, n[p]}' | sort
if [ -n "${VERBOSE:-}" ]; then sed 's|.*/storeguard/storeguard/||' "$work/path"; fi
