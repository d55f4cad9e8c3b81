#!/usr/bin/env bash
# Proves storeguard's image (scripts/build-image.sh) end to end, with Debian's podman:
#   I1 two builds of HEAD, from two clones at other paths (the second with an empty Go build cache), give one digest
#   I2 the SBOM lists every module `go version -m` lists for the binary, at its version
#   I3 the image runs as 65532:65532, its layer holds /storeguard, /etc/passwd, /etc/group, /home/nonroot and /tmp
#      only, and there is no shell to run
#   I4 the image, as the init container does (root, NET_ADMIN only), installs the sidecar rules in the master's
#      network namespace (storeguard firewall install sidecar; no nft binary in the image)
#   I5 the image serves as the sidecar: its process runs as uid 65532, and a real two-process gloo job (rank 1 in
#      another namespace, init tcp://MASTER:STORE_PORT) completes through it
#   I6 nmap's TerminalServer probe (#106294, a 962 GB ADD key) from the worker is cut off and counted
# Namespaces: master 10.79.0.1/24, worker 10.79.0.2/24, joined by a veth pair; nothing leaves them.
# Env: TORCH_PY (default: torch 2.15.0's venv, else /usr/bin/python3), KEEP=1 keeps the work directory.
# Exit 0 on pass, or with a line starting "SKIP" when podman or namespaces cannot run here; 1 on failure.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_PY=${TORCH_PY:-/var/cache/storeguard/torch/2.15.0/bin/python}
[ -x "$TORCH_PY" ] || TORCH_PY=/usr/bin/python3
TAG=$$
NS_M=sg-img-m-$TAG NS_W=sg-img-w-$TAG
STORE_PORT=29500 PROXY_PORT=29499 METRICS_PORT=9464
WORK=$(mktemp -d /tmp/storeguard-image.XXXXXX)
PASSED=0 FAILED=0 PIDS=() CTRS=()
pass() { PASSED=$((PASSED + 1)); echo "image: PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "image: FAIL $*"; }
skip() { echo "SKIP: image: $*"; exit 0; }
die() { fail "$*"; exit 1; }
cleanup() {
	for c in "${CTRS[@]}"; do "${PODMAN[@]}" rm -f "$c" >/dev/null 2>&1 || true; done
	[ -n "${REF:-}" ] && "${PODMAN[@]}" rmi -f "$REF" >/dev/null 2>&1 || true
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	ip netns del "$NS_W" 2>/dev/null || true
	ip netns del "$NS_M" 2>/dev/null || true
	[ "${KEEP:-0}" = 1 ] && echo "image: work directory $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "needs root (podman, ip netns)"
command -v podman >/dev/null || skip "podman not installed (apt-get install podman runc)"
# This machine's cgroups are hybrid (v1 with a v2 tree that has controllers), which crun refuses: runc runs them.
# Its limits may not be raised, not even to the values podman asks by default: ask for this shell's descriptors,
# and 4096 processes (threads: the guard needs tens; here 65536 is refused too).
PODMAN=(podman)
command -v runc >/dev/null && PODMAN+=(--runtime runc)
LIMITS=(--ulimit "nofile=$(ulimit -n):$(ulimit -Hn)" --ulimit "nproc=4096:4096")

# --- I1: two builds, one digest ---------------------------------------------------------
build() { # DIR [GOCACHE]: a clone of HEAD at DIR/src, built into DIR/image
	git clone -q "$ROOT" "$1/src"
	git -C "$1/src" checkout -q "$(git -C "$ROOT" rev-parse HEAD)"
	( cd "$1/src" && env ${2:+GOCACHE=$2} scripts/build-image.sh "$1/image" >/dev/null )
	cat "$1/image/digest"
}
D1=$(build "$WORK/a") || die "the first build failed"
D2=$(build "$WORK/b" "$WORK/gocache") || die "the second build failed"
[ "$D1" = "$D2" ] && pass "I1 two builds of $(git -C "$ROOT" rev-parse --short HEAD) from two clones, one with an empty build cache: one digest $D1" \
	|| fail "I1 two builds, two digests: $D1 and $D2"
cmp -s "$WORK/a/image/storeguard.cdx.json" "$WORK/b/image/storeguard.cdx.json" && cmp -s "$WORK/a/image/storeguard.tar" "$WORK/b/image/storeguard.tar" \
	&& pass "I1b the SBOMs and the docker-archives are byte for byte the same" || fail "I1b the SBOMs or the docker-archives differ"
IMG=$WORK/a/image

# --- I2: the SBOM against go version -m ----------------------------------------------------
go version -m "$IMG/storeguard" | awk '$1 == "dep" || $1 == "=>" {print $2 "@" $3}' | sort >"$WORK/mods"
python3 - "$IMG/storeguard.cdx.json" >"$WORK/sbom-mods" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["components"]:
    print(c["name"] + "@" + c["version"])
PY
sort -o "$WORK/sbom-mods" "$WORK/sbom-mods"
# A replaced module is listed as its replacement (the code that is in the binary).
N=$(wc -l <"$WORK/sbom-mods")
missing=$(comm -13 "$WORK/mods" "$WORK/sbom-mods" | head -3)
absent=$(go version -m "$IMG/storeguard" | awk '$1 == "dep" && $4 != "" {print $2 "@" $3}' | sort | comm -23 - "$WORK/sbom-mods" | head -3)
if [ "$N" -gt 10 ] && [ -z "$missing" ] && [ -z "$absent" ]; then
	pass "I2 the SBOM (CycloneDX $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["specVersion"])' "$IMG/storeguard.cdx.json")) lists the $N modules of go version -m, each at its version"
else
	fail "I2 the SBOM and go version -m differ: in the SBOM only: ${missing:-none}; in the binary only: ${absent:-none}"
fi

# --- I3: non-root, no shell -------------------------------------------------------------------
"${PODMAN[@]}" load -q -i "$IMG/storeguard.tar" >"$WORK/load.log" 2>&1 || die "podman load: $(tail -1 "$WORK/load.log")"
REF=$(sed -n 's/^Loaded image: //p' "$WORK/load.log" | head -1)
REF=${REF:-localhost/storeguard:$(git -C "$ROOT" rev-parse --short=12 HEAD)}
user=$("${PODMAN[@]}" image inspect -f '{{.Config.User}}' "$REF")
files=$(python3 - "$IMG/oci" <<'PY'
import json, sys, tarfile, os
root = sys.argv[1]
idx = json.load(open(os.path.join(root, "index.json")))
blob = lambda d: os.path.join(root, "blobs", *d.split(":"))
man = json.load(open(blob(idx["manifests"][0]["digest"])))
names = []
for l in man["layers"]:
    with tarfile.open(blob(l["digest"])) as t:
        names += [m.name for m in t.getmembers()]
print(" ".join(sorted(names)))
PY
)
want="etc etc/group etc/passwd home home/nonroot storeguard tmp"
[ "$user" = "65532:65532" ] && [ "$files" = "$want" ] && pass "I3 the image runs as $user and holds only: $files" \
	|| fail "I3 user '$user', files '$files' (want 65532:65532 and '$want')"
if "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --entrypoint /bin/sh "$REF" -c true >"$WORK/sh.log" 2>&1; then
	fail "I3b a shell ran in the image"
else
	grep -q "no such file" "$WORK/sh.log" && pass "I3b no shell: $(grep -o 'stat /bin/sh: no such file or directory' "$WORK/sh.log" | head -1)" \
		|| fail "I3b /bin/sh failed, but not for want of it: $(tail -1 "$WORK/sh.log")"
fi

# --- the two hosts -------------------------------------------------------------------------
ip netns add "$NS_M" 2>"$WORK/netns.err" || skip "'ip netns add' is not permitted here ($(head -c 200 "$WORK/netns.err"))"
ip netns add "$NS_W"
ip link add "sgim$TAG" netns "$NS_M" type veth peer name "sgiw$TAG" netns "$NS_W"
ip -n "$NS_M" addr add 10.79.0.1/24 dev "sgim$TAG"; ip -n "$NS_W" addr add 10.79.0.2/24 dev "sgiw$TAG"
for ns in "$NS_M" "$NS_W"; do ip -n "$ns" link set lo up; done
ip -n "$NS_M" link set "sgim$TAG" up; ip -n "$NS_W" link set "sgiw$TAG" up
inm() { ip netns exec "$NS_M" "$@"; }
inw() { ip netns exec "$NS_W" "$@"; }
metric() { # NAME: the metric's value (summed over its labels) from the guard's endpoint
	inm python3 -c '
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=3).read().decode()
print(int(sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith(sys.argv[2] + "{") or l.startswith(sys.argv[2] + " "))))' "$METRICS_PORT" "$1"
}

