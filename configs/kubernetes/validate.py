#!/usr/bin/env python3
"""Checks the Kubernetes manifests of the kit without a cluster.

For each file (default: every manifest of the variants: sidecar/, mtls/, mtls-spiffe/):
1. every document parses (PyYAML);
2. each storeguard sidecar (container `storeguard`, serve) keeps the hardening the deployment relies on
   (non-root, read-only root filesystem, no privilege escalation, capabilities drop ALL and add none), probes
   /healthz and /readyz on the metrics port, and the scrape annotations name that port;
3. its init container (storeguard-firewall: storeguard's own image, `firewall install sidecar`, no nft) has
   NET_ADMIN and its ports agree with storeguard's listen/upstream and the Service;
4. the embedded storeguard.yaml passes `storeguard config check` (when $STOREGUARD_BIN or storeguard is on PATH),
   and its audit files (the log and its passed flows, with their backups) fit the audit volume's sizeLimit;
5. with tls.mode on: the identity comes from a mounted Secret (no subPath: renewals must reach the files)
   or from the SPIFFE Workload API socket on a csi.spiffe.io volume, an allow list is set, and only
   loopback may speak plaintext;
6. each client guard (container `storeguard-connect`, connect --transparent) is hardened the same way, runs
   as the --guard-uid of its init container's `firewall install connect` and no other container of the pod
   does, listens on its --connect-port, expects its --master-ports, takes its identity as in 5 and names the
   master's (--tls-allow), after that init container;
7. cert-manager and SPIRE objects pass their CRDs' schemas (crds/, strict: no unknown field), and across
   files the identities agree: each side's certificate (Certificate uris, or ClusterSPIFFEID template)
   is allowed by the other side's guard, and each Secret a guard mounts is a Certificate's secretName;
8. the image: every storeguard container (firewall, install, serve, connect) names the one reference
   "storeguard", the name scripts/build-image.sh gives the image; image/kustomization.yaml (a Component)
   sets it, and each variant's kustomization lists its manifests and takes that component; no manifest
   names a netinit image or runs nft; with kustomize on PATH (or $KUSTOMIZE), each variant's build names
   the component's image in every storeguard container and nothing else;
9. the objects pass `kubernetes-validate --strict` against Kubernetes $K8S_VERSION (default 1.30.0) when the
   kubernetes_validate package is importable (pip install kubernetes-validate: schemas ship in the package,
   no network needed); it knows no CRD, and says so.

Usage: python3 configs/kubernetes/validate.py [FILE...]      exit 1 on any failure
"""
import fnmatch, glob, json, os, re, shutil, subprocess, sys, tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.dirname(HERE)
VARIANTS = ["sidecar", "mtls", "mtls-spiffe"]
paths = sys.argv[1:] or [p for v in VARIANTS for p in sorted(glob.glob(os.path.join(HERE, v, "*.yaml")))
                         if os.path.basename(p) != "kustomization.yaml"]
IMAGE = "storeguard"  # the one reference every storeguard container names
errors, notes = [], []
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def check(cond, msg):
    if not cond:
        errors.append(msg)


def quantity(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(q))
    return int(m.group(1)) * UNITS.get(m.group(2), 1) if m else None


def flag(args, name):
    """The values of --name in a container's args (repeatable flags give several)."""
    out = []
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
    return out


def identity_allowed(identity, patterns):
    """tls.allow's spiffe:// and uri: patterns: * is one path segment, ** the rest (and only at the end)."""
    for p in patterns:
        p = p[4:] if p.startswith("uri:") else p
        if p.endswith("/**") and identity.startswith(p[:-2]):
            return True
        if identity.count("/") == p.count("/") and fnmatch.fnmatchcase(identity, p) and \
                all(fnmatch.fnmatchcase(a, b) for a, b in zip(identity.split("/"), p.split("/"))):
            return True
    return False


def hardened(c, who):
    sc = c.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True, "%s: runAsNonRoot must be true" % who)
    check(isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] != 0, "%s: runAsUser must be a non-zero uid" % who)
    check(sc.get("readOnlyRootFilesystem") is True, "%s: readOnlyRootFilesystem must be true" % who)
    check(sc.get("allowPrivilegeEscalation") is False, "%s: allowPrivilegeEscalation must be false" % who)
    check(not sc.get("privileged"), "%s: must not be privileged" % who)
    caps = sc.get("capabilities", {})
    check(caps.get("drop") == ["ALL"], "%s: capabilities.drop must be [ALL]" % who)
    check(not caps.get("add"), "%s: must add no capabilities" % who)


