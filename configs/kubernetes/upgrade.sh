#!/bin/sh
# Upgrade the storeguard sidecar of a running pod in place: every connection of the training job stays
# open (docs/zero-downtime.md). Restarting the container instead would close them all.
#
#   configs/kubernetes/upgrade.sh POD IMAGE [NAMESPACE]
#
# It adds an ephemeral container running IMAGE (the new storeguard) that shares the sidecar's process
# namespace (targetContainerName) and its storeguard-bin volume, and runs
#   storeguard upgrade --install /opt/storeguard/bin/storeguard --pid-file /opt/storeguard/worker.pid
# which copies the new binary over the one the sidecar runs, sends SIGUSR2 to the forwarding process and
# waits for the new one: the keeper starts it, it takes the listening socket and every connection over
# with its state, and the old one exits. The container's exit status is the upgrade's: 0, or 1 as soon
# as the old process records a failure (it goes on serving), with the reason in this container's log
# and in `kubectl logs POD -c storeguard`.
# The client guard of a worker pod (mtls/mtls-worker.yaml), as the same command with
#   CONTAINER=storeguard-connect PID_FILE=/opt/storeguard/connect.pid UID_GID=65533
# Needs kubectl >= 1.24 (patch --subresource) and ephemeral containers (Kubernetes >= 1.25).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 POD IMAGE [NAMESPACE]" >&2; exit 2; }
POD=$1 IMAGE=$2 NS=${3:-default}
CONTAINER=${CONTAINER:-storeguard} PID_FILE=${PID_FILE:-/opt/storeguard/worker.pid} UID_GID=${UID_GID:-65532}
NAME=storeguard-upgrade-$(date +%s)
kubectl -n "$NS" patch pod "$POD" --subresource=ephemeralcontainers --type=strategic -p "$(cat <<JSON
{"spec": {"ephemeralContainers": [{
  "name": "$NAME",
  "image": "$IMAGE",
  "targetContainerName": "$CONTAINER",
  "args": ["upgrade", "--install", "/opt/storeguard/bin/storeguard", "--pid-file", "$PID_FILE"],
  "volumeMounts": [{"name": "storeguard-bin", "mountPath": "/opt/storeguard"}],
  "securityContext": {"runAsNonRoot": true, "runAsUser": $UID_GID, "runAsGroup": $UID_GID,
                      "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                      "capabilities": {"drop": ["ALL"]}}
}]}}
JSON
)"
echo "waiting for $NAME ..."
for _ in $(seq 1 120); do
	code=$(kubectl -n "$NS" get pod "$POD" -o jsonpath="{.status.ephemeralContainerStatuses[?(@.name=='$NAME')].state.terminated.exitCode}")
	if [ -n "$code" ]; then
		kubectl -n "$NS" logs "$POD" -c "$NAME" || true
		exit "$code"
	fi
	sleep 1
done
echo "no result after 120 s: see kubectl -n $NS logs $POD -c $NAME" >&2
exit 1
