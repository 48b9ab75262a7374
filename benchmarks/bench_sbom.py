"""What the SBOM adds to a build: the no-op rebuild of the test stack, and the SBOM step inside it.

The SBOM's facts come from the verification probe the build runs anyway (one more dpkg/rpm query
and a few small files in the same container); the step of its own is the base image's digest, the
document and its write. Prints figures (median of --runs), asserts nothing. Needs `make services`.
Target: the SBOM step under 3 s, or under 5 % of a no-op rebuild, whichever is larger.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from buildkit.image.build import base_of, run_build
from buildkit.image.buildplan import plan_build
from buildkit.image.engine import connect, engine_facts
from buildkit.image.probe import run_probe
from buildkit.image.sbom import dumps, sbom_document
from buildkit.image.verify import collect_facts
from buildkit.matrix.load import load_matrix

ROOT = Path(__file__).resolve().parent.parent
TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    standin = os.environ.get("ASCENDKIT_STANDIN_IMAGE")
    if not standin:
        raise SystemExit("bench_sbom: run `make services` and source its env file first")
    client = connect()
    with tempfile.TemporaryDirectory(prefix="bench-sbom-") as out:
        plan = plan_build(
            load_matrix(TEST_MATRIX), "a3", arch="x86_64", base_image=standin, use_default_ca=False, manifest_dir=Path(out), reverify=True
        )  # reverify: each rebuild runs the verification the SBOM shares
        result = run_build(client, plan)  # warm: every later build is a no-op
        rebuilds, sboms, probes = [], [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            run_build(client, plan)
            rebuilds.append(time.perf_counter() - started)
            facts = collect_facts(client, result.engine_id or result.image_id)
            started = time.perf_counter()
            document = sbom_document(facts, plan.image, base_of(client, plan.base_image, engine_facts(client)), plan.repository)
            Path(out, "sbom.cdx.json").write_text(dumps(document), encoding="utf-8")
            sboms.append(time.perf_counter() - started)
            started = time.perf_counter()
            run_probe(client, result.engine_id or result.image_id)
            probes.append(time.perf_counter() - started)
    rebuild, sbom, probe = (statistics.median(x) for x in (rebuilds, sboms, probes))
    target = max(3.0, 0.05 * rebuild)
    print(f"no-op rebuild of the test stack (verification and SBOM included): median {rebuild:.2f}s over {args.runs} runs")
    print(f"  SBOM step (base digest, document of {len(document['components'])} components, write): median {sbom * 1000:.0f} ms")
    print(f"  the verification probe it shares (one container run): median {probe:.2f}s")
    print(f"  SBOM step / no-op rebuild: {100 * sbom / rebuild:.1f} % (target: under {target:.1f}s)")


if __name__ == "__main__":
    main()