def native_sidecar_after_firewall(spec, name, who):
    inits = [c["name"] for c in spec.get("initContainers", [])]
    c = next((c for c in spec.get("initContainers", []) if c["name"] == name), None)
    if c is not None:
        check(c.get("restartPolicy") == "Always", "%s as an init container must be a native sidecar (restartPolicy: Always)" % who)
        check("storeguard-firewall" in inits and inits.index("storeguard-firewall") < inits.index(name),
              "%s: the rules must be installed before it starts" % who)


def firewall_args(spec, who, ruleset):
    """The args of the init container that installs the rules (storeguard-firewall: storeguard's own image,
    `firewall install RULESET`), after checking it; [] when there is none."""
    fw = next((c for c in spec.get("initContainers", []) if c["name"] == "storeguard-firewall"), None)
    check(fw is not None, "%s: no storeguard-firewall init container" % who)
    if fw is None:
        return []
    sc = fw.get("securityContext", {})
    check("NET_ADMIN" in sc.get("capabilities", {}).get("add", []), "storeguard-firewall: needs NET_ADMIN")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], "storeguard-firewall: capabilities.drop must be [ALL]")
    check(sc.get("privileged") is not True, "storeguard-firewall: NET_ADMIN is enough, do not run privileged")
    check(sc.get("runAsUser") == 0, "storeguard-firewall: netlink to nf_tables needs uid 0 with NET_ADMIN (runAsUser: 0)")
    check(not fw.get("command"), "storeguard-firewall: no command: the image's own entrypoint (there is no shell or nft)")
    args = fw.get("args", [])
    check(args[:3] == ["firewall", "install", ruleset], "%s: storeguard-firewall must run firewall install %s" % (who, ruleset))
    for c in spec.get("containers", []):
        add = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
        check("NET_ADMIN" not in add, "%s: must not have NET_ADMIN (it could remove the rules)" % c["name"])
    return args


def fw_value(args, name, default):
    return (flag(args, name) or [default])[-1]


def configmap_of(pod, objs):
    for v in pod["spec"].get("volumes", []):
        if v.get("configMap") and v["name"] == "storeguard-config":
            return objs.get(("ConfigMap", v["configMap"]["name"]))
    return None


