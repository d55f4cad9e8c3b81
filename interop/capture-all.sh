#!/usr/bin/env bash
# Regenerates protocol/testdata/golden/<version>-<backend>/ and
# replay/testdata/pcap/<version>-<backend>.pcapng from every environment that
# scripts/torch-envs.sh provides (installing missing ones first).
# Usage: interop/capture-all.sh [VERSION...]   (default: all; needs root or CAP_NET_RAW for dumpcap)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GOLDEN="$ROOT/protocol/testdata/golden"
PCAP="$ROOT/replay/testdata/pcap"
pcap_args=(--pcap-dir "$PCAP")
if ! command -v dumpcap >/dev/null; then
  echo "capture-all: dumpcap missing (apt-get install tshark); no pcaps" >&2
  pcap_args=()
fi
rc=0
while read -r version python; do
  [ -n "$version" ] || continue
  echo "capture-all: $version ($python)" >&2
  if ! timeout 300 "$python" -W ignore "$ROOT/interop/capture.py" --label "$version" --out "$GOLDEN" "${pcap_args[@]}"; then
    echo "capture-all: $version FAILED" >&2; rc=1
  fi
done < <("$ROOT/scripts/torch-envs.sh" "$@")
exit $rc
