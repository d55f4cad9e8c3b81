#!/usr/bin/env python3
"""Checks configs/kubernetes/pod-sidecar.yaml without a cluster.

1. every document parses (PyYAML);
2. the storeguard sidecar keeps the hardening the deployment relies on (non-root, read-only root filesystem,
   no privilege escalation, capabilities drop ALL and add none), probes /healthz and /readyz on the metrics
   port, and the scrape annotations name that port;
3. the init container has NET_ADMIN and loads the rules; the embedded storeguard.nft is byte-for-byte
   configs/nftables/storeguard.nft, and its ports agree with storeguard's listen/upstream and the Service;
4. the embedded storeguard.yaml passes `storeguard config check` (when $STOREGUARD_BIN or storeguard is on PATH),
   and its audit files (the log and its passed flows, with their backups) fit the audit volume's sizeLimit;
5. the objects pass `kubernetes-validate --strict` against Kubernetes $K8S_VERSION (default 1.30.0) when the
   kubernetes_validate package is importable (pip install kubernetes-validate: schemas ship in the package,
   no network needed).

Usage: python3 configs/kubernetes/validate.py [FILE]      exit 1 on any failure
"""
import os, re, shutil, subprocess, sys, tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.dirname(HERE)
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "pod-sidecar.yaml")
errors, notes = [], []


def check(cond, msg):
    if not cond:
        errors.append(msg)


docs = [d for d in yaml.safe_load_all(open(path)) if d]
by_kind = {d["kind"]: d for d in docs}
for kind in ("ConfigMap", "Service", "Pod"):
    check(kind in by_kind, "missing %s" % kind)
if errors:
    sys.exit("\n".join("FAIL " + e for e in errors))

cm, svc, pod = by_kind["ConfigMap"], by_kind["Service"], by_kind["Pod"]
spec = pod["spec"]
inits = {c["name"]: c for c in spec.get("initContainers", [])}
ctrs = {c["name"]: c for c in spec.get("containers", [])}
sg = inits.get("storeguard") or ctrs.get("storeguard")
netinit = inits.get("storeguard-netinit")
check(sg is not None, "no storeguard container")
check(netinit is not None, "no storeguard-netinit init container")
if errors:
    sys.exit("\n".join("FAIL " + e for e in errors))

# --- sidecar hardening ---
sc = sg.get("securityContext", {})
check(sc.get("runAsNonRoot") is True, "storeguard: runAsNonRoot must be true")
check(isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] != 0, "storeguard: runAsUser must be a non-zero uid")
check(sc.get("readOnlyRootFilesystem") is True, "storeguard: readOnlyRootFilesystem must be true")
check(sc.get("allowPrivilegeEscalation") is False, "storeguard: allowPrivilegeEscalation must be false")
check(not sc.get("privileged"), "storeguard: must not be privileged")
caps = sc.get("capabilities", {})
check(caps.get("drop") == ["ALL"], "storeguard: capabilities.drop must be [ALL]")
check(not caps.get("add"), "storeguard: must add no capabilities")
if sg in inits.values():
    check(sg.get("restartPolicy") == "Always", "storeguard as an init container must be a native sidecar (restartPolicy: Always)")
    names = list(inits)
    check(names.index("storeguard-netinit") < names.index("storeguard"), "the rules must be installed before storeguard starts")

ports = {p["name"]: p["containerPort"] for p in sg.get("ports", [])}
check("metrics" in ports, "storeguard: no port named metrics")
probe = lambda k: (sg.get(k) or {}).get("httpGet", {})
check(probe("livenessProbe").get("path") == "/healthz", "storeguard: livenessProbe must GET /healthz")
check(probe("readinessProbe").get("path") == "/readyz", "storeguard: readinessProbe must GET /readyz")
for k in ("livenessProbe", "readinessProbe"):
    check(probe(k).get("port") in ("metrics", ports.get("metrics")), "storeguard: %s must use the metrics port" % k)
ann = pod["metadata"].get("annotations", {})
check(ann.get("prometheus.io/scrape") == "true", "pod: prometheus.io/scrape must be \"true\"")
check(str(ann.get("prometheus.io/port")) == str(ports.get("metrics")), "pod: prometheus.io/port must be the metrics port")
check(ann.get("prometheus.io/path") == "/metrics", "pod: prometheus.io/path must be /metrics")

# --- init container ---
nsc = netinit.get("securityContext", {})
check("NET_ADMIN" in nsc.get("capabilities", {}).get("add", []), "netinit: needs NET_ADMIN")
check(nsc.get("privileged") is not True, "netinit: NET_ADMIN is enough, do not run privileged")
for name, c in ctrs.items():
    add = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
    check("NET_ADMIN" not in add, "%s: must not have NET_ADMIN (it could remove the rules)" % name)

