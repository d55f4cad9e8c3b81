#!/bin/sh
# Verifies the systemd units offline: systemd-analyze verify, and the exposure score of storeguard.service.
# The units name /usr/local/bin/storeguard and /usr/sbin/nft; verify insists that they exist, so the units are
# checked from a scratch copy pointing at STOREGUARD_BIN (default: the storeguard on PATH, else a stub).
# Usage: configs/systemd/verify.sh          exit 1 on a verify error; prints SKIP without systemd-analyze.
set -eu
DIR=$(cd "$(dirname "$0")" && pwd)
command -v systemd-analyze >/dev/null 2>&1 || { echo "SKIP: systemd-analyze not installed (apt-get install systemd)"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BIN=${STOREGUARD_BIN:-$(command -v storeguard || true)}
if [ -z "$BIN" ]; then BIN=$TMP/storeguard; printf '#!/bin/sh\nexit 0\n' >"$BIN"; chmod +x "$BIN"; fi
NFT=$(command -v nft || true)
if [ -z "$NFT" ]; then NFT=$TMP/nft; printf '#!/bin/sh\nexit 0\n' >"$NFT"; chmod +x "$NFT"; fi
for u in storeguard.service storeguard-firewall.service; do
	sed -e "s|/usr/local/bin/storeguard |$BIN |g" -e "s|/usr/sbin/nft |$NFT |g" "$DIR/$u" >"$TMP/$u"
done
out=$(cd "$TMP" && systemd-analyze verify ./storeguard.service ./storeguard-firewall.service 2>&1) || { echo "$out"; echo "verify: FAILED"; exit 1; }
# Anything printed is a warning (unknown key, bad value): treat it as a failure too.
[ -z "$out" ] || { echo "$out"; echo "verify: FAILED (warnings)"; exit 1; }
echo "verify: systemd-analyze verify ok"
score=$(cd "$TMP" && systemd-analyze security --offline=yes ./storeguard.service 2>/dev/null | sed -n 's/.*Overall exposure level for storeguard.service: \([0-9.]*\).*/\1/p')
if [ -n "$score" ]; then
	echo "verify: storeguard.service exposure $score (systemd-analyze security)"
	# 0 = locked down, 10 = unprotected; the unit scores 1.5. Guard against a hardening line being dropped.
	awk -v s="$score" 'BEGIN { exit !(s <= 2.5) }' || { echo "verify: FAILED: exposure $score > 2.5"; exit 1; }
fi
