"""The vendored upstream files the contract tests read (tests/harness/upstream.py): intact, complete for the
shipped matrix, and (with the network) byte for byte what PyPI serves."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.harness.upstream import STORE, needed, source_of


def test_every_vendored_file_is_the_one_recorded_and_nothing_else_is_there() -> None:
    for where in sorted(p for p in STORE.iterdir() if p.is_dir()):
        source = json.loads((where / "SOURCE.json").read_text(encoding="utf-8"))
        assert where.name == f"{source['project']}-{source['version']}" and len(source["sha256"]) == 64
        on_disk = {p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file()} - {"SOURCE.json"}
        assert on_disk == set(source["files"]), where.name
        for name, sha256 in source["files"].items():
            assert hashlib.sha256((where / name).read_bytes()).hexdigest() == sha256, f"{where.name}/{name} was edited"


def test_the_store_holds_what_the_shipped_matrix_needs() -> None:
    """A pin that moves without `python -m tests.harness.upstream vendor` fails here, naming the command."""
    stored = {p.name for p in STORE.iterdir() if p.is_dir()}
    wanted = {f"{project}-{version}" for project, version in needed()}
    assert stored == wanted, "run `python -m tests.harness.upstream vendor` (needs PyPI) and commit tests/fixtures/upstream/pypi"


@pytest.mark.network
@pytest.mark.parametrize(("project", "version"), list(needed()))
def test_the_vendored_upstream_is_pypis_own(project: str, version: str) -> None:
    """Each artifact downloaded again (checked against the index's sha256): the vendored files are its own."""
    kind, patterns = needed()[(project, version)]
    source, files = source_of(project, version, kind, patterns)
    where = STORE / f"{project}-{version}"
    assert json.loads((where / "SOURCE.json").read_text(encoding="utf-8")) == source
    for name, data in files.items():
        assert (where / name).read_bytes() == data, name