# --- I4: the init container's job -------------------------------------------------------------
if "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network "ns:/run/netns/$NS_M" --user 0:0 --cap-drop all --cap-add NET_ADMIN \
	"$REF" firewall install sidecar --store-port "$STORE_PORT" --proxy-port "$PROXY_PORT" >"$WORK/fw.log" 2>&1 \
	&& inm "$IMG/storeguard" firewall check sidecar --store-port "$STORE_PORT" --proxy-port "$PROXY_PORT" >>"$WORK/fw.log" 2>&1; then
	pass "I4 the image installed the sidecar rules in the master's namespace (root with NET_ADMIN only; firewall check: as installed)"
else
	die "I4 the image did not install the rules: $(tail -2 "$WORK/fw.log" | tr '\n' ' ')"
fi

# --- I5: the sidecar ------------------------------------------------------------------------
CTR=sg-img-$TAG
"${PODMAN[@]}" run -d --name "$CTR" "${LIMITS[@]}" --network "ns:/run/netns/$NS_M" --cap-drop all --read-only \
	"$REF" serve --listen ":$PROXY_PORT" --upstream "127.0.0.1:$STORE_PORT" --metrics-listen "127.0.0.1:$METRICS_PORT" \
	--audit-log /tmp/audit.jsonl --mode enforce >/dev/null 2>"$WORK/serve.err" || die "podman run serve: $(tail -1 "$WORK/serve.err")"
