"""Every pin meets what the others declare they require (buildkit/lock/agreement.py), read from what
the index publishes (buildkit/lock/metadata.py): checked offline for every shipped stack from the
vendored metadata, and against the index in the network job."""

from __future__ import annotations

import functools
import http.server
import io
import json
import random
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from buildkit.lock import relock
from buildkit.lock.agreement import check_stack, disagreements, environment
from buildkit.lock.availability import COMPONENT_AGREE, check_agreement
from buildkit.lock.index import DistFile, IndexClient
from buildkit.lock.inputs import LockFailed, LockTarget
from buildkit.lock.metadata import Declared, MetadataReader, MetadataUnavailable, parse_metadata
from buildkit.matrix.load import LoadedMatrix, parse_matrix
from buildkit.matrix.model import Stack
from tests.conftest import MATRIX, MATRIX_TEXT
from tests.harness.localhttp import serving
from tests.harness.upstream_metadata import STORE, from_index, name_of, vendored, wanted

READ = vendored()
UNFIXED_CANN91 = "vllm-ascend 0.23.0.post1 requires transformers==5.5.4, and the stack pins transformers 5.10.4"


def _without_cann91_override(text: str) -> str:
    """The matrix as it was before cann9.1 stated its override: the conflict the lock never saw."""
    start = text.index("  cann9.1:\n")
    block = text.index("    overrides:\n", start)
    end = text.index('      transformers: "==5.10.4"\n', block) + len('      transformers: "==5.10.4"\n')
    return text[:block] + text[end:]


def test_every_shipped_stack_meets_its_pins_requirements_offline(loaded: LoadedMatrix) -> None:
    for stack_id, stack in loaded.matrix.stacks.items():
        for arch in stack.arches:
            found, unused, unread = check_stack(stack_id, stack, arch, functools.partial(READ, stack, arch))
            assert [d.message() for d in found if not d.overridden] == [], (stack_id, arch)
            assert unused == [], (stack_id, arch)
            off_pypi = sorted(f"{p.dist(c)}=={p.version}" for c, p in stack.pins().items() if p.index_for(arch) != "pypi")
            assert sorted(unread) == off_pypi, "every pin on PyPI is vendored; the others' indexes are out of reach here"


def test_the_conflict_the_unresolvable_lock_hid_is_found(loaded: LoadedMatrix) -> None:
    unfixed = parse_matrix(_without_cann91_override(MATRIX_TEXT), MATRIX)
    rows, warnings = check_agreement(unfixed, READ, stacks=["cann9.1"])
    assert [(r.arch, r.finding, r.detail) for r in rows] == [
        ("aarch64", "conflict", UNFIXED_CANN91),
        ("x86_64", "conflict", UNFIXED_CANN91),
    ]
    assert all(r.component == COMPONENT_AGREE and r.check.status == "error" for r in rows) and warnings == []
    fixed, _ = check_agreement(loaded, READ, stacks=["cann9.1"])
    assert [r.finding for r in fixed] == ["unverified", "unverified"], "agreed where read; triton-ascend's index is out of reach"
    assert "triton-ascend==3.2.2" in fixed[0].detail


def _stack(loaded: LoadedMatrix, **changes: object) -> Stack:
    return loaded.matrix.stacks["cann8.3"].model_copy(update=changes)


def _declared(dist: str, version: str, *requires: str) -> Declared:
    return Declared(dist, version, requires, None, f"{dist}-{version}.whl")


def test_markers_extras_and_local_builds_are_read_as_the_target_would(loaded: LoadedMatrix) -> None:
    stack = _stack(loaded, overrides={})
    declared = {
        "vllm": _declared(
            "vllm",
            "0.11.0",
            'transformers<4; platform_machine == "x86_64"',  # only on x86_64
            'transformers<4; python_version < "3.10"',  # never on the stack's 3.11
            'transformers<4; extra == "audio"',  # an extra nobody asks for
            "torch==2.7.1+cpu",  # a local build: the CPU index serves 2.7.1 as 2.7.1+cpu
            "torchvision>=99",  # a plain conflict
            "vllm>=0",  # itself
        )
    }
    assert [(d.required, d.requirement) for d in disagreements("s", stack, "aarch64", declared)] == [("torchvision", "torchvision>=99")]
    on_x86 = [d.requirement for d in disagreements("s", stack, "x86_64", declared)]
    assert on_x86 == ['transformers<4; platform_machine == "x86_64"', "torchvision>=99"]
    assert environment("3.11", "aarch64")["python_full_version"] == "3.11.0", "the stack's, never this host's"


