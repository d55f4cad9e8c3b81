#!/usr/bin/env bash
# Installs, only when missing, the real-torch environments used by the interop
# suite and the golden captures, then prints one line per environment:
#   <version> <path-to-python>
# e.g. "2.6.0 /var/cache/storeguard/torch/2.6.0/bin/python" and, for Debian's
# python3-torch, "1.13.1 /usr/bin/python3". Progress goes to stderr.
#
# Usage: scripts/torch-envs.sh [VERSION...]     (default: every line of interop/torch-versions.txt)
# Env:   STOREGUARD_TORCH_CACHE  root of the venvs and the uv cache (default /var/cache/storeguard/torch)
#        STOREGUARD_NO_DEBIAN=1  skip Debian's python3-torch
#        STOREGUARD_PYTHON       interpreter for the venvs (default python3)
#        STOREGUARD_VERIFY=1     re-check every existing env by importing torch
#
# PyPI torch wheels pull the CUDA libraries (several GB) even for CPU use. uv
# hard-links installed files from its cache, so UV_CACHE_DIR lives under the
# same directory (same filesystem) as the venvs: each extra env costs little.
#
# Each venv gets its bytecode compiled once (uv installs none, and with PYTHONDONTWRITEBYTECODE, as on
# these machines, Python never writes it): `import torch` then takes 3.6 s instead of 7.2 (2.15.0, this
# 2-core machine), and the interop suite starts hundreds of torch processes.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${STOREGUARD_TORCH_CACHE:-/var/cache/storeguard/torch}
PY=${STOREGUARD_PYTHON:-python3}
VERSIONS_FILE="$ROOT/interop/torch-versions.txt"
export UV_CACHE_DIR="$CACHE/uv-cache"
export UV_LINK_MODE=hardlink
export UV_NO_PROGRESS=1
export UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-300}

log() { echo "torch-envs: $*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

mkdir -p "$CACHE" 2>/dev/null || { $SUDO mkdir -p "$CACHE" && $SUDO chown "$(id -u):$(id -g)" "$CACHE"; }
exec 9>"$CACHE/.lock"
flock 9  # one installer at a time per cache

VERIFY='import torch, torch.distributed as d; assert d.is_available(); d.TCPStore; print(torch.__version__)'

# --- Debian python3-torch (1.13.1) -------------------------------------------
debian_torch() {
  if /usr/bin/python3 -c "$VERIFY" >/dev/null 2>&1; then return 0; fi
  if ! command -v apt-get >/dev/null; then log "no apt-get: skipping Debian python3-torch"; return 1; fi
  log "installing Debian python3-torch"
  local apt=(env DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=900 -y -q)
  if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] \
     || ! apt-cache show python3-torch >/dev/null 2>&1; then
    "${apt[@]}" update >&2
  fi
  "${apt[@]}" install --no-install-recommends python3-torch >&2 \
    || { "${apt[@]}" update >&2 && "${apt[@]}" install --no-install-recommends python3-torch >&2; }
  /usr/bin/python3 -c "$VERIFY" >/dev/null
}

# --- uv ----------------------------------------------------------------------
UV=""
find_uv() {
  if command -v uv >/dev/null; then UV=$(command -v uv); return; fi
  if [ -x "$CACHE/.tools/bin/uv" ]; then UV="$CACHE/.tools/bin/uv"; return; fi
  log "installing uv into $CACHE/.tools"
  if ! "$PY" -m venv "$CACHE/.tools" >&2; then
    # Debian's python3 lacks ensurepip/venv until python3-venv is installed
    rm -rf "$CACHE/.tools"
    env DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=900 -y -q install python3-venv >&2
    "$PY" -m venv "$CACHE/.tools" >&2
  fi
  "$CACHE/.tools/bin/pip" install -q uv >&2
  UV="$CACHE/.tools/bin/uv"
}

# --- bytecode, once per venv --------------------------------------------------
# compile_once VERSION PYTHON: compiles the venv's site-packages unless done before. A failure costs
# only speed: the env still works, and the next run tries again.
compile_once() {
  local v=$1 py=$2 dir=$CACHE/$1 site t0=$SECONDS
  [ -f "$dir/.storeguard-pyc" ] && return 0
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 0
  log "compiling $v's bytecode"
  if ! "$py" -m compileall -q -j0 "$site" >"$dir/.compile.log" 2>&1; then
    # a file in a wheel that is not valid for this Python (test data, templates) fails alone:
    # every other file is compiled, so it costs nothing at import; say how many, and go on
    log "$v: $(grep -c '^\*\*\*' "$dir/.compile.log" || true) files could not be compiled ($dir/.compile.log)"
  fi
  touch "$dir/.storeguard-pyc"
  log "$v compiled in $((SECONDS - t0)) s"
}

# --- one venv per pinned version ---------------------------------------------
# env_for VERSION [EXTRA...]
env_for() {
  local v=$1; shift
  local dir="$CACHE/$v" py="$CACHE/$v/bin/python" want="torch==$v $*"
  # fast path: installed and verified before (STOREGUARD_VERIFY=1 re-imports torch to check)
  if [ -f "$dir/.storeguard-ok" ] && [ -x "$py" ] \
     && { [ "${STOREGUARD_VERIFY:-0}" != 1 ] || "$py" -c "$VERIFY" >/dev/null 2>&1; }; then
    if [ "$(cat "$dir/.storeguard-ok")" = "$want" ]; then compile_once "$v" "$py"; echo "$v $py"; return 0; fi
  else
    rm -rf "$dir"
  fi
  [ -n "$UV" ] || find_uv
  local t0=$SECONDS
  log "installing $want into $dir"
  [ -x "$py" ] || "$UV" venv -q --python "$PY" "$dir" >&2
  if ! "$UV" pip install -q --python "$py" "torch==$v" "$@" >&2; then
    log "FAILED to install torch==$v"; return 1
  fi
  local got
  if ! got=$("$py" -c "$VERIFY" 2>"$dir/.verify.err"); then
    log "FAILED to import torch $v:"; tail -5 "$dir/.verify.err" >&2; return 1
  fi
  case "$got" in "$v"|"$v"+*) ;; *) log "FAILED: $v reports version $got"; return 1;; esac
  echo "$want" > "$dir/.storeguard-ok"
  compile_once "$v" "$py"
  log "$v ready in $((SECONDS - t0)) s"
  echo "$v $py"
}

rc=0
if [ $# -gt 0 ]; then
  for v in "$@"; do
    if [ "$v" = 1.13.1 ]; then
      if debian_torch; then echo "1.13.1 /usr/bin/python3"; else rc=1; fi
      continue
    fi
    extra=$(awk -v v="$v" '$1 == v { sub(/#.*/, ""); $1 = ""; print }' "$VERSIONS_FILE" 2>/dev/null || true)
    # shellcheck disable=SC2086
    env_for "$v" $extra || rc=1
  done
else
  if [ "${STOREGUARD_NO_DEBIAN:-0}" != 1 ]; then
    if debian_torch; then echo "1.13.1 /usr/bin/python3"; else log "Debian python3-torch unavailable"; rc=1; fi
  fi
  while read -r line; do
    line=${line%%#*}
    # shellcheck disable=SC2086
    set -- $line
    [ $# -gt 0 ] || continue
    env_for "$@" || rc=1
  done < "$VERSIONS_FILE"
fi
exit $rc