# --- rules and ports agree ---
nft_file = open(os.path.join(CONFIGS, "nftables", "storeguard.nft")).read()
nft = cm["data"].get("storeguard.nft", "")
check(nft == nft_file, "ConfigMap storeguard.nft differs from configs/nftables/storeguard.nft")
define = lambda n: int(re.search(r"^define %s = (\d+)" % n, nft, re.M).group(1))
store_port, proxy_port = define("store_port"), define("proxy_port")
cfg = yaml.safe_load(cm["data"]["storeguard.yaml"])
check(str(cfg.get("listen", "")).rsplit(":", 1)[-1] == str(proxy_port), "storeguard listen port != nft proxy_port")
check(cfg.get("upstream") == "127.0.0.1:%d" % store_port, "storeguard upstream must be 127.0.0.1:<nft store_port>")
check(str(cfg.get("metrics-listen", "")).rsplit(":", 1)[-1] == str(ports.get("metrics")), "metrics-listen port != metrics containerPort")
check(not str(cfg.get("metrics-listen", "")).startswith("127."), "metrics-listen on loopback: kubelet probes and Prometheus cannot reach it")
check(ports.get("proxy") == proxy_port, "storeguard proxy containerPort != nft proxy_port")
check(any(p.get("targetPort") == store_port for p in svc["spec"]["ports"]), "Service must target MASTER_PORT (%d)" % store_port)
audit = cfg.get("audit-log", "")
mounts = [m["mountPath"] for m in sg.get("volumeMounts", []) if not m.get("readOnly")]
check(any(audit.startswith(m.rstrip("/") + "/") for m in mounts), "audit-log %s is not on a writable volume" % audit)

# --- the audit files fit their volume (an emptyDir over its sizeLimit gets the pod evicted) ---
defaults = yaml.safe_load(open(os.path.join(CONFIGS, "storeguard.yaml")))["audit"]
acfg = {**defaults, **(cfg.get("audit") or {})}
# The audit log and the passed flows (audit-log.flows), each a file and its backups.
audit_bytes = acfg["max-bytes"] * (1 + acfg["max-backups"]) + acfg["flows-max-bytes"] * (1 + acfg["flows-max-backups"])
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
def quantity(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(q))
    return int(m.group(1)) * UNITS.get(m.group(2), 1) if m else None
audit_mount = max((m for m in sg.get("volumeMounts", []) if audit.startswith(m["mountPath"].rstrip("/") + "/")),
                  key=lambda m: len(m["mountPath"]), default=None)
audit_vol = next((v for v in spec.get("volumes", []) if audit_mount and v["name"] == audit_mount["name"]), {})
limit = quantity((audit_vol.get("emptyDir") or {}).get("sizeLimit", ""))
check(limit is None or audit_bytes <= limit,
      "the audit files can reach %d bytes, over their volume's sizeLimit (%d)" % (audit_bytes, limit or 0))

# --- storeguard config check ---
sgbin = os.environ.get("STOREGUARD_BIN") or shutil.which("storeguard")
if sgbin and os.access(sgbin, os.X_OK):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(cm["data"]["storeguard.yaml"]); f.flush()
        r = subprocess.run([sgbin, "config", "check", f.name], capture_output=True, text=True)
        check(r.returncode == 0, "storeguard config check rejected the ConfigMap: " + (r.stderr or r.stdout).strip()[-500:])
        notes.append("storeguard config check: %s" % ("ok" if r.returncode == 0 else "FAILED"))
else:
    notes.append("storeguard config check skipped (set STOREGUARD_BIN)")

# --- schemas ---
try:
    import kubernetes_validate  # noqa: F401
    kv = [sys.executable, "-m", "kubernetes_validate"]
except ImportError:
    kv = [shutil.which("kubernetes-validate")] if shutil.which("kubernetes-validate") else None
if kv:
    ver = os.environ.get("K8S_VERSION", "1.30.0")
    r = subprocess.run(kv + ["--strict", "--quiet", "-k", ver, path], capture_output=True, text=True)
    check(r.returncode == 0, "kubernetes-validate --strict -k %s: %s" % (ver, (r.stdout + r.stderr).strip()))
    notes.append("kubernetes-validate --strict -k %s: %s" % (ver, "ok" if r.returncode == 0 else "FAILED"))
else:
    notes.append("schema validation skipped (pip install kubernetes-validate)")

for n in notes:
    print("validate: " + n)
for e in errors:
    print("validate: FAIL " + e)
print("validate: %s: %d documents, %s" % (path, len(docs), "FAILED" if errors else "ok"))
sys.exit(1 if errors else 0)
