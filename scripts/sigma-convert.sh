#!/usr/bin/env bash
# Checks the Sigma rules of configs/sigma/rules and converts each one for Elasticsearch (Lucene, EQL,
# ES|QL) and Splunk (SPL) with configs/sigma/pipeline.yml:
#   sigma check   (all validators but the MITRE ATT&CK/D3FEND tag ones, which download their data)
#   sigma convert -t lucene|eql|esql|splunk -p configs/sigma/pipeline.yml RULE
# Fails when a rule does not parse or has a validation issue, when a conversion fails or prints
# nothing, or when a query lacks the rule's event.action value or the pipeline's event.dataset
# scope. The queries of all rules are kept, by target, in configs/sigma/converted/*.txt and must
# match what the pinned versions print (UPDATE=1 rewrites them).
# Installs sigma-cli and the backends, pinned, into a venv outside the clone when they are missing.
#
# Env: SIGMA_VENV   the venv (default /var/cache/storeguard/sigma)
#      UPDATE=1     rewrite configs/sigma/converted/*.txt
# Usage: scripts/sigma-convert.sh [--install-only]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$ROOT/configs/sigma
VENV=${SIGMA_VENV:-/var/cache/storeguard/sigma}
# pySigma is pinned too: sigma-cli takes any 1.x, and a new one may print other queries.
PINS=(sigma-cli==3.1.0 pySigma==1.5.1 pySigma-backend-elasticsearch==2.1.1 pySigma-backend-splunk==2.1.0)
TARGETS=(lucene eql esql splunk)
log() { echo "sigma-convert: $*" >&2; }

install() {
	local stamp=$VENV/.storeguard-pins
	if [ -x "$VENV/bin/sigma" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${PINS[*]}" ]; then return 0; fi
	log "installing ${PINS[*]} into $VENV"
	mkdir -p "$(dirname "$VENV")"
	python3 -m venv "$VENV" >&2
	"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
	echo "${PINS[*]}" >"$stamp"
}

install || { log "ERROR: could not install ${PINS[*]}"; exit 1; }
[ "${1:-}" != --install-only ] || exit 0
SIGMA=$VENV/bin/sigma
log "using sigma-cli $("$SIGMA" version 2>/dev/null | head -1 | cut -d' ' -f1), backends: $("$VENV/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -i 'backend' | tr -s ' ' | tr '\n' ' ')"

rc=0
"$SIGMA" check --fail-on-issues -x attacktag -x d3_fendtag "$DIR/rules" >&2 || { log "sigma check failed"; rc=1; }

# What each target's query must say: the rule's event.action and the pipeline's scope.
expect() { # target action
	case $1 in
	lucene) echo "event.action:$2" "event.dataset:storeguard.audit" ;;
	eql) echo "event.action:\"$2\"" "event.dataset:\"storeguard.audit\"" ;;
	esql) echo "from storeguard-*" "event.action==\"$2\"" "event.dataset==\"storeguard.audit\"" ;;
	splunk) echo "event.action=\"$2\"" "event.dataset=\"storeguard.audit\"" ;;
	esac
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rules=("$DIR"/rules/*.yml)
[ -e "${rules[0]}" ] || { log "no rules in $DIR/rules"; exit 1; }
for target in "${TARGETS[@]}"; do
	: >"$TMP/$target.txt"
	for rule in "${rules[@]}"; do
		name=$(basename "$rule" .yml)
		action=$(sed -n 's/^ *event\.action: *\([a-z_]*\) *$/\1/p' "$rule" | head -1)
		if [ -z "$action" ]; then log "FAIL $name: no event.action selection to check its queries by"; rc=1; continue; fi
		if ! out=$("$SIGMA" convert -t "$target" -p "$DIR/pipeline.yml" "$rule" 2>"$TMP/err"); then
			log "FAIL $target $name: conversion failed:"; cat "$TMP/err" >&2; rc=1; continue
		fi
		out=$(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d')
		if [ -z "$out" ]; then log "FAIL $target $name: empty query"; rc=1; continue; fi
		for want in $(expect "$target" "$action"); do
			case $out in *"$want"*) ;; *) log "FAIL $target $name: query lacks $want: $out"; rc=1 ;; esac
		done
		printf '# %s\n%s\n' "$name" "$out" >>"$TMP/$target.txt"
	done
	golden=$DIR/converted/$target.txt
	if [ "${UPDATE:-}" = 1 ]; then
		mkdir -p "$DIR/converted" && cp "$TMP/$target.txt" "$golden"
	elif ! diff -u "$golden" "$TMP/$target.txt" >&2; then
		log "FAIL $target: the queries differ from configs/sigma/converted/$target.txt (UPDATE=1 rewrites it)"; rc=1
	fi
	log "$target: ${#rules[@]} rules, e.g. $(sed -n 2p "$TMP/$target.txt")"
done

if [ $rc = 0 ]; then log "OK"; else log "FAILED"; fi
exit $rc
