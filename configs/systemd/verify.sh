#!/bin/sh
# Verifies the systemd units offline: systemd-analyze verify of every unit, and of storeguard.service and
# storeguard-firewall.service with their peer-set drop-ins; the exposure score of the two guards
# (storeguard.service, with and without its drop-in, and storeguard-connect.service); and that
# storeguard-connect.sysusers.conf makes the user whose uid configs/nftables/storeguard-connect.nft lets past
# the redirect (systemd-sysusers --root).
# The units name /usr/local/bin/storeguard (the firewall units too: storeguard firewall, no nft binary); verify
# insists that it exists, so the units are checked from a scratch copy pointing at STOREGUARD_BIN (default: the
# storeguard on PATH, else a stub).
# Usage: configs/systemd/verify.sh          exit 1 on a verify error; prints SKIP without systemd-analyze.
set -eu
DIR=$(cd "$(dirname "$0")" && pwd)
command -v systemd-analyze >/dev/null 2>&1 || { echo "SKIP: systemd-analyze not installed (apt-get install systemd)"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BIN=${STOREGUARD_BIN:-$(command -v storeguard || true)}
if [ -z "$BIN" ]; then BIN=$TMP/storeguard; printf '#!/bin/sh\nexit 0\n' >"$BIN"; chmod +x "$BIN"; fi
UNITS="storeguard.service storeguard-firewall.service storeguard-connect.service storeguard-connect-firewall.service"
for u in $UNITS; do
	sed -e "s|/usr/local/bin/storeguard |$BIN |g" "$DIR/$u" >"$TMP/$u"
done
# The peer-set drop-ins (storeguard.service.d, storeguard-firewall.service.d), each checked as its unit with the
# drop-in's lines appended (a drop-in's [Service] lines add to or replace the unit's).
for u in storeguard.service storeguard-firewall.service; do
	d="$DIR/$u.d/peer-set.conf"
	v=${u%.service}-peer-set.service
	{ cat "$TMP/$u"; grep -v '^#' "$d"; } | sed -e "s|/usr/local/bin/storeguard |$BIN |g" >"$TMP/$v"
	UNITS="$UNITS $v"
done
# storeguard-connect.service names a static user; verify wants it to exist only when run, not offline.
out=$(cd "$TMP" && systemd-analyze verify $(for u in $UNITS; do printf './%s ' "$u"; done) 2>&1) || { echo "$out"; echo "verify: FAILED"; exit 1; }
# Anything printed is a warning (unknown key, bad value): treat it as a failure too.
[ -z "$out" ] || { echo "$out"; echo "verify: FAILED (warnings)"; exit 1; }
echo "verify: systemd-analyze verify ok"
for u in storeguard.service storeguard-connect.service storeguard-peer-set.service; do
	score=$(cd "$TMP" && systemd-analyze security --offline=yes "./$u" 2>/dev/null | sed -n "s/.*Overall exposure level for $u: \\([0-9.]*\\).*/\\1/p")
	if [ -n "$score" ]; then
		echo "verify: $u exposure $score (systemd-analyze security)"
		# 0 = locked down, 10 = unprotected; both score 1.5. Guard against a hardening line being dropped.
		awk -v s="$score" 'BEGIN { exit !(s <= 2.5) }' || { echo "verify: FAILED: $u exposure $score > 2.5"; exit 1; }
	fi
done
if command -v systemd-sysusers >/dev/null 2>&1; then
	mkdir -p "$TMP/root/etc"
	systemd-sysusers --root="$TMP/root" "$DIR/storeguard-connect.sysusers.conf" >/dev/null 2>&1 || { echo "verify: FAILED: systemd-sysusers"; exit 1; }
	uid=$(awk -F: '$1 == "storeguard-connect" { print $3 }' "$TMP/root/etc/passwd")
	want=$(sed -n 's/^define guard_uid = \([0-9]*\).*/\1/p' "$DIR/../nftables/storeguard-connect.nft")
	[ -n "$uid" ] && [ "$uid" = "$want" ] || { echo "verify: FAILED: storeguard-connect's uid ${uid:-missing} != the rule's guard_uid $want"; exit 1; }
	echo "verify: storeguard-connect.sysusers.conf makes uid $uid, the rule's guard_uid"
fi
