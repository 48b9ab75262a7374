"""Which builder a build uses, and the BuildKit build itself, through the docker CLI's buildx.

docker-py speaks only the classic builder (POST /build; docker/docker-py#2230): BuildKit needs a
gRPC session beside the HTTP API (for the build context, secrets and the registry cache), which
buildx implements. So ascendkit runs ``buildx build`` as a subprocess against the same engine
(DOCKER_HOST), reads its solve status as JSON (:mod:`buildkit.image.solve`) and its result from
``--metadata-file``; docker-py stays the client for everything else (inspect, verify, tag, push).

buildx is found, in order: ``$ASCENDKIT_BUILDX`` (a ``docker-buildx`` binary, which runs on its
own), the docker CLI's plugin (``docker buildx``; the CLI is ``$ASCENDKIT_DOCKER_CLI`` or ``docker``
on PATH), ``docker-buildx`` on PATH.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from buildkit.errors import InputError, Unavailable
from buildkit.image.engine import CONTAINERD_STORE, PODMAN_STORE, EngineFacts

BUILDERS = ("auto", "buildkit", "classic")
BUILDKIT, CLASSIC = "buildkit", "classic"
MIN_BUILDX = (0, 12)  # --progress=rawjson came in buildx 0.12
INSTALL_HINT = (
    "install buildx (Debian/Ubuntu: apt install docker-buildx; Docker's packages: docker-buildx-plugin), "
    "or set ASCENDKIT_BUILDX to a docker-buildx binary"
)
# BuildKit v0.13 to v0.15 take a secret mount for a mount of the step's first input, its root filesystem
# (moby/buildkit#5251, fixed in v0.16; a regression of #4624, v0.13): before each RUN with a secret mount
# they read and hash every file of the step's root filesystem, again for each such step of a build that
# is not cached. Measured on Docker 26.1.5 (the containerd store), the test stack's clean build: 57-61 -> 16-35
# core-seconds of the machine's CPU without the secret mounts (dockerd 34-38 -> 3-13); a 20 GB image: 20 GB read per step.
# Where buildx does not say the BuildKit version (Debian's buildx says v0.0.0+unknown), the engine's
# version says which BuildKit the docker driver runs: taken as v0.13 to v0.15 for Docker 26.0 to 27.2 (27.3: v0.16).
CHECKSUMMING_BUILDKIT = ((0, 13), (0, 16))
CHECKSUMMING_ENGINE = ((26, 0), (27, 3))


@dataclass(frozen=True)
class Builder:
    """The builder a build ran with, as its build manifest records it."""

    name: str  # BUILDKIT or CLASSIC
    version: str  # "buildx 0.13.1, BuildKit v0.13.2" or "Docker Engine 26.1.5"
    command: tuple[str, ...] = ()  # how buildx is run (BuildKit only)
    note: str = ""  # why auto chose the classic builder
    serves_secrets: bool = False  # BuildKit gets the render without secret mounts; secrets as the classic builder gets them

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version}


def _run(argv: list[str], timeout: int = 30) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=_environment())
    except (OSError, subprocess.SubprocessError):
        return None


def _environment() -> dict[str, str]:
    """buildx's environment: ours (DOCKER_HOST, and BUILDX_BUILDER where a user picked a builder),
    without a progress setting of its own (ours is on its command line)."""
    return {k: v for k, v in os.environ.items() if k != "BUILDKIT_PROGRESS"}


def _candidates() -> list[list[str]]:
    named = os.environ.get("ASCENDKIT_BUILDX")
    if named:
        return [[named]]
    found = []
    docker = os.environ.get("ASCENDKIT_DOCKER_CLI") or shutil.which("docker")
    if docker:
        found.append([docker, "buildx"])
    plugin = shutil.which("docker-buildx")
    if plugin:
        found.append([plugin])
    return found


@functools.cache
def find_buildx() -> tuple[tuple[str, ...], str] | str:
    """(the command that runs buildx, its version), or why there is none."""
    why = "no docker CLI with buildx and no docker-buildx on PATH"
    for command in _candidates():
        proc = _run([*command, "version"])
        if proc is None or proc.returncode != 0:
            said = proc.stderr.strip().splitlines()[-1] if proc and proc.stderr.strip() else ""
            why = f"`{' '.join(command)} version` failed" + (f": {said}" if said else "")
            continue
        match = re.search(r"\bv?(\d+)\.(\d+)\.(\d+)\S*", proc.stdout)
        if not match:
            why = f"`{' '.join(command)} version` said {proc.stdout.strip()!r}"
            continue
        if (int(match[1]), int(match[2])) < MIN_BUILDX:
            why = f"buildx {match[0].removeprefix('v')} is older than {'.'.join(map(str, MIN_BUILDX))}"
            continue
        return tuple(command), match[0].removeprefix("v")
    return why


@functools.cache
def _current_builder(command: tuple[str, ...]) -> tuple[str, str]:
    """The driver of buildx's current builder (``docker``: the engine's own BuildKit;
    ``docker-container``, ``kubernetes``, ``remote``) and the BuildKit it runs, as ``buildx inspect``
    says them ("" where it does not); asked once per process (``build --all`` builds many images)."""
    proc = _run([*command, "inspect", "--bootstrap"], timeout=120)
    text = proc.stdout if proc else ""
    driver = re.search(r"^Driver:\s*(\S+)", text, re.MULTILINE)
    version = re.search(r"^BuildKit(?: version)?:\s*(\S+)", text, re.MULTILINE | re.IGNORECASE)
    return (driver[1] if driver else ""), (version[1] if version else "")


def _major_minor(version: str) -> tuple[int, int] | None:
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found and found[0] != "0.0.0" else None


SECRETS_ENV = "ASCENDKIT_BUILDKIT_SECRETS"  # "mounts" or "served": overrides the choice below (a patched BuildKit)


def shares_the_engines_loopback() -> bool:
    """Whether the steps of a build on the engine's host network reach this process on 127.0.0.1: the
    engine answers on a local socket, and the process behind it is in this process's network namespace
    (not a remote engine, not one whose socket was mounted into this container, not rootless Docker's)."""
    host = os.environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(host.removeprefix("unix://"))
            credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    pid = struct.unpack("3i", credentials)[0]  # 0: the engine is in another PID namespace (a mounted socket)
    if pid <= 0:
        return False
    try:
        return Path(f"/proc/{pid}/ns/net").readlink() == Path("/proc/self/ns/net").readlink()
    except PermissionError:  # root's daemon, seen by a user of the docker group: the machine's own
        return True
    except OSError:
        return False


def serves_secrets(driver: str, buildkit: str, engine: EngineFacts, *, local: bool = True) -> bool:
    """Whether a BuildKit build gets its secrets served rather than mounted: where the engine's own
    BuildKit (the docker driver, which gives the steps the host's network when asked) hashes a step's
    whole root filesystem for a secret mount (CHECKSUMMING_BUILDKIT), by the version buildx reports, else
    by the Docker Engine's, and its steps can reach the server (``local``: :func:`shares_the_engines_loopback`).
    Another driver keeps the mounts (its network.host entitlement is not granted by default); so do an
    engine outside this process's network namespace and a version nobody states. ``$ASCENDKIT_BUILDKIT_SECRETS``
    decides where set."""
    asked = os.environ.get(SECRETS_ENV, "")
    if asked in ("mounts", "served"):
        return asked == "served"
    if asked:
        raise InputError(f"{SECRETS_ENV}={asked!r}: set it to mounts or served, or leave it unset (ascendkit decides)")
    if driver != "docker" or not local:
        return False
    known = _major_minor(buildkit)
    if known is not None:
        return CHECKSUMMING_BUILDKIT[0] <= known < CHECKSUMMING_BUILDKIT[1]
    engine_version = _major_minor(engine.version) if engine.product == "Docker Engine" else None
    return engine_version is not None and CHECKSUMMING_ENGINE[0] <= engine_version < CHECKSUMMING_ENGINE[1]


def refuse_classic_cache(choice: str, cache: bool) -> None:
    """InputError for a registry cache asked of the classic builder (planning refuses it before the
    engine is asked; the choice of builder holds to it for a plan made any other way)."""
    if choice == CLASSIC and cache:
        raise InputError("--cache-repo needs BuildKit: the classic builder can neither import nor export a registry cache")


def choose_builder(choice: str, engine: EngineFacts, *, cache: bool = False, export: bool = True) -> Builder:
    """The builder ``--builder choice`` means on ``engine``: BuildKit where buildx and the engine
    give it, the classic builder where they do not (``auto``) or where asked. ``cache``: a registry
    cache is imported, and exported unless ``export`` is false."""
    if choice not in BUILDERS:
        raise InputError(f"--builder {choice!r}: choose one of {', '.join(BUILDERS)}")
    refuse_classic_cache(choice, cache)
    classic = Builder(CLASSIC, f"{engine.product} {engine.version}")
    if choice == CLASSIC:
        return classic
    if engine.image_store == PODMAN_STORE:
        why = "Podman builds through buildah, not BuildKit"
    else:
        found = find_buildx()
        if not isinstance(found, str):
            command, version = found
            driver, buildkit = _current_builder(command)
            if cache and export and driver == "docker" and engine.image_store != CONTAINERD_STORE:
                raise Unavailable(
                    "--cache-repo: buildx's docker driver exports a registry cache only from Docker's containerd image store, "
                    f"and this engine keeps images in its {engine.image_store} store. Turn the containerd image store on, or "
                    "build with a BuildKit container: docker buildx create --name ascendkit --driver docker-container --use "
                    "(or BUILDX_BUILDER=ascendkit); its base image must then come from a registry. "
                    "--cache-import-only reads the cache without exporting, with any driver"
                )
            described = f"buildx {version}" + (f", BuildKit {buildkit}" if buildkit else "")
            served = serves_secrets(driver, buildkit, engine, local=shares_the_engines_loopback())
            return Builder(BUILDKIT, described, command, serves_secrets=served)
        why = found
    if choice == BUILDKIT or cache:
        asked = "--cache-repo needs BuildKit" if choice != BUILDKIT else "--builder buildkit"
        raise Unavailable(f"{asked}, which this machine cannot give ({why}); {INSTALL_HINT}, or build with --builder classic")
    return Builder(CLASSIC, classic.version, note=f"BuildKit is not available ({why}): building with the classic builder")


def stop(process: subprocess.Popen[str], grace: float = 20) -> None:
    """Stop a running buildx as Ctrl-C would (it cancels the solve on the engine), then kill it."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def secret_files(directory: Path, ca_bundle: bytes, env_script: bytes) -> list[str]:
    """The ``--secret`` flags for a build's CA bundle and served environment, written (mode 0600)
    into ``directory``, which the caller removes when the build ends. None of it reaches a layer:
    BuildKit mounts a secret on tmpfs for the one RUN that asks for it."""
    flags = []
    for name, content in (("ascendkit-ca", ca_bundle), ("ascendkit-env", env_script)):
        if not content:
            continue
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        flags += ["--secret", f"id={name},src={path}"]
    return flags
