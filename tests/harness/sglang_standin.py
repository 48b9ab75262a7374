"""The test stack's SGLang and sgl-kernel-npu (teststack-sglang), built here byte for byte the same
every time, so the test matrix can pin their hashes:

- an sdist ``ak-sglang-standin`` whose own ``pyproject.toml`` is the CUDA build (a module
  ``ak_sglang_cuda`` and a requirement no index has) and whose ``pyproject_npu.toml`` is the NPU
  build (module ``ak_sglang_npu``, requiring ``six``): an image with ``ak_sglang_npu`` and without
  ``ak_sglang_cuda`` was built with the project file the matrix names;
- two small pure wheels in a release archive per chip and arch, as sgl-kernel-npu publishes them.

They are served from one directory by a static HTTP server: a PEP 503 simple index (``/simple/``,
the test matrix's ``ascend`` index redirected with ``--ascend-index-url``) and the release assets
(``/<repo path>/releases/download/<release>/``, its GitHub redirected with ``--github-url``).

    python -m tests.harness.sglang_standin serve   # serve it on 127.0.0.1 (for `ascendkit lock` of the test matrix)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import tarfile
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

from tests.harness.gitserver import serving

SDIST = "ak_sglang_standin-0.5.10.tar.gz"
DIST = "ak-sglang-standin"
WHEELS = ("ak_kernel_memory_saver", "ak_kernel_ops")  # the test matrix's sgl_kernel_npu.wheels, installed in this order
RELEASE_DIR = "ascendkit-standin/sgl-kernel-npu/releases/download/2026.02.01"  # repo path + release of the test matrix
ARCHIVE = "sgl-kernel-npu-standin-{chip}-{arch}.zip"
CHIPS = ("910b", "a3")
EPOCH = (2026, 1, 1, 0, 0, 0)
UPLOADED = "2026-01-01T00:00:00Z"  # before the tests' --exclude-newer
INDEX_PAGE = "index.json"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"

CUDA_PROJECT = """[build-system]
requires = ["setuptools>=61.0"]
build-backend = "setuptools.build_meta"

[project]
name = "ak-sglang-standin"
version = "0.5.10"
dependencies = ["ak-cuda-only-kernel-that-no-index-has==1"]

[tool.setuptools]
py-modules = ["ak_sglang_cuda"]
"""

NPU_PROJECT = """[build-system]
requires = ["setuptools>=61.0"]
build-backend = "setuptools.build_meta"

[project]
name = "ak-sglang-standin"
version = "0.5.10"
dependencies = ["six"]

[project.optional-dependencies]
srt_npu = []
diffusion = ["ak-never-installed"]

[tool.setuptools]
py-modules = ["ak_sglang_npu"]
"""


def _tar_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 1767225600, 0o644, "root", "root"
    archive.addfile(info, io.BytesIO(data))


def sdist_bytes() -> bytes:
    top = SDIST.removesuffix(".tar.gz")
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.5.10\n",
        "pyproject.toml": CUDA_PROJECT,
        "pyproject_npu.toml": NPU_PROJECT,
        "ak_sglang_cuda.py": "ENGINE = 'cuda'\n",
        "ak_sglang_npu.py": "ENGINE = 'npu'\n",
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, text in files.items():
            _tar_member(archive, f"{top}/{name}", text.encode())
    return gzip.compress(raw.getvalue(), mtime=0)


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:  # stored: the same bytes from any zlib
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, EPOCH), data)
    return out.getvalue()


def wheel_bytes(dist: str, version: str = "1.0") -> bytes:
    """A pure wheel of ``dist`` holding one package of the same name."""
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": b"STANDIN = True\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: ascendkit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}" for n, d in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    return _zip(files)


def archive_bytes(chip: str, arch: str) -> bytes:
    """One chip's and arch's release archive: the wheels in a folder, as the real zips hold them."""
    return _zip({f"wheels-{chip}-{arch}/{d}-1.0-py3-none-any.whl": wheel_bytes(d) for d in WHEELS})


def archive_sha256(chip: str, arch: str) -> str:
    return hashlib.sha256(archive_bytes(chip, arch)).hexdigest()


def populate(root: Path) -> Path:
    """Write the index and the release assets under ``root``; returns it."""
    data = sdist_bytes()
    project = root / "simple" / DIST
    project.mkdir(parents=True, exist_ok=True)
    (project / SDIST).write_bytes(data)
    # PEP 691 JSON with PEP 700's upload-time, so a lock made with --exclude-newer sees the file
    page = {
        "meta": {"api-version": "1.1"},
        "name": DIST,
        "versions": ["0.5.10"],
        "files": [{"filename": SDIST, "url": SDIST, "hashes": {"sha256": hashlib.sha256(data).hexdigest()}, "upload-time": UPLOADED}],
    }
    (project / INDEX_PAGE).write_text(json.dumps(page))
    listing = {"meta": {"api-version": "1.1"}, "projects": [{"name": DIST}]}
    (root / "simple" / INDEX_PAGE).write_text(json.dumps(listing))
    release = root / RELEASE_DIR
    release.mkdir(parents=True, exist_ok=True)
    for chip in CHIPS:
        for arch in ("x86_64", "aarch64"):
            (release / ARCHIVE.format(chip=chip, arch=arch)).write_bytes(archive_bytes(chip, arch))
    return root


class _Quiet(SimpleHTTPRequestHandler):
    """Static files; a directory of the index answers with its JSON page."""

    def translate_path(self, path: str) -> str:
        local = super().translate_path(path)
        return str(Path(local) / INDEX_PAGE) if (Path(local) / INDEX_PAGE).is_file() else local

    def guess_type(self, path: str | os.PathLike[str]) -> str:
        return JSON_TYPE if str(path).endswith(INDEX_PAGE) else super().guess_type(path)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(root: Path, host: str = "127.0.0.1", port: int = 0) -> contextlib.AbstractContextManager[str]:
    """Serve ``root`` (after :func:`populate`); the context yields the base URL."""
    return serving(functools.partial(_Quiet, directory=str(root)), host, port)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.sglang_standin")
    parser.add_argument("command", choices=["serve", "sha256"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ascendkit-sglang-standin"))
    args = parser.parse_args()
    if args.command == "sha256":
        for chip in CHIPS:
            for arch in ("x86_64", "aarch64"):
                print(f"{ARCHIVE.format(chip=chip, arch=arch)}: {archive_sha256(chip, arch)}")
        return
    with serve(populate(args.dir)) as url:
        print(f"{url}/simple  (--ascend-index-url), {url} (--github-url); Ctrl-C stops", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
