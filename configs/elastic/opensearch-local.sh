#!/usr/bin/env bash
# Runs the index template against a real OpenSearch: starts a single-node OpenSearch 2.19.1 on
# 127.0.0.1 from Maven Central's jars (opensearch-local/: the server and its netty4 transport, no
# distribution download), then audit's TestLiveIndexing with STOREGUARD_SEARCH_URL pointing at it:
# the template loads, every kind of event is indexed without a rejection, storeguard.declared 2^64-1
# is found as unsigned_long, an unmapped field is refused, and each Sigma rule's Lucene query
# (configs/sigma/converted/lucene.txt) finds exactly its events. Stops the node (by its PID) after.
# Opt-in from scripts/test.sh: SEARCH_LIVE=1. Needs java 17+ and mvn; the jars (~70 MB) are cached.
#
# Env: OPENSEARCH_CACHE  where the jars and classes go (default /var/cache/storeguard/opensearch)
#      OPENSEARCH_PORT   HTTP port on 127.0.0.1 (default 19200)
#      KEEP=1            leave the node running and print its URL and PID
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SRC=$ROOT/configs/elastic/opensearch-local
CACHE=${OPENSEARCH_CACHE:-/var/cache/storeguard/opensearch}
PORT=${OPENSEARCH_PORT:-19200}
URL=http://127.0.0.1:$PORT
log() { echo "opensearch-local: $*" >&2; }

version=$(sed -n 's:.*<opensearch.version>\(.*\)</opensearch.version>.*:\1:p' "$SRC/pom.xml")
LIB=$CACHE/lib-$version
if [ ! -f "$LIB/.complete" ]; then
	log "fetching OpenSearch $version jars from Maven Central into $LIB"
	rm -rf "$LIB" && mkdir -p "$LIB"
	mvn -q -B -f "$SRC/pom.xml" dependency:copy-dependencies -DoutputDirectory="$LIB" >&2
	touch "$LIB/.complete"
fi
CLASSES=$CACHE/classes
mkdir -p "$CLASSES"
javac -d "$CLASSES" -cp "$LIB/*" "$SRC/LocalOpenSearch.java"

if curl -s -o /dev/null "$URL"; then log "ERROR: something already answers on $URL (OPENSEARCH_PORT=)"; exit 1; fi
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/storeguard-opensearch.XXXXXX")
java -Xms512m -Xmx512m -cp "$CLASSES:$LIB/*" LocalOpenSearch "$HOME_DIR" "$PORT" >"$HOME_DIR/stdout.log" 2>&1 &
PID=$!
stop() {
	kill "$PID" 2>/dev/null || true
	wait "$PID" 2>/dev/null || true # 143: it ended on the TERM
	rm -rf "$HOME_DIR"
}
[ "${KEEP:-}" = 1 ] || trap stop EXIT

for _ in $(seq 120); do
	curl -s -o /dev/null "$URL" && break
	kill -0 "$PID" 2>/dev/null || { log "ERROR: the node exited:"; tail -30 "$HOME_DIR/stdout.log" >&2; exit 1; }
	sleep 1
done
curl -s -o /dev/null "$URL" || { log "ERROR: no answer on $URL after 120 s"; tail -30 "$HOME_DIR/stdout.log" >&2; exit 1; }
log "OpenSearch $version up on $URL (pid $PID)"

cd "$ROOT"
STOREGUARD_SEARCH_URL=$URL go test -count=1 -run '^TestLiveIndexing$' -v ./audit/ | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+template_test)' || rc=$?
if [ "${KEEP:-}" = 1 ]; then log "left running: STOREGUARD_SEARCH_URL=$URL, pid $PID, home $HOME_DIR"; fi
exit "${rc:-0}"
