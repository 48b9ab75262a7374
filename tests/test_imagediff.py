"""Two published images compared as diffoci compares them: a planted difference (a changed file, a
changed mode, a file on one side only, a clamped and an unclamped time) is named with its layer and
what differs; the same image is said to be the same; `ascendkit diff` exits 0 or 1 as documented."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import uuid
from pathlib import Path

from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.ship.imagediff import diff_images, read_published, report_lines
from buildkit.ship.oci.registry import Registry
from tests.harness.fake_registry import fake_registry
from tests.harness.saved_layouts import digest

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def layer(files: dict[str, tuple[bytes, int, int]]) -> bytes:
    """A tar of name -> (bytes, mode, mtime)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode, mtime) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


BASE = layer({"etc/os-release": (b"ID=debian\n", 0o644, 100)})
TOP = {"usr/lib/a.py": (b"print('a')\n", 0o644, 1735689600), "usr/lib/b.so": (b"\x7fELF" + b"\0" * 99, 0o755, 1735689600)}


def push(host: str, repository: str, layers: list[bytes], created: str = "2025-01-01T00:00:00Z", steps: list[str] | None = None) -> str:
    registry = Registry(host)
    blobs = [gzip.compress(x, mtime=0) for x in layers]
    diff_ids = [digest(x) for x in layers]
    image: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if steps is not None:
        image["history"] = [{"created_by": step} for step in steps]
    config = json.dumps(image)
    for body in [config.encode(), *blobs]:
        registry.put_blob(repository, body)
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": digest(config.encode()), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": digest(b), "size": len(b)} for b in blobs],
    }
    body = json.dumps(manifest).encode()
    return registry.put_manifest(repository, digest(body), body, DOCKER_MANIFEST)


def test_a_planted_difference_is_named_with_its_layer_and_what_differs() -> None:
    changed = dict(TOP) | {"usr/lib/b.so": (b"\x7fELF" + b"\1" * 99, 0o700, 1735689600 + 60), "usr/lib/new.py": (b"", 0o644, 0)}
    del changed["usr/lib/a.py"]
    with fake_registry(referrers=False) as (host, _store):
        first = push(host, "rebuild/a", [BASE, layer(TOP)])
        second = push(host, "rebuild/b", [BASE, layer(changed)], created="2026-11-27T10:00:00Z")
        found = diff_images(read_published(f"{host}/rebuild/a@{first}", "x86_64"), read_published(f"{host}/rebuild/b@{second}", "x86_64"))
        lines = [d.line() for d in found]
        assert 'config: created: differs: "2025-01-01T00:00:00Z" != "2026-11-27T10:00:00Z"' in lines
        assert [(d.layer, d.path, d.what) for d in found if d.layer > 0] == [
            (2, "usr/lib/a.py", "only in A"),
            (2, "usr/lib/b.so", "content"),
            (2, "usr/lib/b.so", "mode"),
            (2, "usr/lib/b.so", "mtime"),
            (2, "usr/lib/new.py", "only in B"),
        ], "layer 1 (the same base) is not read; layer 2 is, file by file"
        assert "layer 2: usr/lib/b.so: mtime: 1735689600 != 1735689660" in lines, "a file that changed: its time too, in full"

        runner = CliRunner()
        same = runner.invoke(app, ["diff", f"{host}/rebuild/a@{first}", f"{host}/rebuild/a@{first}"])
        assert same.exit_code == 0 and f"the same image: {first}" in same.output, same.output
        differs = runner.invoke(app, ["diff", f"{host}/rebuild/a@{first}", f"{host}/rebuild/b@{second}", "--json"])
        assert differs.exit_code == 1, differs.output
        report = json.loads(differs.output)
        only_a = next(d for d in report["differences"] if d["path"] == "usr/lib/a.py")
        assert report["same"] is False and (only_a["layer"], only_a["what"], only_a["side"]) == (2, "only in A", "")
        assert only_a["a"].startswith("file, 0o644, 0:0, 11 bytes") and only_a["normalization"] is False


def test_an_image_that_is_not_in_a_registry_is_refused_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["diff", "ascendkit/verl:local", "ascendkit/verl:other"])
    assert result.exit_code == 2 and "not a registry reference" in result.output


def tar_of(entries: list[tuple[str, bytes, int]]) -> bytes:
    """A tar of (name, bytes, mtime), files 0644, in the order given (whiteouts are empty files)."""
    return layer({name: (data, 0o644, mtime) for name, data, mtime in entries})


