#!/usr/bin/env bash
# The head task of a Volcano Job without KubeRay: start Ray with this node's NPUs, wait until
# every worker has joined, run the job (the arguments), stop Ray, exit with the job's code.
# Settings come from the pod's environment (ascendkit k8s render writes them):
#   ASCENDKIT_RAY_NODES  Ray nodes the job needs, head included
#   ASCENDKIT_RAY_CPUS   --num-cpus of each node
#   ASCENDKIT_RAY_NPUS   NPUs of each node: Ray's NPU resource
#   ASCENDKIT_RAY_JOIN_TIMEOUT  seconds to wait for the workers
set -euo pipefail

ray start --head --port=6379 --dashboard-host=0.0.0.0 --disable-usage-stats \
  --num-cpus="${ASCENDKIT_RAY_CPUS}" --resources="{\"NPU\": ${ASCENDKIT_RAY_NPUS}}"

python3 - <<'PY'
import os
import sys
import time

import ray

want = int(os.environ["ASCENDKIT_RAY_NODES"])
deadline = time.monotonic() + int(os.environ["ASCENDKIT_RAY_JOIN_TIMEOUT"])
ray.init(address="auto", logging_level="ERROR")
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    npus = sum(n.get("Resources", {}).get("NPU", 0) for n in alive)
    if len(alive) >= want:
        print(f"ascendkit: {len(alive)} Ray nodes with {npus:g} NPUs joined; starting the job", flush=True)
        break
    if time.monotonic() > deadline:
        sys.exit(f"ascendkit: only {len(alive)} of {want} Ray nodes joined in time; is a worker pod pending or failing?")
    time.sleep(5)
PY

status=0
"$@" || status=$?
ray stop --force >/dev/null 2>&1 || true
exit "${status}"
