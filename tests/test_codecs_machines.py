"""A layer compresses to the same gzip and zstd bytes on every machine: this one (AVX-512 where the
CPU has it), qemu-user's Haswell (AVX2) and Nehalem (SSE4.2) models, and aarch64 under emulation.
So the same image published from two CI runners gets one digest.

ISA-L, the gzip of before, gave four streams of one layer on those four; zlib-ng's blocks
(buildkit/ship/layers/codecs.py) must give one. Each machine runs ``python -m buildkit.ship.layers.codecs`` on the
same file: the x86_64 models this interpreter under qemu-x86_64 with ``-cpu``, aarch64 the arm64
stand-in base's own Python 3.11 with the aarch64 wheels of zlib-ng and zstandard (PyPI), on the
emulated engine."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import ROOT, DockerEnv, arm64_standin

pytestmark = [pytest.mark.docker, pytest.mark.emulated]

QEMU_X86 = "qemu-x86_64-static"
CPU_MODELS = ("Haswell", "Nehalem")  # AVX2 without AVX-512; SSE4.2 without AVX


def _sample(path: Path) -> Path:
    """About 12 MiB shaped like a layer: this package's sources and bytecode-like text, pseudo-random
    bytes, a long run of zeros; many gzip blocks and more than one zstd job."""
    text = b"".join(p.read_bytes() for p in sorted((ROOT / "buildkit").rglob("*.py")))
    noise = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range((3 << 20) // 32))
    path.write_bytes((text * (1 + (8 << 20) // len(text)))[: 8 << 20] + noise + b"\0" * (1 << 20) + b"end")
    return path


def _digests(argv: list[str]) -> dict[str, str]:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}"
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("gzip ", "zstd ")))


def _arm64_site(dest: Path) -> Path:
    """zlib-ng's and zstandard's aarch64 wheels for CPython 3.11 (the versions installed here), unpacked."""
    wheels = dest / "wheels"
    pins = [f"zlib-ng=={version('zlib-ng')}", f"zstandard=={version('zstandard')}"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--platform", "manylinux2014_aarch64",
         "--python-version", "3.11", "--implementation", "cp", "-d", str(wheels), *pins],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    site = dest / "site"
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    package = site / "buildkit" / "ship" / "layers"  # the module alone: it needs nothing of ascendkit's
    package.mkdir(parents=True)
    for parent in (site / "buildkit", site / "buildkit" / "ship", package):
        (parent / "__init__.py").write_text("")
    shutil.copy2(ROOT / "buildkit" / "ship" / "layers" / "codecs.py", package / "codecs.py")
    return site


def test_every_machine_gives_the_same_gzip_and_zstd_bytes(docker_env: DockerEnv, tmp_path: Path) -> None:
    sample = _sample(tmp_path / "layer.tar")
    here = _digests([sys.executable, "-m", "buildkit.ship.layers.codecs", str(sample), "2"])
    assert set(here) == {"gzip", "zstd"}
    assert shutil.which(QEMU_X86), f"{QEMU_X86} is missing: `make test` installs qemu-user-static with ASCENDKIT_ARM64=1"
    seen = {"this machine": here}
    for model in CPU_MODELS:
        argv = [QEMU_X86, "-cpu", model, sys.executable, "-m", "buildkit.ship.layers.codecs", str(sample), "3"]
        seen[f"x86_64 -cpu {model}"] = _digests(argv)

    site = _arm64_site(tmp_path / "arm64")
    client = docker_env.client
    container = client.create_container(
        arm64_standin(),
        ["python3", "-m", "buildkit.ship.layers.codecs", "/mnt/sample/layer.tar", "1"],
        environment={"PYTHONPATH": "/mnt/site"},
        host_config=client.create_host_config(
            binds={str(site): {"bind": "/mnt/site", "mode": "ro"}, str(tmp_path): {"bind": "/mnt/sample", "mode": "ro"}}
        ),
    )  # fmt: skip
    try:
        client.start(container)
        status = client.wait(container, timeout=900)["StatusCode"]
        out = client.logs(container, stdout=True, stderr=True).decode()
        arch = client.inspect_image(arm64_standin())["Architecture"]
    finally:
        client.remove_container(container, force=True)
    assert arch == "arm64" and status == 0, out[-3000:]
    seen["aarch64 (emulated)"] = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("gzip ", "zstd ")))

    differing = {machine: digests for machine, digests in seen.items() if digests != here}
    assert not differing, f"this machine gave {here}; these gave other bytes: {differing}"
