#!/usr/bin/env bash
# Installs spire-server and spire-agent (SPIRE v1.13.3) for identity/'s real-SPIRE test, only when
# missing. The Go module proxy serves SPIRE only as a tool, so they are built from a tools module of
# their own in the cache: SPIRE's dependencies never enter storeguard's go.mod.
# Env: STOREGUARD_SPIRE_BIN (default /var/cache/storeguard/spire/bin). Prints the bin directory.
set -euo pipefail
VERSION=v1.13.3
BIN=${STOREGUARD_SPIRE_BIN:-/var/cache/storeguard/spire/bin}
log() { echo "install-spire: $*" >&2; }

if [ -x "$BIN/spire-server" ] && [ -x "$BIN/spire-agent" ] \
  && "$BIN/spire-server" --version 2>&1 | grep -q "${VERSION#v}"; then
  echo "$BIN"; exit 0
fi

mod="$(dirname "$BIN")/tools"
mkdir -p "$BIN" "$mod"
cd "$mod"
[ -f go.mod ] || go mod init storeguard.local/spire-tools >&2
log "building spire-server and spire-agent $VERSION into $BIN (several minutes on 2 cores)"
export GOFLAGS=-mod=mod
go get -tool "github.com/spiffe/spire/cmd/spire-server@$VERSION" >&2
go get -tool "github.com/spiffe/spire/cmd/spire-agent@$VERSION" >&2
GOBIN="$BIN" go install github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent >&2
echo "$BIN"