def planted_layer_cases(host: str) -> None:
    """A layer added on top, a file removed in an added layer (a whiteout), a file changed inside a layer both have,
    a layer inserted below the top, a layer dropped, and lower layers that differ only in their times: each named with
    its layer, what changed listed first, the times counted per layer (and listed with --all). Pushed to ``host``."""
    run = uuid.uuid4().hex[:6]
    base = [
        tar_of([("etc/os-release", b"ID=debian\n", 100)]),
        tar_of([("opt/app/run.py", b"print(1)\n", 100), ("opt/app/old.py", b"x", 100)]),
    ]
    steps = ["FROM debian", "COPY app /opt/app"]
    touched = [
        tar_of([("etc/os-release", b"ID=debian\n", 999)]),
        tar_of([("opt/app/run.py", b"print(1)\n", 999), ("opt/app/old.py", b"x", 999)]),
    ]
    on_top = tar_of([("etc/added", b"hello\n", 5), ("opt/app/.wh.old.py", b"", 5)])
    original = push(host, f"hand-{run}/a", base, steps=steps)
    copy = push(host, f"hand-{run}/b", [*touched, on_top], steps=[*steps, "RUN echo hello > /etc/added && rm /opt/app/old.py"])
    found = diff_images(
        read_published(f"{host}/hand-{run}/a@{original}", "x86_64"), read_published(f"{host}/hand-{run}/b@{copy}", "x86_64")
    )
    changed = [(d.layer, d.side, d.path, d.what) for d in found if not d.normalization and d.layer > 0]
    assert changed == [
        (3, "B", "", "a layer only B has (added to A)"),
        (3, "B", "etc/added", "added in B"),
        (3, "B", "opt/app/old.py", "removed (whiteout) in B"),
    ]
    assert next(d for d in found if d.side == "B").created_by.startswith("RUN echo hello"), "the step that made it"
    lines = report_lines(found)
    assert lines.index("layer 3 of B: a layer only B has (added to A): RUN echo hello > /etc/added && rm /opt/app/old.py") < lines.index(
        "layer 1: 1 file(s) differ only in their times (normalization; --all lists them)"
    ), "what changed comes before what is only normalization"
    assert "layer 2: 2 file(s) differ only in their times (normalization; --all lists them)" in lines
    assert "layer 2: opt/app/run.py: mtime: 100 != 999" in report_lines(found, full=True) and not any("mtime" in x for x in lines)

    # a file changed inside a layer both have, and a layer inserted below the top
    changed_inside = tar_of([("opt/app/run.py", b"print(2)\n", 100), ("opt/app/old.py", b"x", 100)])
    inserted = tar_of([("usr/lib/extra.so", b"\x7fELF", 7)])
    other = push(host, f"hand-{run}/c", [base[0], inserted, changed_inside], steps=[steps[0], "RUN make extra", steps[1]])
    found = diff_images(
        read_published(f"{host}/hand-{run}/a@{original}", "x86_64"), read_published(f"{host}/hand-{run}/c@{other}", "x86_64")
    )
    assert [(d.layer, d.layer_b, d.side, d.path, d.what) for d in found if d.layer > 0] == [
        (2, 0, "B", "", "a layer only B has (added to A)"),
        (2, 0, "B", "usr/lib/extra.so", "added in B"),
        (2, 3, "", "opt/app/run.py", "content"),
    ], "the layer below the top is B's second; A's second layer is B's third, its changed file named"
    assert "layer 2 (B's 3): opt/app/run.py: content" in " ".join(report_lines(found))

    # a layer dropped from the middle, with no history at all: paired by DiffID
    bare = push(host, f"hand-{run}/d", [base[0], on_top])
    plain = push(host, f"hand-{run}/e", [base[0], base[1], on_top])
    found = diff_images(read_published(f"{host}/hand-{run}/e@{plain}", "x86_64"), read_published(f"{host}/hand-{run}/d@{bare}", "x86_64"))
    assert [(d.layer, d.side, d.path, d.what) for d in found if d.layer > 0][:3] == [
        (2, "A", "", "a layer only A has (B drops it)"),
        (2, "A", "opt/app/old.py", "added in A"),
        (2, "A", "opt/app/run.py", "added in A"),
    ]

    runner = CliRunner()
    result = runner.invoke(app, ["diff", f"{host}/hand-{run}/a@{original}", f"{host}/hand-{run}/b@{copy}", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 1 and {"layer": 2, "layer_b": 2, "files": 2, "other": []} in report["normalization"]
    assert any(d["path"] == "etc/added" and d["side"] == "B" and d["layer"] == 3 for d in report["differences"])
    text = " ".join(runner.invoke(app, ["diff", f"{host}/hand-{run}/a@{original}", f"{host}/hand-{run}/b@{copy}"]).output.split())
    assert "5 beyond normalization" in text and "etc/added: added in B" in text and "mtime" not in text, text
    assert (
        "layer 1: etc/os-release: mtime"
        in runner.invoke(app, ["diff", f"{host}/hand-{run}/a@{original}", f"{host}/hand-{run}/b@{copy}", "--all"]).output
    )


def test_layers_one_image_alone_has_are_named_file_by_file_wherever_they_are() -> None:
    with fake_registry(referrers=False) as (host, _store):
        planted_layer_cases(host)
