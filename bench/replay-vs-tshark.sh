#!/usr/bin/env bash
# Times `storeguard replay` against `tshark -r FILE -q` on a generated capture of torch-like
# TCPStore traffic (many G3 client connections, the store's replies, 5% of SETs with 4-256 KiB
# values) and prints a table: wall time, MB/s, packets/s and peak RSS for both, and the ratio.
#
# Usage: bench/replay-vs-tshark.sh            (SIZE_MB=512 and RUNS=3 by default)
#        SIZE_MB=1024 RUNS=5 STOREGUARD=/path/to/storeguard bench/replay-vs-tshark.sh
# Each tool runs RUNS times, interleaved; the table shows each tool's fastest run (a shared
# machine only ever slows a run down) and the runs' wall times are listed under it.
# The capture lives in a temporary directory under /tmp and is deleted on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE_MB=${SIZE_MB:-512}
RUNS=${RUNS:-3}
WORK=$(mktemp -d /tmp/storeguard-replay-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CAP=$WORK/capture.pcap

for tool in tshark capinfos /usr/bin/time go; do
  command -v "$tool" >/dev/null || { echo "replay-vs-tshark: $tool is missing (apt-get install tshark time golang)" >&2; exit 2; }
done

cd "$ROOT"
SG=${STOREGUARD:-$WORK/storeguard}
if [[ -z ${STOREGUARD:-} ]]; then
  go build -o "$SG" ./cmd/storeguard
fi
"$SG" replay --help >/dev/null 2>&1 || { echo "replay-vs-tshark: $SG has no replay command" >&2; exit 2; }

go run ./replay/internal/gencap/cmd/gencap -o "$CAP" -size "$SIZE_MB"
bytes=$(stat -c %s "$CAP")
packets=$(capinfos -M -c -T "$CAP" | awk -F'\t' 'NR==2 {print $2}')
cat "$CAP" >/dev/null # both tools read from the page cache

# measure NAME CMD...: runs CMD under /usr/bin/time -v; sets wall (s) and rss (KiB).
measure() {
  local name=$1; shift
  local log=$WORK/$name.time
  local rc=0 start end
  start=$(date +%s.%N)
  /usr/bin/time -v "$@" >"$WORK/$name.out" 2>"$log" || rc=$?
  end=$(date +%s.%N)
  # storeguard replay exits 1 when it finds violations; there should be none here.
  if [[ $rc -ne 0 ]]; then
    echo "replay-vs-tshark: $name exited $rc" >&2
    tail -5 "$log" >&2
    exit 2
  fi
  # time(1) rounds its wall clock to 10 ms, a tenth of a run here: take it to the millisecond.
  wall=$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.3f", e - s}')
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
}

# The fastest run of each tool is kept (wall s, RSS KiB), every run's wall time listed.
sg_wall= ts_wall= sg_runs= ts_runs=
for ((i = 0; i < RUNS; i++)); do
  measure storeguard "$SG" replay "$CAP"
  sg_runs+=" $wall"
  if [[ -z $sg_wall ]] || awk -v a="$wall" -v b="$sg_wall" 'BEGIN {exit !(a < b)}'; then sg_wall=$wall sg_rss=$rss; fi
  measure tshark tshark -r "$CAP" -q
  ts_runs+=" $wall"
  if [[ -z $ts_wall ]] || awk -v a="$wall" -v b="$ts_wall" 'BEGIN {exit !(a < b)}'; then ts_wall=$wall ts_rss=$rss; fi
done

tail -1 "$WORK/storeguard.out" | sed 's/^/storeguard: /'
awk -v b="$bytes" -v p="$packets" -v sw="$sg_wall" -v sr="$sg_rss" -v tw="$ts_wall" -v tr="$ts_rss" 'BEGIN {
  printf "capture: %.0f MB, %d packets (pcap, Ethernet)\n\n", b/1e6, p
  printf "%-20s %9s %10s %12s %12s\n", "tool", "wall s", "MB/s", "packets/s", "peak RSS MB"
  printf "%-20s %9.3f %10.0f %12.0f %12.0f\n", "storeguard replay", sw, b/1e6/sw, p/sw, sr/1024
  printf "%-20s %9.3f %10.0f %12.0f %12.0f\n", "tshark -r -q", tw, b/1e6/tw, p/tw, tr/1024
  printf "\nstoreguard replay is %.1fx faster than tshark, with %.1fx less peak memory\n", tw/sw, tr/sr
}'
echo "runs, wall s: storeguard$sg_runs; tshark$ts_runs"