def test_an_override_covers_a_disagreement_and_one_that_covers_none_is_named(loaded: LoadedMatrix) -> None:
    declared = {"vllm-ascend": _declared("vllm-ascend", "0.11.0", "transformers<=4.57.1")}
    stack = _stack(loaded)  # overrides transformers
    (found,) = disagreements("s", stack, "aarch64", declared)
    assert found.overridden and found.message().endswith("(overridden by the stack: the later pin wins)")
    every = {c: _declared(p.dist(c), p.version) for c, p in stack.pins().items()}
    quiet, unused, unread = check_stack("s", stack, "aarch64", lambda c, p: every[c])
    assert (quiet, unused, unread) == ([], ["transformers"], []), "nothing needs the override any more"
    _, unknown, unread = check_stack("s", stack, "aarch64", lambda c, p: every[c] if c != "torch" else None)
    assert unknown == [] and unread == ["torch==2.7.1"], "an unread pin may be the one that needs it: no warning"


def test_core_metadata_headers_are_read() -> None:
    text = (
        "Metadata-Version: 2.1\nName: x\nVersion: 1\nRequires-Python: >=3.10\nRequires-Dist: a>=1\nRequires-Dist: b; extra == 'c'\n\nbody"
    )
    assert parse_metadata(text, "x", "1", "x-1.whl", "ab") == Declared("x", "1", ("a>=1", "b; extra == 'c'"), ">=3.10", "x-1.whl", "ab")


class _RangeServer(http.server.BaseHTTPRequestHandler):
    """Serves one file, with or without HTTP ranges, counting what it sends."""

    body = b""
    ranges = True
    sent: list[int] = []  # noqa: RUF012  # the test's record, reset per test

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()

    def do_GET(self) -> None:
        wanted = self.headers.get("Range", "")
        if self.ranges and wanted.startswith("bytes="):
            start, end = (int(v) for v in wanted[6:].split("-"))
            part = self.body[start : end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.body)}")
        else:
            part = self.body
            self.send_response(200)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)
        self.sent.append(len(part))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def wheel_server() -> Iterator[tuple[str, type[_RangeServer]]]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("big/payload.bin", random.Random(0).randbytes(6_000_000), zipfile.ZIP_STORED)  # a torch-sized member, scaled down
        wheel.writestr("big-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: big\nVersion: 1.0\nRequires-Dist: torch==2.7.1\n")
    handler = type("Handler", (_RangeServer,), {"body": buffer.getvalue(), "sent": []})
    with serving(handler) as url:
        yield f"{url}/big-1.0-py3-none-any.whl", handler


def test_a_wheels_metadata_is_read_by_ranges_not_downloaded_whole(wheel_server: tuple[str, type[_RangeServer]], tmp_path: Path) -> None:
    url, handler = wheel_server
    wheel = DistFile("big-1.0-py3-none-any.whl", Version("1.0"), "wheel", frozenset(), None, False, url, "00" * 32)
    text = MetadataReader(IndexClient(), cache=tmp_path)._wheel_metadata(wheel)
    assert "Requires-Dist: torch==2.7.1" in text
    assert sum(handler.sent) < len(handler.body) // 10, f"{sum(handler.sent)} of {len(handler.body)} bytes fetched"
    handler.ranges = False  # a server that ignores Range: refused, not downloaded whole by accident
    with pytest.raises(MetadataUnavailable, match="answered a range request with HTTP 200"):
        MetadataReader(IndexClient(), cache=tmp_path)._wheel_metadata(wheel)


@pytest.mark.network
def test_the_vendored_metadata_is_the_indexs(loaded: LoadedMatrix, tmp_path: Path) -> None:
    """Every vendored file is what the index publishes now; every pin the index serves is vendored."""
    read = from_index(loaded, tmp_path)
    on_index = {}
    for stack, arch, component, pin in wanted(loaded):
        found = read(stack, arch, component, pin)
        if found is not None:
            on_index[name_of(component, pin, arch)] = found.to_json()
    stored = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in STORE.iterdir()}
    assert set(stored) <= set(on_index) or not on_index, "a vendored pin the index no longer serves"
    for name, data in stored.items():
        if name in on_index:
            assert data == on_index[name], f"{name}: run `python -m tests.harness.upstream_metadata vendor`"


def test_the_store_has_no_stale_files(loaded: LoadedMatrix) -> None:
    names = {name_of(component, pin, arch) for _, arch, component, pin in wanted(loaded)}
    stale = {p.name for p in STORE.iterdir()} - names
    assert not stale, f"vendored files no pin of the matrix reads: {sorted(stale)}; run `python -m tests.harness.upstream_metadata vendor`"


def test_lock_names_a_disagreement_before_it_asks_the_resolver(monkeypatch: pytest.MonkeyPatch, loaded: LoadedMatrix) -> None:
    unfixed = parse_matrix(_without_cann91_override(MATRIX_TEXT), MATRIX)
    monkeypatch.setattr(relock, "index_reader", lambda metadata, urls: READ)
    with pytest.raises(LockFailed, match=f"the pins disagree, so the resolver was not asked: {re.escape(UNFIXED_CANN91)}"):
        relock._check_agreement(unfixed, LockTarget("cann9.1", "aarch64"), MetadataReader(IndexClient()), {})
    relock._check_agreement(loaded, LockTarget("cann9.1", "aarch64"), MetadataReader(IndexClient()), {})  # fixed: nothing to say
