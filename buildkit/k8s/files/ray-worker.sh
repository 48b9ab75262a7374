#!/usr/bin/env bash
# A worker task of a Volcano Job without KubeRay: join the head's Ray cluster with this node's
# NPUs (retrying until the head answers), then stay until the head goes away.
# Settings come from the pod's environment (ascendkit k8s render writes them):
#   ASCENDKIT_RAY_HEAD   the head pod's DNS name (Volcano's svc plugin: <job>-head-0.<job>)
#   ASCENDKIT_RAY_CPUS   --num-cpus of each node
#   ASCENDKIT_RAY_NPUS   NPUs of each node: Ray's NPU resource
#   ASCENDKIT_RAY_JOIN_TIMEOUT  seconds to keep trying to join
set -euo pipefail

address="${ASCENDKIT_RAY_HEAD}:6379"
deadline=$((SECONDS + ASCENDKIT_RAY_JOIN_TIMEOUT))
until ray start --address="${address}" --disable-usage-stats \
  --num-cpus="${ASCENDKIT_RAY_CPUS}" --resources="{\"NPU\": ${ASCENDKIT_RAY_NPUS}}"; do
  if ((SECONDS > deadline)); then
    echo "ascendkit: could not join the Ray head at ${address}" >&2
    exit 1
  fi
  sleep 5
done
echo "ascendkit: joined the Ray head at ${address}"
while ray health-check --address="${address}" >/dev/null 2>&1; do
  sleep 15
done
echo "ascendkit: the Ray head at ${address} is gone; this worker is done"
