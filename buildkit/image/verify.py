"""Check a built image against the matrix and its own labels, from inside a short-lived container.

What is compared comes from the build plan (the matrix), never from constants here; what is found
comes from the image itself (Python, ``pip list``, /etc/os-release, CANN's version files). The
result is written as a build manifest, JSON for machines and Markdown for people.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import docker
import requests
from docker.errors import DockerException
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from buildkit.errors import VerifyFailed
from buildkit.image.engine import remove_containers
from buildkit.matrix.model import normalize_arch
from buildkit.reach import engine_said

PROBE_LABEL = "io.ascendkit.probe"

# Runs inside the image with its own Python; prints one JSON document.
PROBE = r"""
import glob, hashlib, json, os, platform, subprocess, sys
from importlib import metadata
def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None
pip = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], capture_output=True, text=True)
arch = platform.machine()
def installed(name, relative):
    try:
        with open(metadata.distribution(name).locate_file(relative), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (metadata.PackageNotFoundError, OSError):
        return None
try:
    patches = json.loads(read("/etc/ascendkit/patches.json") or "[]")
except ValueError:
    patches = []
for patch in patches:
    patch["sha256_now"] = installed(patch.get("package", ""), patch.get("file", ""))
revisions = read("/etc/ascendkit/git-revisions.txt") or ""
requires = {}
for line in revisions.splitlines():
    name = (line.split() or [""])[0]
    try:
        requires[name] = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        pass
patterns = ["/usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info",
            "/usr/local/Ascend/ascend-toolkit/latest/version.cfg"]
print(json.dumps({
    "python": platform.python_version(),
    "machine": platform.machine(),
    "pip_list": json.loads(pip.stdout) if pip.returncode == 0 else None,
    "pip_error": pip.stderr[-2000:] if pip.returncode else "",
    "os_release": read("/etc/os-release") or "",
    "cann_files": {p: read(p) for pattern in patterns for p in sorted(glob.glob(pattern))},
    "env": {k: os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ATB_HOME_PATH")},
    "dpkg": run(["dpkg-query", "-W", "-f", "${Package}\\t${Version}\\t${Architecture}\\n"]),
    "rpm": run(["rpm", "-qa", "--qf", "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"]),
    "git_revisions": revisions,
    "locks": {p: read(p) for p in sorted(glob.glob("/etc/ascendkit/locks/*-" + arch + ".txt"))},
    "patches": patches,
    "requires": requires,
}))
"""

Status = Literal["pass", "fail", "absent"]


@dataclass(frozen=True)
class Expected:
    """What the matrix says the image must contain."""

    stack_id: str
    chip_id: str
    skus: tuple[str, ...]
    os_name: str
    arch: str
    python: str
    cann: str
    base_image: str
    packages: tuple[tuple[str, str], ...]  # (distribution, exact version)
    labels: tuple[tuple[str, str], ...]
    lock: str = ""  # the resolved lock the image installed from ("" when its arch's lock is unresolved)
    locked: tuple[tuple[str, str], ...] = ()  # every package of that lock: (name, version)
    unresolved_lock: str = ""  # the lock of this arch when it is unresolved: the manifest says so
    commits: tuple[tuple[str, str], ...] = ()  # (checkout, commit) the image must hold: the framework's source
    leaves_out: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (checkout, packages its install must not require)
    patches: tuple[tuple[str, str, str], ...] = ()  # (distribution, file, line commented out)


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    actual: str
    status: Status


@dataclass(frozen=True)
class ImageFacts:
    image_id: str
    architecture: str
    labels: dict[str, str]
    python: str
    machine: str
    packages: dict[str, str]  # normalized name -> version
    os_release: dict[str, str]
    cann_version: str | None
    cann_source: str | None
    env: dict[str, str | None]
    doctor_exit: int | None = None  # `ascendkit doctor` inside the image; None: the image has none
    doctor_report: dict[str, Any] | None = None
    created: str = ""  # the image config's creation time
    os_packages: dict[str, str] = field(default_factory=dict)  # "dpkg"/"rpm" -> that tool's listing ("" when absent)
    git_revisions: str = ""  # /etc/ascendkit/git-revisions.txt: "name ref commit" per checkout
    locks: dict[str, str] = field(default_factory=dict)  # this arch's lock sections in the image: path -> text
    patches: tuple[dict[str, Any], ...] = ()  # /etc/ascendkit/patches.json, each with the file's sha256 as it is now
    requires: dict[str, list[str]] = field(default_factory=dict)  # checkout (installed as a distribution) -> its requirements


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_os_release(text: str) -> dict[str, str]:
    result = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            result[key.strip()] = value.strip().strip('"')
    return result


def parse_cann_version(files: dict[str, str | None]) -> tuple[str | None, str | None]:
    """CANN's own record of its version: ``version=8.3.RC1`` in ascend_toolkit_install.info."""
    for path, text in sorted(files.items()):
        for line in (text or "").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() in ("version", "Version"):
                return value.strip(), path
    return None, None


def run_in_image(client: docker.APIClient, image_id: str, command: list[str], timeout: int = 300) -> tuple[int, str, str]:
    """Run ``command`` in a short-lived container (no network, the image's entrypoint); always removed."""
    container = client.create_container(image_id, command=command, network_disabled=True, labels={PROBE_LABEL: "1"})
    cid = container["Id"]
    try:
        client.start(cid)
        status = client.wait(cid, timeout=timeout)
        stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = client.logs(cid, stdout=False, stderr=True).decode("utf-8", "replace")
    except (DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise VerifyFailed(f"could not run the verification container: {engine_said(exc)}") from None
    finally:
        remove_containers(client, [cid])
    return int(status.get("StatusCode", -1)), stdout, stderr


def run_probe(client: docker.APIClient, image_id: str) -> dict[str, Any]:
    code, stdout, stderr = run_in_image(client, image_id, ["python3", "-c", PROBE])
    if code != 0:
        raise VerifyFailed(f"the verification probe exited with {code}:\n{stderr[-2000:]}")
    try:
        data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VerifyFailed(f"the verification probe printed no JSON:\n{stdout[-1000:]}{stderr[-1000:]}") from None
    return data


def collect_facts(client: docker.APIClient, image_id: str) -> ImageFacts:
    inspect = client.inspect_image(image_id)
    probe = run_probe(client, image_id)
    if probe.get("pip_list") is None:
        raise VerifyFailed(f"`pip list` failed in the image: {probe.get('pip_error', '')}")
    version, source = parse_cann_version(probe.get("cann_files") or {})
    doctor_exit, out, _ = run_in_image(client, image_id, ["ascendkit", "doctor", "--json"])
    try:
        doctor_report = json.loads(out)
    except ValueError:
        doctor_report = None
    return ImageFacts(
        image_id=image_id,
        architecture=str(inspect.get("Architecture", "")),
        labels=dict((inspect.get("Config") or {}).get("Labels") or {}),
        python=str(probe["python"]),
        machine=str(probe["machine"]),
        packages={normalize(p["name"]): p["version"] for p in probe["pip_list"]},
        os_release=parse_os_release(probe.get("os_release", "")),
        cann_version=version,
        cann_source=source,
        env=dict(probe.get("env") or {}),
        doctor_exit=doctor_exit,
        doctor_report=doctor_report,
        created=str(inspect.get("Created", "")),
        os_packages={tool: probe[tool] for tool in ("dpkg", "rpm") if probe.get(tool)},
        git_revisions=str(probe.get("git_revisions") or ""),
        locks={path: text for path, text in (probe.get("locks") or {}).items() if text},
        patches=tuple(p for p in probe.get("patches") or [] if isinstance(p, dict)),
        requires={str(k): [str(r) for r in v] for k, v in (probe.get("requires") or {}).items()},
    )


def _version_matches(installed: str | None, pinned: str) -> bool:
    if installed is None:
        return False
    try:
        # ==2.7.1 accepts 2.7.1+cpu, exactly as pip did when it installed it
        return SpecifierSet(f"=={pinned}").contains(installed, prereleases=True)
    except InvalidVersion:
        return installed == pinned


def compare(facts: ImageFacts, expected: Expected) -> list[Check]:
    def check(name: str, want: str, got: str | None, ok: bool) -> Check:
        return Check(name, want, got if got is not None else "(missing)", "pass" if ok else "fail")

    python = ".".join(facts.python.split(".")[:2])
    os_id = f"{facts.os_release.get('ID', '?')}{facts.os_release.get('VERSION_ID', '')}"
    machine = normalize_arch(facts.machine)
    checks = [
        check("python", expected.python, python, python == expected.python),
        check("arch", expected.arch, machine, machine == expected.arch),
        # what the registry index will advertise: it must be the arch the image really runs as
        check(
            "image config architecture",
            expected.arch,
            normalize_arch(facts.architecture),
            normalize_arch(facts.architecture) == expected.arch,
        ),
        check("os", expected.os_name, os_id, os_id == expected.os_name),
    ]
    if facts.cann_version is None:
        checks.append(Check("cann", expected.cann, "no CANN version file in the image", "absent"))
    else:
        checks.append(check("cann", expected.cann, facts.cann_version, facts.cann_version.lower() == expected.cann.lower()))
    home = facts.env.get("ASCEND_HOME_PATH")
    checks.append(check("env ASCEND_HOME_PATH", "set", home, bool(home)))
    # doctor's preflight: 0 (ready) or 10 (no NPU on the build host) pass; 1 is a failed check
    doctor_failures = [c["name"] for c in (facts.doctor_report or {}).get("checks", []) if c["status"] == "error"]
    doctor_ok = facts.doctor_exit in (0, 10) and facts.doctor_report is not None
    found = f"exit {facts.doctor_exit}" + (f": failed {', '.join(doctor_failures)}" if doctor_failures else "")
    checks.append(check("ascendkit doctor (preflight)", "exit 0 or 10", found, doctor_ok))
    for dist, version in expected.packages:
        got = facts.packages.get(normalize(dist))
        checks.append(check(f"package {dist}", version, got, _version_matches(got, version)))
    if expected.lock:
        wrong = [
            f"{name} {facts.packages.get(normalize(name), 'missing')}"
            for name, version in expected.locked
            if not _version_matches(facts.packages.get(normalize(name)), version)
        ]
        want = f"{len(expected.locked)} packages of {expected.lock}"
        got_text = "all at their locked versions" if not wrong else "not as locked: " + ", ".join(wrong[:10])
        checks.append(check("lock", want, got_text, not wrong))
    elif expected.unresolved_lock:
        checks.append(Check("lock", "hash-locked install", f"{expected.unresolved_lock} is unresolved: pins installed unhashed", "absent"))
    checks += _source_checks(facts, expected)
    for key, value in expected.labels:
        got = facts.labels.get(key)
        checks.append(check(f"label {key}", value, got, got == value))
    return checks


def _requirement_name(requirement: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0])


def _source_checks(facts: ImageFacts, expected: Expected) -> list[Check]:
    """What was built from source and changed after install: the commit a checkout holds, the
    requirements it was built with (TARGET_DEVICE=NPU leaves the CUDA-only ones out), the patches."""
    checks = []
    commits = {parts[0]: parts[2] for parts in (line.split() for line in facts.git_revisions.splitlines()) if len(parts) == 3}
    for name, commit in expected.commits:
        got = commits.get(name)
        checks.append(Check(f"checkout {name}", commit, got or "(not recorded)", "pass" if got == commit else "fail"))
    for name, left_out in expected.leaves_out:
        required = {_requirement_name(r) for r in facts.requires.get(name, [])}
        found = sorted(required & {normalize(n) for n in left_out})
        if name not in facts.requires:
            checks.append(Check(f"{name} requirements", f"none of {', '.join(left_out)}", "not an installed distribution", "fail"))
        else:
            got = "requires " + ", ".join(found) if found else f"none of them ({len(required)} requirements)"
            checks.append(Check(f"{name} requirements", f"none of {', '.join(left_out)}", got, "fail" if found else "pass"))
    for package, file, line in expected.patches:
        record = next(
            (p for p in facts.patches if normalize(str(p.get("package"))) == normalize(package) and p.get("file") == file),
            None,
        )
        if record is None:
            got, ok = "not applied (no record in /etc/ascendkit/patches.json)", False
        elif record.get("comment_out") != line.strip():
            got, ok = f"another line commented out: {record.get('comment_out')!r}", False
        elif record.get("sha256_now") != record.get("sha256_after"):
            got, ok = "the file changed after the patch", False
        else:
            got, ok = f"commented out at line {record.get('line')} of {record.get('version')}", True
        checks.append(Check(f"patch {package} {file}", f"{line.strip()!r} commented out", got, "pass" if ok else "fail"))
    return checks


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]
