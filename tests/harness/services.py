"""Start and stop the real parts the integration tests use, on a CI-like machine where we are root.

    python -m tests.harness.services start [--arm64 [--arm64-later]]   # install what is missing, start, write the env file
    python -m tests.harness.services arm64-standin     # after start --arm64 --arm64-later: the arm64 stand-in
    python -m tests.harness.services stop              # stop what start started

* the engines users run (docs/engines.md), each dockerd on a private socket, data root, exec root
  and bridge, from Debian's own packages unpacked beside the system (tests/harness/debian_packages.py, so
  the same on Debian 12 and 13): **Docker 26.1.5 with the containerd image store** (trixie's
  docker.io and containerd: what a fresh Docker 29 install and Docker Desktop use; every docker
  test's engine), **Docker 20.10** (bookworm's: the graph-driver store and the legacy `docker save`
  layout), and **Docker 26.1.5 on overlay2** (the OCI layout of uncompressed blobs). The latter two
  run the tests marked ``engine_20_10`` and ``engine_overlay2``; a second containerd-store engine
  (docker-b) runs the tests marked ``second_engine``, and a third (docker-bench) the quick benchmarks,
  which empty their engine between builds;
* two CNCF distribution registries (Debian's docker-registry) on 127.0.0.1 per engine that runs
  tests, each with its own storage: a publish to several registries, and a mirror from one to the
  other, are tested for real (the second stands for the registry inside China beside quay.io), and
  the engines' test runs at once never meet in a repository;
* the stand-in CANN base image: Debian 12 with Python 3.11 and a clearly labelled placeholder of
  the CANN layout (set_env.sh scripts, a version file, no CANN binaries), made with debootstrap
  because the real CANN base cannot be pulled on these machines (tests/harness/standin.py). With --arm64 an arm64 stand-in
  is made too, through qemu-user-static (both debootstraps run at once; with --arm64-later, as CI runs
  it, by `arm64-standin` after start, so that the amd64 tests need not wait), and a second engine is
  started for the tests marked ``emulated``: on its own socket, data root and bridge, sharing
  only the registry with the first, the way the workflow's arm64 build runs on a runner of its
  own (a Docker 20.10). `make test` runs those tests there beside the others (tests/harness/ci.py), so
  what they build, remove and run never shows in the other tests' engine.

The env file (``$ASCENDKIT_SERVICES_DIR/env``, default /tmp/ascendkit-services/env) holds
DOCKER_HOST, ASCENDKIT_REGISTRY, ASCENDKIT_REGISTRY2, ASCENDKIT_STANDIN_IMAGE[_ARM64],
ASCENDKIT_ENGINE_HOSTS (every engine: ``name=unix://...`` pairs, for the tests that load one image
into several), ASCENDKIT_DOCKER_CLI (trixie's docker CLI 26.1.5), ASCENDKIT_BUILDX (trixie's
docker-buildx 0.13.1, which `ascendkit build` runs BuildKit through),
ASCENDKIT_CONTAINERD (the socket of the engine's containerd, for `ctr` in the zstd tests and the
benchmark), ASCENDKIT_SKOPEO_SIGSTORE (a skopeo with sigstore, tests/harness/sigstore_skopeo.py) and,
with --arm64, ASCENDKIT_EMULATED_DOCKER_HOST for the tests (and with --arm64-later
ASCENDKIT_STANDIN_ARM64_STATE: the file that says when the arm64 stand-in is there, or why not). ``env.<engine>`` holds the same for
each other engine (its DOCKER_HOST, registries and containerd).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker

from tests.harness import cpuacct, debian_packages
from tests.harness.sigstore_skopeo import skopeo_sigstore
from tests.harness.standin import STANDIN_REF, build_standin

STATE = Path(os.environ.get("ASCENDKIT_SERVICES_DIR", "/tmp/ascendkit-services"))
ENV_FILE = STATE / "env"
EMULATED_HOST_VAR = "ASCENDKIT_EMULATED_DOCKER_HOST"


REGISTRY_PORT = int(os.environ.get("ASCENDKIT_REGISTRY_PORT", "5000"))
TRIXIE_ENGINE = ("docker.io", "containerd", "docker-cli", "docker-buildx")  # Docker 26.1.5, containerd 1.7.24, buildx 0.13.1
BOOKWORM_ENGINE = ("docker.io", "containerd")  # Docker 20.10.24, containerd 1.6.20


@dataclass(frozen=True)
class Engine:
    """One dockerd: its files under STATE, its packages, its store, the bridge its containers attach
    to (None: docker0) and the registries its tests use."""

    name: str  # "docker" (every test's engine), "docker-20.10", "docker-overlay2", "docker-emulated"
    suite: str  # the Debian suite its docker.io comes from: trixie (26.1.5) or bookworm (20.10)
    containerd_store: bool = False
    bridge: tuple[str, str] | None = None  # (interface, gateway CIDR) made for it
    registry_port: int = REGISTRY_PORT  # its registries: this port and the next

    @property
    def socket(self) -> Path:
        return STATE / f"{self.name}.sock"

    @property
    def pid_file(self) -> Path:
        return STATE / f"{self.name}.pid"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def registries(self) -> tuple[str, str]:
        return ("registry", "registry2") if self.registry_port == REGISTRY_PORT else (f"registry-{self.name}", f"registry2-{self.name}")

    def root(self) -> Path:
        """Where its packages are unpacked."""
        return debian_packages.unpacked(STATE, self.suite, TRIXIE_ENGINE if self.suite == "trixie" else BOOKWORM_ENGINE, "engine")


MAIN = Engine("docker", "trixie", containerd_store=True)  # what a fresh Docker install gives users: every docker test
# The same engine again, for the docker tests that share no image with the rest (conftest.SECOND_ENGINE): the two halves
# run at once (one waits on registries and Ray while the other builds), and neither sees the other's containers.
SECOND = Engine("docker-b", "trixie", containerd_store=True, bridge=("ak-docker-b", "10.217.0.1/24"), registry_port=REGISTRY_PORT + 30)
LEGACY = Engine("docker-20.10", "bookworm", bridge=("ak-d2010", "10.215.0.1/24"), registry_port=REGISTRY_PORT + 10)
OVERLAY2 = Engine("docker-overlay2", "trixie", bridge=("ak-overlay2", "10.216.0.1/24"), registry_port=REGISTRY_PORT + 20)
# Its own bridge and subnet, so its iptables rules and addresses never meet docker0's.
EMULATED = Engine("docker-emulated", "bookworm", bridge=("ascendkit-emu0", "10.213.0.1/24"))
# The quick benchmarks' engine (CI's bench job): they empty their engine between builds, so they cannot share one
# with a job of tests; on an engine of their own they run beside the tests instead of after them.
BENCH = Engine("docker-bench", "trixie", containerd_store=True, bridge=("ak-bench", "10.218.0.1/24"), registry_port=REGISTRY_PORT + 40)
OTHERS = (SECOND, LEGACY, OVERLAY2, BENCH)  # the engines with an env file of their own, each for one job (tests/harness/ci.py)

_STARTED = time.monotonic()


def log(message: str) -> None:
    """A line of progress, with the seconds since this process started (what each step took on a fresh machine)."""
    print(f"[services] {time.monotonic() - _STARTED:5.0f} s  {message}", file=sys.stderr, flush=True)


def run(*argv: str, **kwargs: object) -> None:
    subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


def install_packages(arm64: bool) -> None:
    # skopeo: a registry client nobody here wrote, which the tests read pushed images back with
    # The engines themselves are unpacked from Debian's archive (Engine.root); the system gives them
    # runc (trixie's needs glibc 2.38: Debian 12's runc runs every engine here) and iptables.
    wanted = {
        "runc": "runc",
        "iptables": "iptables",
        "podman": "podman",  # its Docker-compatible API: load, save and publish from its archive (tests/test_engines.py)
        "docker-registry": "docker-registry",
        "debootstrap": "debootstrap",
        "skopeo": "skopeo",
        "ctr": "containerd",
        "htpasswd": "apache2-utils",  # a registry that demands a login (test_credentials_docker.py)
        "rsync": "rsync",  # gitlab-ci-local copies the project into each job's build directory with it
        "npm": "npm",  # installs gitlab-ci-local (below)
    }
    if arm64:
        wanted["qemu-aarch64-static"] = "qemu-user-static"
        wanted["update-binfmts"] = "binfmt-support"
    missing = [pkg for exe, pkg in wanted.items() if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"[services] need {', '.join(missing)}: run as root, or install them first")
    log(f"installing {' '.join(missing)}")
    run("apt-get", "update", "-qq")
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    log("installed")


# gitlab-ci-local runs a .gitlab-ci.yml on this machine with the shell executor (tests/test_gitlab_local.py). 4.65.0 is
# the last release that runs on the Node.js of Debian 12 (later ones use Set.prototype.union, Node 22).
GITLAB_CI_LOCAL = "gitlab-ci-local@4.65.0"


def install_gitlab_ci_local() -> Path:
    """The pinned gitlab-ci-local, from npm, under the services' state (installed once)."""
    prefix = STATE / "node"
    exe = prefix / "node_modules" / ".bin" / "gitlab-ci-local"
    stamp = prefix / "installed"
    if not exe.exists() or not stamp.is_file() or stamp.read_text() != GITLAB_CI_LOCAL:
        log(f"installing {GITLAB_CI_LOCAL}")
        prefix.mkdir(parents=True, exist_ok=True)
        run("npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--silent", GITLAB_CI_LOCAL)
        stamp.write_text(GITLAB_CI_LOCAL)
    return exe


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _wait(what: str, ready: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if ready():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"[services] {what} did not become ready in {seconds:.0f}s; see {STATE}")


