#!/usr/bin/env bash
# Builds storeguard's container image from this checkout, with no Docker daemon and nothing pulled:
# a static binary (CGO_ENABLED=0, -trimpath, no build id) in one layer on an empty base, non-root
# (65532:65532), no shell; every timestamp the commit's, so two builds of one commit give one digest.
#
# Usage: scripts/build-image.sh [OUT]     (default OUT: out/image)
# Writes: OUT/storeguard          the binary
#         OUT/oci/                an OCI image layout (skopeo copy oci:OUT/oci docker://REGISTRY/storeguard:TAG)
#         OUT/storeguard.tar      a docker-archive (podman load -i, docker load -i), named localhost/storeguard:TAG
#         OUT/storeguard.cdx.json the CycloneDX SBOM of the binary's Go modules (what `go version -m` lists)
#         OUT/digest              the image's manifest digest (also printed)
# Env: GOARCH (default: this machine's), TAG (default: the commit's short hash), SOURCE (the image's source label).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/out/image}" && cd "${1:-$ROOT/out/image}" && pwd)
cd "$ROOT"
EPOCH=$(git log -1 --format=%ct)
TAG=${TAG:-$(git rev-parse --short=12 HEAD)}
[ -z "$(git status --porcelain --untracked-files=no)" ] \
	|| echo "build-image: the work tree has changes: the image is of them (vcs.modified), not of a commit" >&2
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -buildid=" -o "$OUT/storeguard" ./cmd/storeguard
go run ./cmd/storeguard-image --binary "$OUT/storeguard" --epoch "$EPOCH" --tag "storeguard:$TAG" \
	--source "${SOURCE:-https://github.com/storeguard/storeguard}" \
	--oci "$OUT/oci" --tar "$OUT/storeguard.tar" --sbom "$OUT/storeguard.cdx.json" >"$OUT/digest"
echo "build-image: localhost/storeguard:$TAG $(cat "$OUT/digest") in $OUT"
