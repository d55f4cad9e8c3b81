#!/usr/bin/env bash
# Installs, only when missing, the Python source of a real vLLM release (no compiled ops: vLLM's wheels are
# CUDA builds) with the few packages its vllm.distributed.utils imports, for interop/vllm_spg.py: vLLM's own
# StatelessProcessGroup (broadcast_obj, send_obj/recv_obj, all_gather_obj, barrier) and its PyNccl unique id
# class, run on CPU with a pinned torch through the guard. Prints the directory to put on PYTHONPATH.
#
# Env: STOREGUARD_VLLM_CACHE (default /var/cache/storeguard/vllm), VLLM_VERSION (default 0.33.0).
set -euo pipefail
VERSION=${VLLM_VERSION:-0.33.0}
DIR=${STOREGUARD_VLLM_CACHE:-/var/cache/storeguard/vllm}/$VERSION
if [ -f "$DIR/.storeguard-ok" ]; then echo "$DIR"; exit 0; fi
log() { echo "vllm-src: $*" >&2; }
rm -rf "$DIR" && mkdir -p "$DIR/src" "$DIR/deps"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading vllm==$VERSION (the wheel, no dependencies; its Python files are kept)"
python3 -m pip download -q --no-deps -d "$tmp" "vllm==$VERSION" >&2
python3 - "$tmp" "$DIR/src" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/vllm-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
PY
log "the packages vllm.distributed.utils imports beside torch"
python3 -m pip install -q --target "$DIR/deps" packaging psutil pyzmq urllib3 regex >&2
touch "$DIR/.storeguard-ok"
echo "$DIR"
