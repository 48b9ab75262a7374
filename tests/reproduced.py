"""CI's ``reproduced`` job: where the engines' images differ, after each engine held two clean builds of its own
(tests/test_reproducible.py wrote what each published to ``$ASCENDKIT_SERVICES_DIR/reproducible/``).

    python -m tests.reproduced

Each engine's own pair of clean builds must have published one image (else its job failed, and this
fails for want of its record). Across engines this reports, file by file, where their images differ:
Docker 26.1.5 with the containerd store and on overlay2 both build with BuildKit from the same
Dockerfile, but their layers come out of two differs (containerd's snapshotter diff, moby's overlay2
diff) that write whiteouts, untouched files and the mount points of ``RUN --mount`` steps differently;
Docker 20.10 builds with the classic builder from the classic render (no cache or secret mounts), so
its history differs too. docs/architecture.md says what would make them agree.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from buildkit.ship.imagediff import diff_images, read_published
from tests.services import STATE

RESULTS = STATE / "reproducible"
BUILDKIT_ENGINES = ("docker-b", "docker-overlay2")  # the containerd store (tests/test_reproducible.py runs on the second engine), overlay2
CLASSIC_ENGINE = "docker-20.10"


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


def main() -> int:
    results = {name: _read(name) for name in (*BUILDKIT_ENGINES, CLASSIC_ENGINE)}
    for name, result in results.items():
        digests = "  ".join(f"{key} {result[key][:19]}" for key in ("config", "gzip", "zstd"))
        print(f"[reproduced] {name:<16} {result['builder']:<9} {digests}")
    first, other = (results[name] for name in BUILDKIT_ENGINES)
    if any(first[key] != other[key] for key in ("config", "gzip", "zstd")):
        lines = _differences(first, other)
        print(f"[reproduced] the containerd store and overlay2 (both BuildKit) publish other images ({len(lines)} differences):")
        for line in lines[:80]:
            print(f"  {line}")
    else:
        print("[reproduced] the containerd store and overlay2 publish the same image: one digest across the two engines")
    classic = results[CLASSIC_ENGINE]
    if all(classic[key] == first[key] for key in ("config", "gzip", "zstd")):
        print("[reproduced] the classic builder (Docker 20.10) publishes the same image as BuildKit")
    else:
        lines = _differences(first, classic)
        layers = sorted({line.split(":", 1)[0] for line in lines})
        print(
            f"[reproduced] the classic builder (Docker 20.10) publishes another image than BuildKit ({len(lines)} differences, in "
            f"{', '.join(layers[:6])}{', ...' if len(layers) > 6 else ''}); each is reproducible on its own. Where:"
        )
        for line in lines[:40]:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
