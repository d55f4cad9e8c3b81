#!/usr/bin/env bash
# Captures the first bytes that scanners and stray clients send to a silent TCP port, for
# observed.json (build-observed.py turns the logs into it). Needs root: masscan sends raw packets.
# Every target is 127.0.0.1. masscan runs in a network namespace of its own (pnmass) whose lo gets
# a non-zero MAC (masscan refuses an all-zero one), route_localnet and accept_local (the kernel
# drops injected 127.0.0.0/8 packets as martians otherwise), and an nft rule that keeps the
# kernel from resetting masscan's source port. The namespace is deleted at the end.
#
#   capture-all.sh OUTDIR
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

# run NAME PORT NETNS CMD...: a fresh listener, CMD, then enough quiet for the last connection.
run() {
  local name=$1 port=$2 ns=$3; shift 3
  local log=$out/$name.log pre=()
  [ -n "$ns" ] && pre=(ip netns exec "$ns")
  : > "$log"
  "${pre[@]}" python3 "$here/capture.py" "$port" "$log" &
  local lp=$!
  sleep 0.7
  echo "$*" > "$out/$name.cmd"
  local rc=0
  "${pre[@]}" "$@" > "$out/$name.out" 2>&1 || rc=$?
  echo "rc=$rc" >> "$out/$name.out"
  sleep 9.5
  kill "$lp"
  wait "$lp" 2>/dev/null || true
  echo "$name: $(wc -l < "$log") connections" >&2
}

ssh_opts=(-o BatchMode=yes -o ConnectTimeout=3 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null)
run nmap_sT 29500 "" nmap -sT -Pn -p 29500 127.0.0.1
run nmap_sS 29500 "" nmap -sS -Pn -p 29500 127.0.0.1
run nmap_sV 29500 "" nmap -sV -Pn -p 29500 127.0.0.1
run nmap_sV_version_all 29500 "" nmap -sV --version-all -Pn -p 29500 127.0.0.1
run nmap_sC_sV 29500 "" nmap -sC -sV -Pn -p 29500 127.0.0.1
run curl_http 29501 "" curl -sS -m 3 http://127.0.0.1:29501/
run curl_https 29502 "" curl -sS -k -m 3 https://127.0.0.1:29502/
run openssl_s_client 29503 "" timeout 4 openssl s_client -connect 127.0.0.1:29503
run redis_cli_ping 29504 "" timeout 4 redis-cli -p 29504 ping
run ssh 29505 "" timeout 4 ssh -p 29505 "${ssh_opts[@]}" 127.0.0.1 true
run curl_http2_prior_knowledge 29506 "" curl -sS -m 3 --http2-prior-knowledge http://127.0.0.1:29506/
run curl_head 29507 "" curl -sS -m 3 -I http://127.0.0.1:29507/
run curl_post 29508 "" curl -sS -m 3 -d a=b http://127.0.0.1:29508/
run curl_options 29509 "" curl -sS -m 3 -X OPTIONS http://127.0.0.1:29509/
run wget 29510 "" wget -q -T 3 -t 1 -O /dev/null http://127.0.0.1:29510/

ns=pnmass
ip netns add $ns
trap 'ip netns del $ns' EXIT
ip netns exec $ns ip link set lo up
ip netns exec $ns ip link set lo address 02:00:00:00:00:01
ip netns exec $ns sysctl -qw net.ipv4.conf.all.route_localnet=1 net.ipv4.conf.lo.route_localnet=1 \
  net.ipv4.conf.all.accept_local=1 net.ipv4.conf.lo.accept_local=1
ip netns exec $ns nft add table inet pnmasscan
ip netns exec $ns nft add chain inet pnmasscan in '{ type filter hook input priority -10; }'
ip netns exec $ns nft add rule inet pnmasscan in tcp dport 61234 drop
m=(timeout 25 masscan 127.0.0.1 --banners -e lo --router-mac 02-00-00-00-00-01 --adapter-ip 127.0.0.1
  --adapter-port 61234 --wait 12 --rate 100)
run masscan_banners 29511 $ns "${m[@]}" -p29511
run masscan_hello_http 29512 $ns "${m[@]}" -p29512 --hello=http
run masscan_hello_ssl 29513 $ns "${m[@]}" -p29513 --hello=ssl
run masscan_hello_smbv1 29514 $ns "${m[@]}" -p29514 --hello=smbv1
