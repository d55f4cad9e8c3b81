#!/usr/bin/env bash
# Checks the Prometheus alerting rules and runs their unit tests:
#   promtool check rules configs/prometheus/alerts.yaml
#   promtool test rules  configs/prometheus/alerts_test.yaml
# Installs promtool when missing: Debian's "prometheus" package first (it ships /usr/bin/promtool; its
# service is not started by this script), else `go install` from the Go module proxy.
# Also checks that the Grafana dashboard is valid JSON and only queries metrics the design defines.
# Exit: non-zero on any failure.
#
# Env: PROMTOOL            promtool binary to use (skips the install)
#      PROMTOOL_GO_VERSION prometheus module version for the go install fallback (default v0.54.1 = Prometheus 2.54.1)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$ROOT/configs/prometheus
log() { echo "promtool-check: $*" >&2; }

find_promtool() {
	if [ -n "${PROMTOOL:-}" ]; then return 0; fi
	if command -v promtool >/dev/null; then PROMTOOL=$(command -v promtool); return 0; fi
	local gobin
	gobin=$(go env GOPATH 2>/dev/null)/bin/promtool
	if [ -x "$gobin" ]; then PROMTOOL=$gobin; return 0; fi
	return 1
}

install_promtool() {
	if command -v apt-get >/dev/null; then
		local sudo=""
		[ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo="sudo"; }
		if [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; then
			log "installing Debian package prometheus (for promtool)"
			local apt=(env DEBIAN_FRONTEND=noninteractive ${sudo:+"$sudo"} apt-get -o DPkg::Lock::Timeout=600 -y -q)
			# policy-rc.d 101: the package must not start a Prometheus server on this machine.
			local prc=/usr/sbin/policy-rc.d made_prc=0
			if [ ! -e $prc ] && [ "$(id -u)" = 0 ]; then printf '#!/bin/sh\nexit 101\n' >$prc && chmod +x $prc && made_prc=1; fi
			"${apt[@]}" install --no-install-recommends prometheus >&2 \
				|| { "${apt[@]}" update >&2 && "${apt[@]}" install --no-install-recommends prometheus >&2; } \
				|| log "apt install prometheus failed"
			[ $made_prc = 0 ] || rm -f $prc
			find_promtool && return 0
		fi
	fi
	if command -v go >/dev/null; then
		local v=${PROMTOOL_GO_VERSION:-v0.54.1}
		log "installing promtool with go install github.com/prometheus/prometheus/cmd/promtool@$v"
		GOFLAGS=-mod=mod go install "github.com/prometheus/prometheus/cmd/promtool@$v" >&2 && find_promtool && return 0
	fi
	return 1
}

find_promtool || install_promtool || { log "ERROR: promtool not found and could not be installed"; exit 1; }
log "using $PROMTOOL ($("$PROMTOOL" --version 2>&1 | head -1))"

rc=0
"$PROMTOOL" check rules "$DIR/alerts.yaml" || rc=1
# promtool resolves rule_files relative to the test file's directory.
(cd "$DIR" && "$PROMTOOL" test rules alerts_test.yaml) || rc=1

# The dashboard: valid JSON, and every storeguard_* metric it queries exists in docs/design.md.
# Metrics registered in proxy/metrics.go but not (yet) listed in the design are accepted with a note.
# Its queries, with Grafana's variables filled in, must parse as PromQL: they become recording rules in a
# scratch file for promtool check rules.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$ROOT/configs/grafana/storeguard-dashboard.json" "$ROOT/docs/design.md" "$DIR/alerts.yaml" "$ROOT/proxy/metrics.go" "$TMP/dashboard-rules.yaml" <<'EOF' || rc=1
import json, os, re, sys
dash = json.load(open(sys.argv[1]))
design = open(sys.argv[2]).read()
known = set(re.findall(r"`(\w+?)(?:\{[^`]*\})?`", design.split("## Metrics", 1)[1]))
code = set(re.findall(r'f\("(\w+)"', open(sys.argv[4]).read())) if os.path.exists(sys.argv[4]) else set()
for m in sorted(code - known):
    print("promtool-check: note: storeguard_%s is registered in proxy/metrics.go but not listed in docs/design.md" % m, file=sys.stderr)
known |= code
known |= {k + s for k in list(known) for s in ("_bucket", "_sum", "_count")}
bad = []
def check(text, where):
    for m in re.findall(r"storeguard_(\w+)", text):
        if m not in known:
            bad.append("%s: storeguard_%s" % (where, m))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
for e in exprs:
    check(e, "dashboard")
check(open(sys.argv[3]).read(), "alerts.yaml")
with open(sys.argv[5], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$job", ".*").replace("$instance", ".*")
        f.write("      - record: dashboard_query_%d\n        expr: %s\n" % (i, json.dumps(e)))
if bad:
    print("promtool-check: metrics not in docs/design.md:\n  " + "\n  ".join(sorted(set(bad))), file=sys.stderr)
    sys.exit(1)
print("promtool-check: dashboard JSON ok (%d panels, %d queries); metric names match docs/design.md" % (len(dash["panels"]), len(exprs)), file=sys.stderr)
EOF
[ ! -s "$TMP/dashboard-rules.yaml" ] || "$PROMTOOL" check rules "$TMP/dashboard-rules.yaml" >/dev/null \
	|| { log "dashboard queries do not parse:"; "$PROMTOOL" check rules "$TMP/dashboard-rules.yaml" >&2 || true; rc=1; }

if [ $rc = 0 ]; then log "OK"; else log "FAILED"; fi
exit $rc