CTRS+=("$CTR")
for _ in $(seq 100); do inm ss -ltnH "sport = :$PROXY_PORT" | grep -q . && break; sleep 0.1; done
pid=$("${PODMAN[@]}" inspect -f '{{.State.Pid}}' "$CTR")
uid=$(awk '/^Uid:/ {print $2 "/" $3}' "/proc/$pid/status" 2>/dev/null || echo "?")
caps=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo "?")
[ "$uid" = "65532/65532" ] && [ "$caps" = 0000000000000000 ] && pass "I5 the guard in the image runs as uid 65532 with no capabilities (pid $pid)" \
	|| fail "I5 the guard runs as uid '$uid' with capabilities '$caps' (want 65532/65532 and none)"
INIT="tcp://10.79.0.1:$STORE_PORT"
ip netns exec "$NS_M" env GLOO_SOCKET_IFNAME="sgim$TAG" timeout 120 "$TORCH_PY" "$ROOT/scripts/gloo-rank.py" 0 "$INIT" >"$WORK/rank0.log" 2>&1 &
R0=$!; PIDS+=("$R0")
ip netns exec "$NS_W" env GLOO_SOCKET_IFNAME="sgiw$TAG" timeout 120 "$TORCH_PY" "$ROOT/scripts/gloo-rank.py" 1 "$INIT" >"$WORK/rank1.log" 2>&1 &
R1=$!; PIDS+=("$R1")
rc0=0 rc1=0; wait "$R0" || rc0=$?; wait "$R1" || rc1=$?
ACC=$(metric storeguard_connections_accepted_total || echo -1)
MSGS=$(metric storeguard_messages_total || echo -1)
if [ "$rc0$rc1" = 00 ] && grep -q "all_reduce ok: 3.0" "$WORK/rank1.log" && [ "$ACC" -ge 1 ] && [ "$MSGS" -ge 1 ]; then
	pass "I5b a two-process gloo job ($("$TORCH_PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)) completed through the image: all_reduce 3.0, the guard accepted $ACC connections and judged $MSGS messages"
else
	fail "I5b the gloo job: rc $rc0/$rc1, accepted $ACC, messages $MSGS; rank1: $(tail -2 "$WORK/rank1.log" | tr '\n' ' ')"
fi

# --- I6: the probe -----------------------------------------------------------------------------------
# The job's store left with its rank 0: a store of its own, as a pod's training container keeps one.
ip netns exec "$NS_M" "$TORCH_PY" -c '
import datetime, sys, time
import torch.distributed as dist
s = dist.TCPStore("0.0.0.0", int(sys.argv[1]), 1, True, timeout=datetime.timedelta(seconds=60))
time.sleep(120)' "$STORE_PORT" >"$WORK/store.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do inm ss -ltnH "sport = :$STORE_PORT" | grep -q . && break; sleep 0.1; done
got=$(inw python3 -c '
import socket, sys
s = socket.create_connection(("10.79.0.1", int(sys.argv[1])), timeout=3)
s.sendall(bytes.fromhex("0300000b06e00000000000"))
try:
    print("closed" if s.recv(1) == b"" else "answered")
except ConnectionResetError:
    print("closed")
except socket.timeout:
    print("open")' "$STORE_PORT")
VIOL=$(metric storeguard_violations_total || echo -1)
[ "$got" = closed ] && [ "$VIOL" -ge 1 ] && pass "I6 nmap's TerminalServer probe from the worker: connection closed, storeguard_violations_total $VIOL" \
	|| fail "I6 the probe: $got, violations $VIOL (want closed and counted)"

echo "image: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