def _make_bridge(interface: str, cidr: str) -> None:
    if subprocess.run(["ip", "link", "show", interface], capture_output=True, check=False).returncode == 0:
        return
    run("ip", "link", "add", "name", interface, "type", "bridge")
    run("ip", "addr", "add", cidr, "dev", interface)
    run("ip", "link", "set", interface, "up")


def start_dockerd(engine: Engine = MAIN) -> None:
    if _alive(engine.pid_file):
        return
    root = engine.root()
    log(f"starting dockerd on {engine.host} ({engine.suite}: {(root / 'versions').read_text().splitlines()[1]})")
    config = STATE / f"{engine.name}.json"  # not /etc/docker/daemon.json, which belongs to the machine
    config.write_text(json.dumps({"features": {"containerd-snapshotter": engine.containerd_store}}) + "\n")
    argv = [
        str(root / "usr/sbin/dockerd"),
        "--host",
        engine.host,
        "--data-root",
        str(STATE / f"{engine.name}-data"),
        "--exec-root",
        str(STATE / f"{engine.name}-exec"),
        "--pidfile",
        str(engine.pid_file),
        "--config-file",
        str(config),
    ]
    if engine.bridge:
        _make_bridge(*engine.bridge)
        argv += ["--bridge", engine.bridge[0]]
    measured = cpuacct.engine_group(engine.name)  # under tests.harness.ci: its CPU and its containers' counted apart
    if measured is not None:
        argv = [*measured[0], *argv, *measured[1]]
    # Its own containerd, shims and docker-proxy first on the PATH; runc and iptables the system's.
    path = f"{root / 'usr/bin'}:{root / 'usr/sbin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}:/usr/sbin:/sbin"
    with (STATE / f"dockerd{engine.name.removeprefix('docker')}.log").open("ab") as out:  # dockerd.log, dockerd-20.10.log, ...
        subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True, env={**os.environ, "PATH": path})
    _wait(f"dockerd ({engine.name})", lambda: docker.APIClient(base_url=engine.host).ping())


