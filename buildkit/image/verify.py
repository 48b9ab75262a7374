"""Check a built image against the matrix and its own labels, from inside a short-lived container.

What is compared comes from the build plan (the matrix), never from constants here; what is found
comes from the image itself (Python, ``pip list``, /etc/os-release, CANN's version files). The
result is written as a build manifest, JSON for machines and Markdown for people.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import docker
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from buildkit.arch import normalize_arch
from buildkit.doctor.base import Check
from buildkit.errors import VerifyFailed
from buildkit.image.archive import ImageIdentity, identify
from buildkit.image.probe import run_in_image, run_probe


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
    user: tuple[str, int, int] | None = None  # (name, uid, gid) the image runs as; None: not checked
    extensions: tuple[tuple[str, str], ...] = ()  # (component, compiled extension module its build must produce)
    archive_wheels: tuple[str, ...] = ()  # distributions from a release archive (sgl-kernel-npu): installed, at its version
    imports: tuple[tuple[str, str], ...] = ()  # (component, module the image must import): Ascend's tools

    @property
    def distributions(self) -> tuple[str, ...]:
        return (*(dist for dist, _ in self.packages), *self.archive_wheels)

    @property
    def modules(self) -> tuple[str, ...]:
        """The compiled extension modules to look for."""
        return tuple(module for _, module in self.extensions)

    @property
    def import_modules(self) -> tuple[str, ...]:
        """The modules to import for real."""
        return tuple(module for _, module in self.imports)


def _compared(name: str, expected: str, actual: str, status: str) -> Check:
    """A check of the image against the plan: what was expected, what was found."""
    detail = actual if status == "ok" else f"expected {expected}, found {actual}"
    return Check(name, status, detail, expected=expected, actual=actual)


@dataclass(frozen=True)
class ImageFacts:
    image_id: str  # the config digest (buildkit.image.archive.ImageIdentity.config)
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
    config_user: str = ""  # the image config's User ("" is root)
    user: dict[str, Any] = field(default_factory=dict)  # the probe's view of the user it ran as (see probe_program.user)
    extensions: dict[str, dict[str, Any]] = field(default_factory=dict)  # module -> its file, needed and unresolved libraries
    imported: dict[str, str] = field(default_factory=dict)  # module imported for real -> "" or why it did not import


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


def collect_facts(
    client: docker.APIClient,
    image: str | ImageIdentity,
    distributions: tuple[str, ...] = (),
    extensions: tuple[str, ...] = (),
    imports: tuple[str, ...] = (),
) -> ImageFacts:
    """What the image holds, probed in short-lived containers; ``image`` a reference or an identity
    already known (the facts name the image by its config digest, whatever the engine calls it)."""
    inspect = client.inspect_image(image if isinstance(image, str) else image.engine_id)
    identity = image if isinstance(image, ImageIdentity) else identify(client, image, inspect)
    image_id = identity.engine_id
    probe = run_probe(client, image_id, distributions, extensions, imports)
    if probe.get("pip_list") is None:
        raise VerifyFailed(f"`pip list` failed in the image: {probe.get('pip_error', '')}")
    version, source = parse_cann_version(probe.get("cann_files") or {})
    doctor_exit, out, _ = run_in_image(client, image_id, ["ascendkit", "doctor", "--json"])
    try:
        doctor_report = json.loads(out)
    except ValueError:
        doctor_report = None
    return ImageFacts(
        image_id=identity.config,
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
        config_user=str((inspect.get("Config") or {}).get("User") or ""),
        user=dict(probe.get("user") or {}),
        extensions={str(k): dict(v) for k, v in (probe.get("extensions") or {}).items() if isinstance(v, dict)},
        imported={str(k): str(v) for k, v in (probe.get("imported") or {}).items()},
    )


def version_matches(installed: str | None, pinned: str) -> bool:
    if installed is None:
        return False
    try:
        # ==2.7.1 accepts 2.7.1+cpu, exactly as pip did when it installed it
        return SpecifierSet(f"=={pinned}").contains(installed, prereleases=True)
    except InvalidVersion:
        return installed == pinned


def compare(facts: ImageFacts, expected: Expected) -> list[Check]:
    def check(name: str, want: str, got: str | None, ok: bool) -> Check:
        return _compared(name, want, got if got is not None else "(missing)", "ok" if ok else "error")

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
        checks.append(_compared("cann", expected.cann, "no CANN version file in the image", "warn"))
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
        checks.append(check(f"package {dist}", version, got, version_matches(got, version)))
    for component, module in expected.imports:
        error = facts.imported.get(module, "not probed")
        checks.append(check(f"import {module}", f"{component.replace('_', '-')} imports", error or "imported", not error))
    for dist in expected.archive_wheels:  # the archive fixes the version; the sha256 of the archive pins it
        got = facts.packages.get(normalize(dist))
        checks.append(check(f"package {dist}", "installed from its release archive", got, got is not None))
    if expected.lock:
        wrong = [
            f"{name} {facts.packages.get(normalize(name), 'missing')}"
            for name, version in expected.locked
            if not version_matches(facts.packages.get(normalize(name)), version)
        ]
        want = f"{len(expected.locked)} packages of {expected.lock}"
        got_text = "all at their locked versions" if not wrong else "not as locked: " + ", ".join(wrong[:10])
        checks.append(check("lock", want, got_text, not wrong))
    elif expected.unresolved_lock:
        checks.append(
            _compared("lock", "hash-locked install", f"{expected.unresolved_lock} is unresolved: pins installed unhashed", "warn")
        )
    checks += _source_checks(facts, expected)
    checks += extension_checks(facts, expected)
    checks += user_checks(facts, expected)
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
        checks.append(_compared(f"checkout {name}", commit, got or "(not recorded)", "ok" if got == commit else "error"))
    for name, left_out in expected.leaves_out:
        required = {_requirement_name(r) for r in facts.requires.get(name, [])}
        found = sorted(required & {normalize(n) for n in left_out})
        if name not in facts.requires:
            checks.append(_compared(f"{name} requirements", f"none of {', '.join(left_out)}", "not an installed distribution", "error"))
        else:
            got = "requires " + ", ".join(found) if found else f"none of them ({len(required)} requirements)"
            checks.append(_compared(f"{name} requirements", f"none of {', '.join(left_out)}", got, "error" if found else "ok"))
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
        checks.append(_compared(f"patch {package} {file}", f"{line.strip()!r} commented out", got, "ok" if ok else "error"))
    return checks


# Libraries of the Ascend driver (Ascend HDK): installed on the host, mounted at run time under
# /usr/local/Ascend/driver/lib64 (and /usr/local/dcmi), so never in an image. A compiled extension
# may need them and still be whole.
DRIVER_LIBRARIES = ("libascend_hal.so", "libdrvdsmi_host.so", "libdcmi.so")


def extension_checks(facts: ImageFacts, expected: Expected) -> list[Check]:
    """Each compiled extension a source build must produce is there as a shared object whose
    libraries resolve in the image (or are the driver's, mounted at run time). A build that
    "succeeded" without its kernels (vllm-ascend without COMPILE_CUSTOM_KERNELS, or a compiler that
    failed quietly) fails here, naming the component, instead of at the first custom op on the NPUs."""
    checks = []
    for component, module in expected.extensions:
        found = facts.extensions.get(module) or {"file": None, "error": "not probed"}
        want = f"{module} built, its libraries resolvable"
        if not found.get("file"):
            got = f"missing: {found.get('error') or 'not found'} (the build produced no {module}: its kernels were not compiled)"
            checks.append(_compared(f"extension {component}", want, got, "error"))
            continue
        if found.get("error"):
            checks.append(_compared(f"extension {component}", want, f"{found['file']}: {found['error']}", "error"))
            continue
        unresolved = [lib for lib in found.get("unresolved") or [] if lib not in DRIVER_LIBRARIES]
        driver = [lib for lib in found.get("unresolved") or [] if lib in DRIVER_LIBRARIES]
        needed = len(found.get("needed") or [])
        if unresolved:
            got = f"{found['file']}: {', '.join(unresolved)} not found in the image (nor the driver's)"
        else:
            got = f"{found['file']}: {needed} libraries resolve" + (f" ({', '.join(driver)} from the host's driver)" if driver else "")
        checks.append(_compared(f"extension {component}", want, got, "error" if unresolved else "ok"))
    return checks


def user_checks(facts: ImageFacts, expected: Expected) -> list[Check]:
    """The image runs as its non-root user, which has a passwd entry and a home, can write where
    jobs write, and can read and import everything that was installed (the probe ran as it)."""
    if expected.user is None:
        return []
    name, uid, gid = expected.user
    seen = facts.user
    want = f"{name} {uid}:{gid}"
    got = f"{seen.get('name') or '(no passwd entry)'} {seen.get('uid')}:{seen.get('gid')}"
    checks = [
        _compared(
            "user in config", f"{uid}:{gid}", facts.config_user or "(root)", "ok" if facts.config_user == f"{uid}:{gid}" else "error"
        ),
        _compared("user", want, got, "ok" if got == want else "error"),
    ]
    writable = seen.get("writable") or {}
    blocked = sorted(path for path, ok in writable.items() if not ok)
    places = f"home {seen.get('home')} and the workdir"
    checks.append(
        _compared(
            "user can write",
            places,
            "cannot write " + ", ".join(blocked) if blocked else ", ".join(sorted(writable)),
            "error" if blocked or not writable else "ok",
        )
    )
    unreadable = seen.get("unreadable") or {}
    count = int(unreadable.get("count", 0))
    listed = ", ".join(unreadable.get("first") or [])
    checks.append(
        _compared("user can read", "every installed file", f"{count} unreadable: {listed}" if count else "all", "error" if count else "ok")
    )
    imports = seen.get("imports") or {}
    # a distribution with no module (only scripts) has nothing to import; a missing one fails its package check
    missing = sorted(f"{module} ({dist}): {error}" for dist, modules in imports.items() for module, error in modules.items() if error)
    modules = sum(len(m) for m in imports.values())
    found = f"{modules} modules of {len(imports)} pinned packages found"
    checks.append(
        _compared(
            "user can import",
            "every pinned package's modules",
            "cannot import " + "; ".join(missing) if missing else found,
            "error" if missing else "ok",
        )
    )
    return checks


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.failed]
