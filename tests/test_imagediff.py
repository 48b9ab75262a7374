"""Two published images compared as diffoci compares them: a planted difference (a changed file, a
changed mode, a file on one side only, a clamped and an unclamped time) is named with its layer and
what differs; the same image is said to be the same; `ascendkit diff` exits 0 or 1 as documented."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.ship.imagediff import diff_images, read_published
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


def push(host: str, repository: str, layers: list[bytes], created: str = "2025-01-01T00:00:00Z") -> str:
    registry = Registry(host)
    blobs = [gzip.compress(x, mtime=0) for x in layers]
    diff_ids = [digest(x) for x in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": created, "rootfs": {"type": "layers", "diff_ids": diff_ids}})
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
        assert "layer 2: usr/lib/b.so: mtime: 1735689600 != 1735689660" in lines

        runner = CliRunner()
        same = runner.invoke(app, ["diff", f"{host}/rebuild/a@{first}", f"{host}/rebuild/a@{first}"])
        assert same.exit_code == 0 and f"the same image: {first}" in same.output, same.output
        differs = runner.invoke(app, ["diff", f"{host}/rebuild/a@{first}", f"{host}/rebuild/b@{second}", "--json"])
        assert differs.exit_code == 1, differs.output
        report = json.loads(differs.output)
        assert (
            report["same"] is False and {"layer": 2, "path": "usr/lib/a.py", "what": "only in A", "a": "", "b": ""} in report["differences"]
        )


def test_an_image_that_is_not_in_a_registry_is_refused_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["diff", "ascendkit/verl:local", "ascendkit/verl:other"])
    assert result.exit_code == 2 and "not a registry reference" in result.output
