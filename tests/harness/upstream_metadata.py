"""What every pin of the shipped matrix declares it requires, as its index publishes it, vendored so
the unit tests check every stack's agreement offline (``tests/fixtures/upstream/metadata/``).

Each file is one pin on one arch: the distribution, its version, its ``Requires-Dist`` lines, its
``Requires-Python`` and the file they were read from with that file's sha256 (a wheel's METADATA read
through HTTP ranges, or the sdist the image builds from). Pins whose index this machine cannot reach
(the PyTorch CPU index, Ascend's) have no file: the tests say so. After a pin moves,

    python -m tests.harness.upstream_metadata vendor

reads what the matrix now pins and rewrites the store (then commit it); the ``network`` test
``test_the_vendored_metadata_is_the_indexs`` holds the store to the index.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

from buildkit.lock.index import IndexClient
from buildkit.lock.metadata import Declared, MetadataReader, Reader, index_reader
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.matrix.model import PypiPin, Stack
from tests.conftest import MATRIX, ROOT

STORE = ROOT / "tests" / "fixtures" / "upstream" / "metadata"


def name_of(component: str, pin: PypiPin, arch: str) -> str:
    return f"{canonicalize_name(pin.dist(component))}-{pin.version}-{arch}.json"


def vendored(store: Path = STORE) -> Reader:
    """The store as a reader: a pin's declared requirements, or None where none was vendored."""

    def read(stack: Stack, arch: str, component: str, pin: PypiPin) -> Declared | None:
        path = store / name_of(component, pin, arch)
        return Declared.from_json(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None

    return read


def wanted(loaded: LoadedMatrix) -> list[tuple[Stack, str, str, PypiPin]]:
    """Every (stack, arch, component, pin) of the matrix, once per file name."""
    seen: dict[str, tuple[Stack, str, str, PypiPin]] = {}
    for stack in loaded.matrix.stacks.values():
        for arch in stack.arches:
            for component, pin in stack.pins().items():
                seen.setdefault(name_of(component, pin, arch), (stack, arch, component, pin))
    return [seen[name] for name in sorted(seen)]


def from_index(loaded: LoadedMatrix, cache: Path) -> Reader:
    urls = {name: index.url for name, index in loaded.matrix.indexes.items()}
    return index_reader(MetadataReader(IndexClient(timeout=20.0), cache=cache), urls)


def vendor(cache: Path) -> int:
    loaded = load_matrix(MATRIX)
    read = from_index(loaded, cache)
    fresh = STORE.with_name("metadata.new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    missing = []
    for stack, arch, component, pin in wanted(loaded):
        found = read(stack, arch, component, pin)
        if found is None:
            missing.append(name_of(component, pin, arch))
            continue
        (fresh / name_of(component, pin, arch)).write_text(json.dumps(found.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(STORE, ignore_errors=True)
    fresh.rename(STORE)
    print(f"vendored {len(list(STORE.iterdir()))} files to {STORE.relative_to(ROOT)}; not readable here: {', '.join(missing) or 'none'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["vendor"]:
        print("usage: python -m tests.harness.upstream_metadata vendor", file=sys.stderr)
        sys.exit(2)
    sys.exit(vendor(Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/ascendkit-metadata-cache")))
