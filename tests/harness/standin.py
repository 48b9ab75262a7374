"""The stand-in CANN base image the integration tests build on, for amd64 and arm64.

The real CANN base cannot be pulled on these machines. The stand-in is Debian 12 with Python 3.11, the
packages the template's system step installs, and a clearly labelled placeholder of the CANN layout
(set_env.sh scripts, a version file, no CANN binaries), made with debootstrap and left without what
SLIMMED names. It is kept as a `docker save` archive in the services' state directory and loaded into
every engine that lacks its current version (tests/harness/services.py starts the engines).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from docker.errors import NotFound
from zlib_ng import gzip_ng

from buildkit.fsio import sha256_of
from tests.harness import debian_packages

Log = Callable[[str], None]

STANDIN_REPO = "ascendkit-standin/cann"
# The tag the test matrix's base-image grammar gives (cann 8.3.RC1, chip a3, debian12, py3.11).
STANDIN_TAGS = {"amd64": "8.3.rc1-a3-debian12-py3.11", "arm64": "8.3.rc1-a3-debian12-py3.11-arm64"}
STANDIN_REF = {arch: f"{STANDIN_REPO}:{tag}" for arch, tag in STANDIN_TAGS.items()}
STANDIN_VERSION = "10"  # bump when the stand-in's contents change (9: arm64 unpacked natively; 10: SLIMMED left out)
DEBIAN_MIRROR = os.environ.get("ASCENDKIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the template's system step installs, preinstalled so that the step is quick (most come with
# the real CANN base too), and so that the arm64 layers test, which does not run the step, has
# libsndfile1 for main_ppo's imports. python3-dev: the CANN images' Python comes with its headers,
# which compiled extensions need (the vllm stand-in's C speedups, as vllm-ascend's custom ops).
STANDIN_PACKAGES = "ca-certificates,python3,python3-dev,python3-pip,git,gcc,g++,make,cmake,libnuma-dev,libsndfile1"


# What the stand-in leaves out of its packages, as slim bases do: nothing any build or test here reads, runs or
# links. Documentation, manual pages and message catalogues; GCC's LTO dump tool; the sanitizers' runtimes
# (only `-fsanitize` loads them); Python's static libraries (extensions link the shared one). A quarter of the
# root's bytes and of its files (668 MB and 21911 entries before), and every job pays for each: each engine
# loads the base, each publish reads it from the engine and compresses it, and on the containerd store every
# step of a classic build compares the whole root filesystem before and after.
SLIMMED = (
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*", "usr/bin/*lto-dump*",
    "usr/lib/*-linux-gnu/lib*san.so*", "usr/lib/gcc/*/*/lib*san*", "usr/lib/python3*/config-*/libpython3*.a",
    "usr/lib/*-linux-gnu/libpython3*.a",
)  # fmt: skip


SET_ENV = """\
# STAND-IN for the CANN toolkit's set_env.sh (ascendkit CI): exports the variables, ships no CANN.
export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest
export ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}
export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
"""
ATB_SET_ENV = """\
# STAND-IN for NNAL/ATB's set_env.sh (ascendkit CI): honours --cxx_abi like the real one.
abi=1
for arg in "$@"; do case "$arg" in --cxx_abi=*) abi="${arg#--cxx_abi=}" ;; esac; done
export ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_${abi}
"""
README = """\
This is NOT CANN. It is the stand-in base image of ascendkit's CI: Debian 12 with Python 3.11 and
the directory layout, set_env.sh scripts and version file of a CANN 8.3.RC1 image, so that the
production Dockerfile template and build code can run where the official CANN images cannot be
pulled. It contains no Ascend software and cannot drive an NPU.
"""


def _add_standin_layout(root: Path, deb_arch: str) -> None:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[deb_arch]
    toolkit = root / "usr/local/Ascend/ascend-toolkit"
    version_dir = toolkit / "8.3.RC1"
    (version_dir / f"{machine}-linux").mkdir(parents=True, exist_ok=True)
    (version_dir / f"{machine}-linux/ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit (ascendkit CI stand-in, no CANN inside)\nversion=8.3.RC1\n"
    )
    (version_dir / "STANDIN-README.txt").write_text(README)
    latest = toolkit / "latest"
    if not latest.is_symlink():
        latest.symlink_to("8.3.RC1")
    (toolkit / "set_env.sh").write_text(SET_ENV)
    atb = root / "usr/local/Ascend/nnal/atb"
    atb.mkdir(parents=True, exist_ok=True)
    (atb / "set_env.sh").write_text(ATB_SET_ENV)
    # CANN images ship their own Python install; Debian marks its system Python as externally managed.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    # debootstrap leaves its downloaded packages and indexes behind; a published base would not.
    for leftover in [*root.glob("var/cache/apt/archives/*.deb"), *root.glob("var/lib/apt/lists/*_*")]:
        leftover.unlink()


def _current(client: docker.APIClient, ref: str) -> bool:
    try:
        labels = client.inspect_image(ref)["Config"].get("Labels") or {}
    except NotFound:
        return False
    return labels.get("io.ascendkit.standin.version") == STANDIN_VERSION


def _standin_archive(ref: str, deb_arch: str, having: list[docker.APIClient], state: Path, log: Log) -> Path:
    """The stand-in in `docker save` format, kept in ``state`` for every engine that lacks it: saved from
    an engine ``having`` it, else made with debootstrap (older versions' archives are removed)."""
    image = state / f"standin-{deb_arch}-v{STANDIN_VERSION}.tar"
    if image.exists():
        return image
    for stale in state.glob(f"standin-{deb_arch}-v*.tar"):
        stale.unlink()
    if having:
        partial = image.with_suffix(".partial")
        with partial.open("wb") as out:
            for chunk in having[0].get_image(ref):
                out.write(chunk)
        partial.rename(image)
        return image
    log(f"building the stand-in base {ref} with debootstrap ({deb_arch})")
    with tempfile.TemporaryDirectory(prefix="ascendkit-standin-", dir=state) as tmp:
        root = Path(tmp) / "rootfs"
        debootstrap(root, deb_arch, state / f"debootstrap-{deb_arch}.log")
        slim(root)
        _add_standin_layout(root, deb_arch)
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            tar.add(root, arcname=".")
        diff_id = f"sha256:{sha256_of(layer)}"
        compressed = gzip_layer(layer)
        # Written in `docker save` format and loaded, rather than `docker import`ed: import records
        # the engine's own architecture (an arm64 rootfs would claim amd64) and this engine
        # ignores import's platform; a loaded image keeps the config exactly as written.
        config = {
            "architecture": deb_arch,
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
                "Cmd": ["/bin/bash"],
                "Labels": {
                    "io.ascendkit.standin": "true",
                    "io.ascendkit.standin.version": STANDIN_VERSION,
                    "org.opencontainers.image.description": "STAND-IN for a CANN 8.3.RC1 base: Debian 12 + Python 3.11, no CANN inside",
                },
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "ascendkit CI stand-in: debootstrap bookworm + placeholder CANN layout"}],
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
        manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer/layer.tar.gz"]}]).encode()
        partial = Path(tmp) / "image.tar"
        with tarfile.open(partial, "w") as tar:
            for name, body in (("manifest.json", manifest), (config_name, config_bytes)):
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            tar.add(compressed, arcname="layer/layer.tar.gz")
        partial.rename(image)  # whole or not at all
    return image