def tls_source(spec, c, cert, key, ca, spiffe, who):
    """Where a guard's identity comes from: files on a Secret volume, or the Workload API on csi.spiffe.io.
    Returns ("secret", secretName) or ("spiffe", None)."""
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = c.get("volumeMounts", [])
    def volume_of(path):
        best = max((m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")),
                   key=lambda m: len(m["mountPath"]), default=None)
        return best, vols.get(best["name"]) if best else None
    if spiffe:
        check(not (cert or key or ca), "%s: a SPIFFE socket and certificate files at once" % who)
        check(spiffe.startswith("unix://"), "%s: the SPIFFE socket must be unix:///path" % who)
        m, v = volume_of(spiffe[len("unix://"):])
        check(v is not None and (v.get("csi") or {}).get("driver") == "csi.spiffe.io",
              "%s: the SPIFFE socket %s is not on a csi.spiffe.io volume" % (who, spiffe))
        return ("spiffe", None)
    check(bool(cert and key and ca), "%s: tls needs a certificate, its key and the CA (or a SPIFFE socket)" % who)
    secrets = set()
    for f in (cert, key, ca):
        if not f:
            continue
        m, v = volume_of(f)
        check(v is not None and "secret" in v, "%s: %s is not on a Secret volume" % (who, f))
        if m is not None:
            check(not m.get("subPath"), "%s: %s is mounted with subPath: renewals would never reach it" % (who, f))
        if v is not None and "secret" in v:
            secrets.add(v["secret"]["secretName"])
            mode = v["secret"].get("defaultMode", 0o644)
            check(mode & 0o007 == 0, "%s: Secret %s is readable by every uid (defaultMode %o)" % (who, v["name"], mode))
    check(len(secrets) <= 1, "%s: certificate, key and CA come from different Secrets (%s)" % (who, sorted(secrets)))
    return ("secret", secrets.pop() if secrets else None)


# Identities collected across files: (side, source, allow patterns, pod) for the cross-checks.
guards = []


def check_server(pod, objs, path):
    spec = pod["spec"]
    inits = {c["name"]: c for c in spec.get("initContainers", [])}
    ctrs = {c["name"]: c for c in spec.get("containers", [])}
    sg = inits.get("storeguard") or ctrs.get("storeguard")
    hardened(sg, "storeguard")
    native_sidecar_after_firewall(spec, "storeguard", "storeguard")
    fw = firewall_args(spec, "storeguard", "sidecar")
    cm = configmap_of(pod, objs)
    svc = next((o for (k, _), o in objs.items() if k == "Service" and
                all(pod["metadata"].get("labels", {}).get(a) == b for a, b in o["spec"].get("selector", {}).items())), None)
    check(cm is not None, "storeguard: no ConfigMap mounted as storeguard-config")
    check(svc is not None, "no Service selects the master pod")
    if cm is None or svc is None:
        return

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

    # --- rules and ports agree ---
    store_port, proxy_port = int(fw_value(fw, "--store-port", 29500)), int(fw_value(fw, "--proxy-port", 29499))
    cfg = yaml.safe_load(cm["data"]["storeguard.yaml"])
    check(str(cfg.get("listen", "")).rsplit(":", 1)[-1] == str(proxy_port), "storeguard listen port != the firewall's --proxy-port")
    check(cfg.get("upstream") == "127.0.0.1:%d" % store_port, "storeguard upstream must be 127.0.0.1:<the firewall's --store-port>")
    check(str(cfg.get("metrics-listen", "")).rsplit(":", 1)[-1] == str(ports.get("metrics")), "metrics-listen port != metrics containerPort")
    check(not str(cfg.get("metrics-listen", "")).startswith("127."), "metrics-listen on loopback: kubelet probes and Prometheus cannot reach it")
    check(ports.get("proxy") == proxy_port, "storeguard proxy containerPort != the firewall's --proxy-port")
    check(any(p.get("targetPort") == store_port for p in svc["spec"]["ports"]), "Service must target MASTER_PORT (%d)" % store_port)
    audit = cfg.get("audit-log", "")
    mounts = [m["mountPath"] for m in sg.get("volumeMounts", []) if not m.get("readOnly")]
    check(any(audit.startswith(m.rstrip("/") + "/") for m in mounts), "audit-log %s is not on a writable volume" % audit)

    # --- the audit files fit their volume (an emptyDir over its sizeLimit gets the pod evicted) ---
    defaults = yaml.safe_load(open(os.path.join(CONFIGS, "storeguard.yaml")))["audit"]
    acfg = {**defaults, **(cfg.get("audit") or {})}
    # The audit log and the passed flows (audit-log.flows), each a file and its backups.
    audit_bytes = acfg["max-bytes"] * (1 + acfg["max-backups"]) + acfg["flows-max-bytes"] * (1 + acfg["flows-max-backups"])
    audit_mount = max((m for m in sg.get("volumeMounts", []) if audit.startswith(m["mountPath"].rstrip("/") + "/")),
                      key=lambda m: len(m["mountPath"]), default=None)
    audit_vol = next((v for v in spec.get("volumes", []) if audit_mount and v["name"] == audit_mount["name"]), {})
    limit = quantity((audit_vol.get("emptyDir") or {}).get("sizeLimit", ""))
    check(limit is None or audit_bytes <= limit,
          "the audit files can reach %d bytes, over their volume's sizeLimit (%d)" % (audit_bytes, limit or 0))

    # --- mutual TLS (tls.mode on; PyYAML reads a bare on as True) ---
    tls = cfg.get("tls") or {}
    if str(tls.get("mode", "off")).lower() in ("on", "true"):
        src = tls_source(spec, sg, tls.get("cert-file"), tls.get("key-file"), tls.get("ca-file"), tls.get("spiffe-socket"), "storeguard")
        check(bool(tls.get("allow")), "storeguard: tls.allow is empty: any certificate of the CA would do; name the workers'")
        loopback = {"127.0.0.0/8", "::1/128", "127.0.0.1/32", "127.0.0.1", "::1"}
        check(set(tls.get("plaintext-sources", ["127.0.0.0/8", "::1/128"])) <= loopback,
              "storeguard: tls.plaintext-sources beyond loopback: a pod's IP can be anyone's")
        guards.append(("server", src, tls.get("allow") or [], pod, path))
    configs_to_check.append((cm["metadata"]["name"], cm["data"]["storeguard.yaml"]))


def check_client(pod, objs, path):
    spec = pod["spec"]
    inits = {c["name"]: c for c in spec.get("initContainers", [])}
    ctrs = {c["name"]: c for c in spec.get("containers", [])}
    cg = inits.get("storeguard-connect") or ctrs.get("storeguard-connect")
    who = "storeguard-connect"
    hardened(cg, who)
    native_sidecar_after_firewall(spec, "storeguard-connect", who)
    fw = firewall_args(spec, who, "connect")
    args = cg.get("command", [])[1:] + cg.get("args", [])
    check(args[:1] == ["connect"], "%s: must run storeguard connect" % who)
    check("--transparent" in args, "%s: the rule redirects to it: --transparent" % who)
    connect_port = int(fw_value(fw, "--connect-port", 15001))
    guard_uid = int(fw_value(fw, "--guard-uid", 65533))
    master_ports = {int(p) for p in re.findall(r"\d+", fw_value(fw, "--master-ports", "29500"))}
    listen = flag(args, "--listen")
    check(listen and listen[-1].rsplit(":", 1)[-1] == str(connect_port), "%s: --listen port != the firewall's --connect-port (%d)" % (who, connect_port))
    check(all(int(p) in master_ports for p in flag(args, "--master-port")), "%s: --master-port not in the firewall's --master-ports" % who)
    sc = cg.get("securityContext", {})
    check(sc.get("runAsUser") == guard_uid, "%s: runAsUser must be the firewall's --guard-uid (%d): the rule lets that uid past" % (who, guard_uid))
    pod_uid = spec.get("securityContext", {}).get("runAsUser")
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if c["name"] in (who, "storeguard-install"):
            continue
        uid = c.get("securityContext", {}).get("runAsUser", pod_uid)
        check(uid != guard_uid, "%s: runs as the guard's uid %d: its store connections would skip the guard" % (c["name"], guard_uid))
    for c in ctrs.values():
        add = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
        check("NET_RAW" not in add, "%s: NET_RAW would let it set the guard's mark" % c["name"])
    if flag(args, "--mark"):
        check(any(x in sc.get("capabilities", {}).get("add", []) for x in ("NET_ADMIN", "NET_RAW")),
              "%s: --mark needs NET_ADMIN (or NET_RAW)" % who)
    ports = {p["name"]: p["containerPort"] for p in cg.get("ports", [])}
    m = flag(args, "--metrics-listen")
    check(m and "metrics" in ports and m[-1].rsplit(":", 1)[-1] == str(ports["metrics"]), "%s: --metrics-listen != the metrics containerPort" % who)
    check(m and not m[-1].startswith("127."), "%s: metrics on loopback: kubelet probes cannot reach it" % who)
    for k in ("startupProbe", "livenessProbe"):
        check((cg.get(k) or {}).get("httpGet", {}).get("path") == "/healthz", "%s: %s must GET /healthz" % (who, k))
    first = lambda n: (flag(args, n) or [None])[-1]
    src = tls_source(spec, cg, first("--tls-cert"), first("--tls-key"), first("--tls-ca"), first("--tls-spiffe-socket"), who)
    check(bool(flag(args, "--tls-allow")), "%s: no --tls-allow: any certificate of the CA could pose as the master" % who)
    guards.append(("client", src, flag(args, "--tls-allow"), pod, path))


# --- CRD schemas (crds/: cert-manager's and SPIRE's, from their repositories; names say the version) ---
def strict(schema):
    """What kubectl --validate=strict does with a CRD: no field its schema does not name."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema = {**schema, "additionalProperties": False}
        return {k: strict(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check_cr(obj, path):
    group, ver = obj["apiVersion"].split("/")
    f = os.path.join(HERE, "crds", "%s_%s_%s.json" % (group, ver, obj["kind"].lower()))
    if not os.path.exists(f):
        errors.append("%s: %s %s: no schema in crds/" % (os.path.basename(path), obj["kind"], obj["metadata"]["name"]))
        return
    import jsonschema
    schema = strict(json.load(open(f)))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's, not the CRD's
    for e in jsonschema.Draft7Validator(schema).iter_errors(obj):
        errors.append("%s: %s %s: %s at %s" % (os.path.basename(path), obj["kind"], obj["metadata"]["name"],
                                                e.message, "/".join(map(str, e.absolute_path)) or "(root)"))


configs_to_check = []
certificates, spiffe_ids = {}, []
total_docs = 0
CORE = {"v1", "apps/v1", "batch/v1"}
for path in paths:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    total_docs += len(docs)
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    pods = [d for d in docs if d["kind"] == "Pod"]
    check(pods or any(d["apiVersion"] not in CORE for d in docs), "%s: no Pod" % path)
    for pod in pods:
        for c in pod["spec"].get("initContainers", []) + pod["spec"].get("containers", []):
            if c["name"].startswith("storeguard"):
                check(c.get("image") == IMAGE, "%s: %s names image %r, not the one reference %r (image/kustomization.yaml sets it)" % (
                    os.path.basename(path), c["name"], c.get("image"), IMAGE))
            cmd = c.get("command") or []
            check("netinit" not in str(c.get("image", "")) and not (cmd and os.path.basename(cmd[0]) == "nft"),
                  "%s: %s needs a netinit image or nft: storeguard firewall installs the rules" % (os.path.basename(path), c["name"]))
        names = [c["name"] for c in pod["spec"].get("initContainers", []) + pod["spec"].get("containers", [])]
        check("storeguard" in names or "storeguard-connect" in names, "%s: pod %s has no storeguard" % (path, pod["metadata"]["name"]))
        if "storeguard" in names:
            check_server(pod, objs, path)
        if "storeguard-connect" in names:
            check_client(pod, objs, path)
    for d in docs:
        if d["apiVersion"] not in CORE:
            check_cr(d, path)
        if d["kind"] == "Certificate":
            certificates[d["spec"]["secretName"]] = d
        if d["kind"] == "ClusterSPIFFEID":
            spiffe_ids.append(d)

# --- the image: one reference, set by one kustomization ---
def load(path):
    return yaml.safe_load(open(path)) if os.path.exists(path) else None


build_tag = re.search(r'--tag "([a-z0-9._/-]+):', open(os.path.join(CONFIGS, "..", "scripts", "build-image.sh")).read())
check(build_tag and build_tag.group(1) == IMAGE, "scripts/build-image.sh names the image %r, the manifests %r" % (
    build_tag and build_tag.group(1), IMAGE))
component = load(os.path.join(HERE, "image", "kustomization.yaml")) or {}
check(component.get("kind") == "Component", "image/kustomization.yaml must be a kustomize Component")
entries = [i for i in component.get("images", []) if i.get("name") == IMAGE]
check(len(entries) == 1 and entries[0].get("newName") and (entries[0].get("newTag") or entries[0].get("digest")),
      "image/kustomization.yaml must set %r once (newName, and newTag or digest)" % IMAGE)
want_image = None
if len(entries) == 1:
    e = entries[0]
    want_image = e.get("newName", IMAGE) + ("@" + e["digest"] if e.get("digest") else ":" + str(e.get("newTag")))
for v in VARIANTS:
    k = load(os.path.join(HERE, v, "kustomization.yaml"))
    check(k is not None, "%s/: no kustomization.yaml" % v)
    if k is None:
        continue
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, v, "*.yaml")) if not p.endswith("kustomization.yaml"))
    check(sorted(k.get("resources", [])) == files, "%s/kustomization.yaml resources %s, the directory holds %s" % (v, k.get("resources"), files))
    check("../image" in k.get("components", []), "%s/kustomization.yaml does not take the image component (../image)" % v)
kustomize = os.environ.get("KUSTOMIZE") or shutil.which("kustomize")
check(not kustomize or os.access(kustomize, os.X_OK), "KUSTOMIZE=%s is not executable (scripts/install-deps.sh installs it)" % kustomize)
if kustomize and os.access(kustomize, os.X_OK) and want_image:
    for v in VARIANTS:
        r = subprocess.run([kustomize, "build", os.path.join(HERE, v)], capture_output=True, text=True)
        check(r.returncode == 0, "kustomize build %s: %s" % (v, r.stderr.strip()[-300:]))
        if r.returncode != 0:
            continue
        n = 0
        for d in yaml.safe_load_all(r.stdout):
            if not d or d.get("kind") != "Pod":
                continue
            for c in d["spec"].get("initContainers", []) + d["spec"].get("containers", []):
                is_sg = c["name"].startswith("storeguard")
                n += is_sg
                check((c["image"] == want_image) == is_sg, "kustomize build %s: %s runs %s" % (v, c["name"], c["image"]))
        notes.append("kustomize build %s: %d storeguard containers run %s" % (v, n, want_image))
else:
    notes.append("kustomize build skipped (no kustomize on PATH or $KUSTOMIZE)")

# --- identities agree across files ---
def identities(guard):
    """The SPIFFE IDs a guard presents: its Secret's Certificate uris, or the ClusterSPIFFEIDs that select
    its container (rendered for the trust domain the other side names, and the pod's namespace)."""
    side, (kind, secret), _, pod, _ = guard
    if kind == "secret":
        cert = certificates.get(secret)
        check(cert is not None or not certificates, "%s guard: Secret %s is no Certificate's secretName" % (side, secret))
        return (cert or {}).get("spec", {}).get("uris", [])
    container = "storeguard" if side == "server" else "storeguard-connect"
    out = []
    labels, ns = pod["metadata"].get("labels", {}), pod["metadata"].get("namespace", "default")
    for c in spiffe_ids:
        s = c["spec"]
        sel_ok = all(labels.get(k) == v for k, v in s.get("podSelector", {}).get("matchLabels", {}).items())
        ns_ok = all(v == ns for k, v in s.get("namespaceSelector", {}).get("matchLabels", {}).items() if k == "kubernetes.io/metadata.name")
        ctr_ok = all(t == "k8s:container-name:" + container for t in s.get("workloadSelectorTemplates", []) if t.startswith("k8s:container-name:"))
        if sel_ok and ns_ok and ctr_ok:
            out.append(s["spiffeIDTemplate"].replace("{{ .TrustDomain }}", "example.org").replace("{{ .PodMeta.Namespace }}", ns))
    check(out or not spiffe_ids, "%s guard of pod %s: no ClusterSPIFFEID selects it" % (side, pod["metadata"]["name"]))
    return out


for g in guards:
    for peer in guards:
        # Peers: the other side, with the same kind of identity (files: the cert-manager set; SPIFFE: its file).
        if peer[0] == g[0] or peer[1][0] != g[1][0] or (g[1][0] == "spiffe" and peer[4] != g[4]):
            continue
        for ident in identities(peer):
            check(identity_allowed(ident, g[2]), "%s guard (%s) does not allow the %s's identity %s (allow: %s)" % (
                g[0], os.path.basename(g[4]), peer[0], ident, g[2]))
    notes.append("%s guard of %s: identity from %s" % (g[0], os.path.basename(g[4]), "the SPIFFE Workload API" if g[1][0] == "spiffe" else "Secret " + str(g[1][1])))

# --- storeguard config check ---
sgbin = os.environ.get("STOREGUARD_BIN") or shutil.which("storeguard")
if sgbin and os.access(sgbin, os.X_OK):
    for name, text in configs_to_check:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(text); f.flush()
            r = subprocess.run([sgbin, "config", "check", f.name], capture_output=True, text=True)
            check(r.returncode == 0, "storeguard config check rejected ConfigMap %s: %s" % (name, (r.stderr or r.stdout).strip()[-500:]))
            notes.append("storeguard config check %s: %s" % (name, "ok" if r.returncode == 0 else "FAILED"))
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
    for path in paths:
        r = subprocess.run(kv + ["--strict", "--quiet", "-k", ver, path], capture_output=True, text=True)
        out = "\n".join(l for l in (r.stdout + r.stderr).splitlines() if "Couldn't find schema for kind" not in l)
        check(r.returncode == 0 and not out.strip(), "kubernetes-validate --strict -k %s %s: %s" % (ver, os.path.basename(path), out.strip()))
        notes.append("kubernetes-validate --strict -k %s %s: %s" % (ver, os.path.basename(path), "ok" if r.returncode == 0 else "FAILED"))
else:
    notes.append("schema validation skipped (pip install kubernetes-validate)")

for n in notes:
    print("validate: " + n)
for e in dict.fromkeys(errors):
    print("validate: FAIL " + e)
print("validate: %s: %d documents, %s" % (", ".join(os.path.basename(p) for p in paths), total_docs, "FAILED" if errors else "ok"))
sys.exit(1 if errors else 0)
