#!/usr/bin/env bash
# Installs, only when missing, everything the tests need: Debian packages (haproxy, stunnel4, tshark,
# nftables, podman, runc, iptables, nmap, iproute2, python3-torch, chromium; masscan, redis-tools, openssh-client, curl,
# openssl, wget for probename/testdata/capture-all.sh), Go modules, pytest, sigma-cli with its
# Elasticsearch and Splunk backends (a venv of scripts/sigma-convert.sh), and the real-torch
# environments of interop/torch-versions.txt (scripts/torch-envs.sh), a real vLLM release's Python source
# (scripts/vllm-src.sh), and a real SPIRE server and
# agent for identity's test (scripts/install-spire.sh). Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "install-deps: $*" >&2; }

need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v stunnel4 >/dev/null || need+=(stunnel4) # bench/tls-side-by-side.sh: TLS at both ends, the reference
command -v tshark >/dev/null || need+=(tshark)
command -v nft >/dev/null || need+=(nftables) # the kit's files, compared with storeguard firewall's rules
# scripts/image-test.sh: the image loaded and run by Debian's podman (runc: crun refuses hybrid cgroups)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
# configs/iptables/storeguard-connect.sh, checked on both backends by scripts/netns-connect-rules.sh
command -v iptables-legacy >/dev/null || need+=(iptables)
command -v nmap >/dev/null || need+=(nmap)
command -v ip >/dev/null || need+=(iproute2)
command -v prlimit >/dev/null || need+=(util-linux)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v chromium >/dev/null || need+=(chromium) # renders `storeguard audit --html` in a test
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
# The scanners and clients whose first bytes probename names (probename/testdata/capture-all.sh).
command -v masscan >/dev/null || need+=(masscan)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v ssh >/dev/null || need+=(openssh-client)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v wget >/dev/null || need+=(wget)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq >&2
  # tshark asks whether non-root users may capture; answer no without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need[@]}" >&2
fi

go mod download
python3 -c 'import pytest' 2>/dev/null || { log "pip install pytest"; python3 -m pip install -q pytest >&2; }
python3 -c 'import kubernetes_validate, yaml' 2>/dev/null \
  || { log "pip install kubernetes-validate"; python3 -m pip install -q kubernetes-validate pyyaml >&2; }
scripts/sigma-convert.sh --install-only
scripts/torch-envs.sh >/dev/null
scripts/vllm-src.sh >/dev/null   # vLLM's own StatelessProcessGroup, for interop/test_policy.py (about 20 s, 340 MB fetched once)
scripts/install-spire.sh >/dev/null

# kustomize, for configs/kubernetes/validate.py: each variant's build names the image component's image.
if ! [ -x /var/cache/storeguard/bin/kustomize ]; then
  log "go install sigs.k8s.io/kustomize/kustomize/v5@v5.8.0"
  mkdir -p /var/cache/storeguard/bin
  GOBIN=/var/cache/storeguard/bin GOFLAGS=-mod=mod go install sigs.k8s.io/kustomize/kustomize/v5@v5.8.0 >&2
fi