def debootstrap(root: Path, deb_arch: str, transcript: Path) -> None:
    """Debian 12 with STANDIN_PACKAGES in ``root``, for ``deb_arch``. For an architecture not the host's,
    debootstrap's second stage does not run in the root: there its dpkg, under qemu, would decompress and
    unpack every package. The host's dpkg unpacks the packages the first stage downloaded, natively, and
    configures them; only their maintainer scripts run in the root under qemu. An arm64 root took 247 s
    here, idle, with the second stage (217 s of it), and 143 s this way. The two roots were compared:
    the same files (but the second stage's own logs), /etc the same, every package ``install ok installed``."""
    foreign = deb_arch != debian_packages.DEB_ARCH
    with transcript.open("wb") as out:

        def step(*argv: str) -> None:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                sys.exit(f"[services] {argv[0]} ({deb_arch}) failed:\n{transcript.read_text(errors='replace')[-3000:]}")

        step("debootstrap", "--variant=minbase", f"--arch={deb_arch}", f"--include={STANDIN_PACKAGES}", *(["--foreign"] if foreign else []),
             "bookworm", str(root), DEBIAN_MIRROR)  # fmt: skip
        if not foreign:
            return
        dpkg = ["dpkg", f"--root={root}", "--force-architecture", "--force-depends"]
        debs = sorted(str(deb) for deb in (root / "var/cache/apt/archives").glob("*.deb"))
        # --force-overwrite: the first stage extracted the essential packages' files, which no package owns yet
        step(*dpkg, "--force-overwrite", "--unpack", *debs)
        step(*dpkg, "--configure", "-a")
    shutil.rmtree(root / "debootstrap")  # the first stage's scripts and lists, which the second stage removes
    proc = root / "proc"
    if proc.is_symlink():  # the first stage's stand-in for a mounted /proc; an image has an empty directory there
        proc.unlink()
        proc.mkdir()


def slim(root: Path) -> None:
    """``root`` without what SLIMMED names (the directories themselves stay, as dpkg made them)."""
    for pattern in SLIMMED:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def gzip_layer(layer: Path) -> Path:
    """``layer`` gzip-compressed beside it, the tar itself removed (level 1: it is made on every fresh machine,
    before any docker job starts). A base pulled from a registry, as users' CANN base is, sits compressed in the containerd image store,
    and so does this one once loaded: every `docker save` of an image on it (each publish reads one) then streams
    the compressed base rather than its tar, and the engine's CPU goes with the bytes (on Docker 26.1.5's
    containerd store, measured before the stand-in was slimmed, 326 MB against 707 MB: 10.3 core-seconds to
    save it stored compressed, 22.8 stored as a tar).
    Engines on a graph driver decompress it as they load it."""
    out = layer.with_suffix(".tar.gz")
    with layer.open("rb") as source, out.open("wb") as raw:
        gz = gzip_ng.GzipNGFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0)  # type: ignore[no-untyped-call]  # gzip.GzipFile's
        with gz:
            shutil.copyfileobj(source, gz, 1 << 20)
    layer.unlink()
    return out


def build_standin(clients: list[docker.APIClient], deb_arch: str, state: Path, log: Log) -> str:
    """The stand-in for ``deb_arch`` in each engine of ``clients``, its archive kept in ``state``; its reference."""
    ref = STANDIN_REF[deb_arch]
    missing = [client for client in clients if not _current(client, ref)]
    if missing:
        archive = _standin_archive(ref, deb_arch, [client for client in clients if client not in missing], state, log)
        log(f"loading {ref} into {len(missing)} engine(s)")

        def load(client: docker.APIClient) -> None:
            with archive.open("rb") as data:
                client.load_image(data)
            if client.inspect_image(ref)["Architecture"] != deb_arch:
                sys.exit(f"[services] {ref} was loaded with the wrong architecture")

        # Two at a time: a load is one engine's work (it decompresses and unpacks the layer), and one after
        # another into five engines took 147 s of the services job, which every docker job waits for.
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(load, missing))
        log(f"loaded {ref}")
    return ref
