#!/usr/bin/env bash
# The Wireshark dissector (configs/wireshark/tcpstore.lua) against storeguard replay, on every capture in the repo:
# for each TCP stream to the store, the messages by op, the generation and the violation (its field and declared
# length: nmap -sV's TerminalServer probe, configs/wireshark/testdata) must be the same. A torch 2.1 capture
# (G1, no VALIDATE) is read as G1 by both (replay --generation 2.1, the dissector's preference); every other
# generation is decided from the stream by each. Needs tshark (Debian's, with Lua); STOREGUARD_BIN names the
# binary (default: go build).
# Exit: 0 when every stream agrees, 1 otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ -z "${STOREGUARD_BIN:-}" ]; then
	STOREGUARD_BIN=$(mktemp -d)/storeguard
	go build -o "$STOREGUARD_BIN" ./cmd/storeguard
fi
command -v tshark >/dev/null || { echo "dissector-vs-replay: no tshark"; exit 1; }
fail=0 streams=0 files=0 msgs=0 viols=0
for cap in $(git ls-files '*.pcap' '*.pcapng' '*.pcap.gz'); do
	files=$((files + 1))
	port=$(tshark -r "$cap" -Y 'tcp.flags.syn == 1 && tcp.flags.ack == 0' -T fields -e tcp.dstport -c 1 2>/dev/null)
	gen=() pref=()
	case "$cap" in *2.1.*) gen=(--generation 2.1) pref=(-o tcpstore.legacy:G1);; esac
	rep=$("$STOREGUARD_BIN" replay --json --port "$port" "${gen[@]}" "$cap" 2>/dev/null || true)
	dis=$(timeout 120 tshark -X lua_script:configs/wireshark/tcpstore.lua "${pref[@]}" -r "$cap" -d "tcp.port==$port,tcpstore" \
		-Y "tcpstore && tcp.dstport == $port" -T fields -e tcp.srcport -e tcpstore.op -e tcpstore.generation -e tcpstore.violation 2>/dev/null)
	out=$(python3 - "$cap" "$rep" "$dis" <<'EOF'
import collections, json, sys
cap, rep, dis = sys.argv[1], sys.argv[2], sys.argv[3]
want = {}
for line in rep.splitlines():
    s = json.loads(line)
    v = s.get("violation")
    want[s["src"].rsplit(":", 1)[1]] = (s.get("generation", ""), dict(s.get("messages") or {}),
                                        v and f'{v["field"] or v["rule"]} {v["declared"]}')
got = collections.defaultdict(lambda: ["", collections.Counter(), None])
for line in dis.splitlines():
    parts = line.split("\t") + ["", ""]
    port, ops, gens, viol = parts[0], parts[1], parts[2], parts[3]
    for op in filter(None, ops.split(",")):
        got[port][1][op] += 1
    if gens:
        got[port][0] = gens.split(",")[-1]
    if viol:
        got[port][2] = viol
bad, n = [], 0
for port, (gen, msgs, viol) in want.items():
    g = got.get(port, ["", collections.Counter(), None])
    n += sum(msgs.values())
    if not msgs and not g[1] and not viol and not g[2]:
        continue  # a silent stream (G0's callback connection)
    if dict(g[1]) != msgs or ((msgs or viol) and g[0] != gen):
        bad.append(f"stream from :{port}: replay {gen} {msgs}, dissector {g[0]} {dict(g[1])}")
    # the same violation: replay's field and declared length are in the dissector's words
    if bool(viol) != bool(g[2]) or (viol and not all(w in g[2] for w in viol.split())):
        bad.append(f"stream from :{port}: replay's violation {viol!r}, the dissector's {g[2]!r}")
for port in got:
    if port not in want:
        bad.append(f"stream from :{port}: only the dissector saw it: {got[port]}")
print(len(want), n, sum(1 for w in want.values() if w[2]))
for b in bad:
    print("MISMATCH", cap, b)
EOF
)
	read -r ns nm nv <<<"$(head -1 <<<"$out")"
	streams=$((streams + ns)) msgs=$((msgs + nm)) viols=$((viols + nv))
	if grep -q MISMATCH <<<"$out"; then
		grep MISMATCH <<<"$out"; fail=1
	fi
done
echo "dissector-vs-replay: $files captures, $streams streams, $msgs messages, $viols violations: $([ $fail = 0 ] && echo "the same by op, generation and violation" || echo MISMATCH)"
exit $fail