def start_registry(name: str = "registry", port: int = REGISTRY_PORT) -> None:
    pid_file = STATE / f"{name}.pid"
    if _alive(pid_file):
        return
    # Every run pushes under names of its own: what earlier runs pushed is only disk (gigabytes a run, which
    # filled this machine's disk after eight runs). A registry starts empty.
    shutil.rmtree(STATE / f"{name}-data", ignore_errors=True)
    config = STATE / f"{name}.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {STATE / f'{name}-data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log(f"starting {name} on 127.0.0.1:{port}")
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    with (STATE / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen([exe, "serve", str(config)], stdout=out, stderr=out, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    _wait(name, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).status == 200)


def containerd_socket(engine: Engine = MAIN) -> Path:
    """The containerd the engine started for itself (dockerd runs its own when none is on the system):
    `ctr --address` it to pull as containerd does on a Kubernetes node."""
    managed = STATE / f"{engine.name}-exec" / "containerd" / "containerd.sock"
    return managed if managed.exists() else Path("/run/containerd/containerd.sock")


def enable_arm64_emulation() -> None:
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "status").exists():
        run("mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt))
    if not (binfmt / "qemu-aarch64").exists():
        run("update-binfmts", "--enable", "qemu-aarch64")


def engine_env(engine: Engine, standins: dict[str, str]) -> dict[str, str]:
    """What the tests on ``engine`` are given: its socket, its registries, its containerd, the stand-in."""
    return {
        "DOCKER_HOST": engine.host,
        "ASCENDKIT_ENGINE_NAME": engine.name,  # which of the services' engines the tests run on (tests/test_reproducible.py)
        "ASCENDKIT_REGISTRY": f"127.0.0.1:{engine.registry_port}",
        "ASCENDKIT_REGISTRY2": f"127.0.0.1:{engine.registry_port + 1}",
        "ASCENDKIT_CONTAINERD": str(containerd_socket(engine)),
        "ASCENDKIT_STANDIN_IMAGE": standins["amd64"],
    }


ARM64_STATE = STATE / "standin-arm64.state"  # "ready", or "failed: why", once `arm64-standin` has ended
ARM64_STATE_VAR = "ASCENDKIT_STANDIN_ARM64_STATE"


def start(arm64: bool, arm64_later: bool = False) -> None:
    """Install, start and write the env files. With ``arm64_later`` the arm64 stand-in is left to
    `arm64-standin` (CI runs it as a job of its own, so that the amd64 tests need not wait for its
    debootstrap under qemu): the env files name it, and ARM64_STATE says when it is there."""
    STATE.mkdir(parents=True, exist_ok=True)
    ARM64_STATE.unlink(missing_ok=True)
    install_packages(arm64)
    engines = [MAIN, *OTHERS, *([EMULATED] if arm64 else [])]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two suites' packages at once: downloads
        list(pool.map(Engine.root, [MAIN, LEGACY]))
    for engine in engines:
        start_dockerd(engine)
    for engine in [MAIN, *OTHERS]:
        start_registry(engine.registries[0], engine.registry_port)
        start_registry(engine.registries[1], engine.registry_port + 1)
    # the amd64 stand-in in every engine but the emulated one, whose tests run arm64 images only
    clients = [docker.APIClient(base_url=engine.host, timeout=600) for engine in (MAIN, *OTHERS)]
    if arm64:
        enable_arm64_emulation()
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two debootstraps at once: mostly downloads and dpkg
        futures = {"amd64": pool.submit(build_standin, clients, "amd64", STATE, log)}
        if arm64 and not arm64_later:
            futures["arm64"] = pool.submit(build_standin, _arm64_clients(), "arm64", STATE, log)
        standins = {arch: future.result() for arch, future in futures.items()}
    common = {
        "ASCENDKIT_SKOPEO_SIGSTORE": str(skopeo_sigstore(STATE)),  # bookworm's skopeo has sigstore cut out
        "ASCENDKIT_GITLAB_CI_LOCAL": str(install_gitlab_ci_local()),
        "ASCENDKIT_DOCKER_CLI": str(MAIN.root() / "usr/bin/docker"),
        "ASCENDKIT_BUILDX": str(MAIN.root() / "usr/libexec/docker/cli-plugins/docker-buildx"),  # what `ascendkit build` runs BuildKit with
        "ASCENDKIT_ENGINE_HOSTS": ",".join(f"{e.name}={e.host}" for e in [MAIN, LEGACY, OVERLAY2]),  # no spaces: the file is sourced by sh
    }
    env = {**engine_env(MAIN, standins), **common}
    if arm64:
        env["ASCENDKIT_STANDIN_IMAGE_ARM64"] = standins.get("arm64", STANDIN_REF["arm64"])
        env[EMULATED_HOST_VAR] = EMULATED.host
        if arm64_later:
            env[ARM64_STATE_VAR] = str(ARM64_STATE)
    ENV_FILE.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    for engine in OTHERS:
        other = {**engine_env(engine, standins), **common}
        (STATE / f"env.{engine.name}").write_text("".join(f"{k}={v}\n" for k, v in other.items()))
    log(f"ready; environment in {ENV_FILE} (and env.<engine> beside it)" + ("; the arm64 stand-in comes later" if arm64_later else ""))


def _arm64_clients() -> list[docker.APIClient]:
    """The engines that run arm64 images: the main one (the multi-arch build) and the emulated one."""
    return [docker.APIClient(base_url=engine.host, timeout=600) for engine in (MAIN, EMULATED)]


def arm64_standin() -> None:
    """The arm64 stand-in, in the engines `start --arm64 --arm64-later` started: ARM64_STATE says
    "ready" when it is there, or why it is not (and the exit status is 1)."""
    try:
        build_standin(_arm64_clients(), "arm64", STATE, log)
    except BaseException as exc:
        why = exc.code if isinstance(exc, SystemExit) else repr(exc)
        ARM64_STATE.write_text(f"failed: {why}\n")
        raise
    ARM64_STATE.write_text("ready\n")
    log(f"the arm64 stand-in {STANDIN_REF['arm64']} is ready")


def stop() -> None:
    """Stop the registries, then the engines: each group signalled at once and waited for together (one by
    one, each registry's own shutdown took 2 s: 26 s at the end of every `make test`)."""
    registries = [name for engine in (MAIN, *OTHERS) for name in engine.registries]
    for group in (registries, [MAIN.name, *(e.name for e in OTHERS), EMULATED.name]):
        signalled = {}
        for name in group:
            pid_file = STATE / f"{name}.pid"
            if _alive(pid_file):
                signalled[name] = pid_file
                log(f"stopping {name} (pid {pid_file.read_text().strip()})")
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid_file) for pid_file in signalled.values()):
            time.sleep(0.3)
        for pid_file in signalled.values():
            if _alive(pid_file):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
    # dockerd leaves its data root bind-mounted and the default network namespace mounted in its
    # exec root: unmounted, so that the state directory can be removed.
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if Path(m).is_relative_to(STATE)), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            log(f"could not unmount {point}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "arm64-standin", "stop"])
    parser.add_argument("--arm64", action="store_true", help="also make the arm64 stand-in (qemu)")
    parser.add_argument(
        "--arm64-later", action="store_true", help="with --arm64: start without the arm64 stand-in, which `arm64-standin` then makes"
    )
    args = parser.parse_args()
    if args.action == "start":
        start(args.arm64, arm64_later=args.arm64_later)
    elif args.action == "arm64-standin":
        arm64_standin()
    else:
        stop()


if __name__ == "__main__":
    main()
