"""CI's ``reproduced`` job: the engines' images compared, after each engine held two clean builds of its own
(tests/test_reproducible.py wrote what each published to ``$ASCENDKIT_SERVICES_DIR/reproducible/``).

    python -m tests.harness.reproduced

Each engine's own pair of clean builds must have published one image (else its job failed, and this
fails for want of its record). Across engines:

- Docker 26.1.5 with the containerd store and on overlay2 build with the same BuildKit from the same
  Dockerfile, and their layers come out of two differs (containerd's snapshotter diff, moby's overlay2
  diff) that write a step's changes differently; publishing writes them one way (ship/layers/normalize.py),
  so the two publish one image: the same config and manifests, gzip and zstd. Fails otherwise, naming
  each differing file.
- Docker 20.10's classic builder publishes the same layers as BuildKit, but for the empty layer
  BuildKit writes for a ``WORKDIR`` that exists; its config differs (each builder writes its own
  history lines, and the classic builder fills the container config's defaults), and so its manifests
  do. Fails if a layer differs, naming each differing file; prints the config's differences.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from buildkit.ship.imagediff import diff_images, read_published
from tests.harness.services import STATE

RESULTS = STATE / "reproducible"
BUILDKIT_ENGINES = ("docker-b", "docker-overlay2")  # the containerd store (tests/test_reproducible.py runs on the second engine), overlay2
CLASSIC_ENGINE = "docker-20.10"
KEYS = ("config", "gzip", "zstd")

# The DiffID of a layer with nothing in it (two zero blocks): BuildKit writes one for a WORKDIR that exists.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def _read(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        sys.exit(f"[reproduced] {path} is missing: tests/test_reproducible.py did not pass on {name}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _where(result: dict[str, Any]) -> str:
    return f"{result['repository']}@{result['gzip']}"


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [d.line() for d in diff_images(read_published(_where(a), "x86_64"), read_published(_where(b), "x86_64"))]


def _layers(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The image's layers that hold something: (DiffID, the gzip blob's digest), in order."""
    image = read_published(_where(result), "x86_64")
    diff_ids = list(image.config.get("rootfs", {}).get("diff_ids") or [])
    return [(d, str(layer["digest"])) for d, layer in zip(diff_ids, image.layers, strict=True) if d != EMPTY_LAYER]


def _show(title: str, lines: list[str], limit: int) -> None:
    print(f"[reproduced] {title}")
    for line in lines[:limit]:
        print(f"  {line[:240]}")


def main() -> int:
    results = {name: _read(name) for name in (*BUILDKIT_ENGINES, CLASSIC_ENGINE)}
    for name, result in results.items():
        digests = "  ".join(f"{key} {result[key][:19]}" for key in KEYS)
        print(f"[reproduced] {name:<16} {result['builder']:<9} {digests}")
    failed = False
    first, other = (results[name] for name in BUILDKIT_ENGINES)
    if any(first[key] != other[key] for key in KEYS):
        lines = _differences(first, other)
        _show(f"FAILED: the containerd store and overlay2 (both BuildKit) published other images ({len(lines)} differences):", lines, 80)
        failed = True
    else:
        print("[reproduced] the containerd store and overlay2 publish the same image: one config and manifest digest, gzip and zstd")
    classic = results[CLASSIC_ENGINE]
    if all(classic[key] == first[key] for key in KEYS):
        print("[reproduced] the classic builder (Docker 20.10) publishes the same image as BuildKit")
    elif _layers(classic) != _layers(first):
        lines = [line for line in _differences(first, classic) if not line.startswith("config")]
        _show(f"FAILED: the classic builder (Docker 20.10) published other layers than BuildKit ({len(lines)} differences):", lines, 80)
        failed = True
    else:
        lines = [line for line in _differences(first, classic) if line.startswith("config")]
        title = (
            f"the classic builder (Docker 20.10) publishes BuildKit's {len(_layers(first))} layers (BuildKit's empty WORKDIR layer "
            f"aside); its config differs in {len(lines)} field(s), so its manifests do:"
        )
        _show(title, lines, 20)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
