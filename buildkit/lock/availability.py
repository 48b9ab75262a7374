"""Does every pin of the matrix exist where the matrix says, for each target arch and Python?

``check_matrix`` asks each pin's index (PyPI, the PyTorch CPU index, Ascend's index, or a mirror
given instead) for the pinned version with a file the target can install: a matching wheel, or
the sdist for pins built from source. Git refs are asked of their host with ``git ls-remote``.
Every answer is one of: found, missing (with the versions that do exist), or unverified (the
index or host could not be reached) - never a silent "ok". ``check_together`` then asks whether
each (stack, arch) whose pins were all found resolves as a whole (the lock's resolution, nothing
written): found, or conflict with the resolver's explanation.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import requests
from packaging.version import Version

from buildkit.arch import ARCHES
from buildkit.doctor.base import Check
from buildkit.lock.agreement import check_stack
from buildkit.lock.gitsource import GitSourceReader
from buildkit.lock.index import IndexClient, IndexUnreachable, ProjectMissing, installable, target_tags
from buildkit.lock.inputs import CheckoutSpec, LockFailed, LockTarget, lock_inputs
from buildkit.lock.lockfile import lock_problem, read_lock
from buildkit.lock.metadata import Reader
from buildkit.lock.relock import lock_one
from buildkit.lock.sdist import SdistReader
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import GitPin, Matrix, PypiPin, Stack, WheelArchive

Finding = Literal["found", "missing", "unverified", "conflict"]  # what the index said of the pin
CHECK_STATUS = {"found": "ok", "missing": "error", "conflict": "error", "unverified": "warn"}  # as a Check
COMPONENT_SET = "co-resolution"  # the row of a (stack, arch) that checks every pin resolves together
COMPONENT_AGREE = "declared-requirements"  # the row of a (stack, arch) that checks the pins meet each other's requirements
_SHA = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class PinCheck:
    stack: str
    arch: str
    component: str
    package: str
    version: str
    source: str  # index URL or git URL
    finding: Finding
    detail: str = ""
    available: tuple[str, ...] = field(default=())

    @property
    def check(self) -> Check:
        """The pin's availability as a check: a missing or conflicting pin fails, an unverified one warns."""
        what = {COMPONENT_SET: "every pin together", COMPONENT_AGREE: "the pins' requirements"}.get(
            self.component, f"{self.package}=={self.version}"
        )
        return Check(f"{self.stack} {self.arch} {what}", CHECK_STATUS[self.finding], self.detail or self.finding)

    def describe(self) -> dict[str, object]:
        return {**self.__dict__, "available": list(self.available), "status": self.check.status}


def _check_pypi(client: IndexClient, index_url: str, stack_id: str, stack: Stack, arch: str, component: str, pin: PypiPin) -> PinCheck:
    package = pin.dist(component)
    base = PinCheck(stack_id, arch, component, package, pin.version, index_url, "found")
    try:
        project = client.project(index_url, package)
    except IndexUnreachable as exc:
        return _with(base, "unverified", str(exc))
    except ProjectMissing:
        return _with(base, "missing", f"no project {package} on {index_url}")
    tags = target_tags(arch, stack.python)
    wanted = Version(pin.version)
    usable = [f for f in project.files if installable(f, tags, stack.python)]
    if pin.build_from_source:
        usable = [f for f in usable if f.kind == "sdist"]
    if any(f.version == wanted for f in usable):
        return base
    versions = sorted({f.version for f in usable}, reverse=True)
    available = tuple(str(v) for v in versions[:10])
    target = f"{arch}, Python {stack.python}"
    anywhere = any(f.version == wanted for f in project.files)
    if not anywhere:
        reason = f"{package}=={pin.version} is not on {index_url}"
    elif pin.build_from_source:
        reason = f"{package}=={pin.version} has no sdist on {index_url} to build from"
    else:
        reason = f"{package}=={pin.version} is on {index_url} but has no file for {target}"
    reason += f" ({target})" if not reason.endswith(target) else ""
    return _with(base, "missing", f"{reason}; available: {', '.join(available) or 'nothing installable'}", available)


def _with(check: PinCheck, finding: Finding, detail: str, available: tuple[str, ...] = ()) -> PinCheck:
    return PinCheck(check.stack, check.arch, check.component, check.package, check.version, check.source, finding, detail, available)


@functools.lru_cache(maxsize=256)
def _ls_remote(url: str, ref: str, timeout: float) -> tuple[Finding, str]:
    """One ``git ls-remote`` per repository and ref, however many stacks and arches pin it."""
    try:
        proc = subprocess.run(
            ["git", "ls-remote", url, ref, f"refs/tags/{ref}", f"refs/heads/{ref}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin:/usr/local/bin"},
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        return "unverified", f"git host unreachable: {exc.__class__.__name__}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no answer"])[-1].removeprefix("fatal: ")
        return "unverified", f"git host unreachable: {last}"
    if proc.stdout.strip():
        return "found", ""
    if _SHA.match(ref):
        return "unverified", "a commit id: hosts do not advertise commits; the build checks it out"
    return "missing", f"no tag or branch {ref} in {url}"


def _check_source(spec: CheckoutSpec, stack_id: str, arch: str, version: str, timeout: float) -> PinCheck:
    """A framework built from a checkout: its commit fetched from the host, its requirements file read there."""
    base = PinCheck(stack_id, arch, spec.layer, spec.layer, version, f"{spec.url}@{spec.commit}", "found")
    try:
        GitSourceReader(Path(), keep=False, timeout=timeout).fetch(spec)
    except LockFailed as exc:
        return _with(base, "missing", str(exc))
    except IndexUnreachable as exc:
        return _with(base, "unverified", f"git host unreachable: {exc.why}")
    return base


def _check_archive(client: IndexClient, url: str, stack_id: str, arch: str, archive: WheelArchive, sha256: str) -> PinCheck:
    """A release archive (sgl-kernel-npu): asked for with HEAD; whether its sha256 is recorded is said too."""
    base = PinCheck(stack_id, arch, "sgl_kernel_npu", url.rsplit("/", 1)[-1], archive.release, url, "found")
    try:
        answer = client.session.head(url, allow_redirects=True, timeout=client.timeout)
    except requests.RequestException as exc:
        return _with(base, "unverified", f"host unreachable: {exc.__class__.__name__}")
    if answer.status_code == 404:
        return _with(base, "missing", f"no release asset {base.package} at {url}")
    if answer.status_code >= 400:
        return _with(base, "unverified", f"the host answered HTTP {answer.status_code}")
    return base if sha256 else _with(base, "found", "no sha256 recorded: the stack's locks stay unresolved until it is")


def _check_git(url: str, stack_id: str, arch: str, component: str, pin: GitPin, timeout: float) -> PinCheck:
    base = PinCheck(stack_id, arch, component, component.replace("_", "-"), pin.ref, url, "found")
    finding, detail = _ls_remote(url, pin.ref, timeout)
    return base if finding == "found" else _with(base, finding, detail)


def check_matrix(
    matrix: Matrix,
    client: IndexClient,
    *,
    stacks: Iterable[str] | None = None,
    arches: Iterable[str] | None = None,
    index_urls: dict[str, str] | None = None,
    git_timeout: float = 20.0,
    workers: int = 16,
) -> list[PinCheck]:
    """Check every pin of the chosen stacks and arches, in parallel; results in matrix order."""
    urls = {name: (index_urls or {}).get(name, index.url) for name, index in matrix.indexes.items()}
    chosen = list(stacks) if stacks is not None else list(matrix.stacks)
    wanted_arches = list(arches) if arches is not None else list(ARCHES)
    jobs: list[tuple[str, str, Stack, str, str, PypiPin | GitPin | CheckoutSpec | str]] = []
    for stack_id in chosen:
        stack = matrix.stacks[stack_id]
        for arch in (a for a in wanted_arches if a in stack.arches):
            for component, pin in stack.pins().items():
                jobs.append(("pypi", stack_id, stack, arch, component, pin))
            for component, git in stack.git_pins().items():
                jobs.append(("git", stack_id, stack, arch, component, git))
            if (source := stack.framework_source) is not None:
                repo = matrix.repos[source.repo]
                name = stack.framework
                spec = CheckoutSpec(name, source.repo, repo.path, matrix.git_hosts[repo.host].url, source.ref, source.requirements)
                jobs.append(("source", stack_id, stack, arch, name, spec))
            if stack.sgl_kernel_npu is not None:
                archive = stack.sgl_kernel_npu
                repo = matrix.repos[archive.repo]
                base = f"{matrix.git_hosts[repo.host].url}/{archive.release_path(repo.path)}"
                for chip in matrix.stack_chips(stack):
                    jobs.append(("archive", stack_id, stack, arch, chip, f"{base}/{archive.filename(chip, arch)}"))

    def run(job: tuple[str, str, Stack, str, str, PypiPin | GitPin | CheckoutSpec | str]) -> PinCheck:
        kind, stack_id, stack, arch, component, pin = job
        if kind == "archive":
            assert isinstance(pin, str) and stack.sgl_kernel_npu is not None
            return _check_archive(
                client, pin, stack_id, arch, stack.sgl_kernel_npu, stack.sgl_kernel_npu.sha256.get(pin.rsplit("/", 1)[-1], "")
            )
        if kind == "source":
            assert isinstance(pin, CheckoutSpec)
            return _check_source(pin, stack_id, arch, stack.framework_version, git_timeout)
        if kind == "git":
            assert isinstance(pin, GitPin)
            repo = matrix.repos[pin.repo]
            url = f"{matrix.git_hosts[repo.host].url}/{repo.path}"
            return _check_git(url, stack_id, arch, component, pin, git_timeout)
        assert isinstance(pin, PypiPin)
        return _check_pypi(client, urls[pin.index_for(arch)], stack_id, stack, arch, component, pin)  # type: ignore[arg-type]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, jobs))


def summarize(checks: list[PinCheck]) -> dict[str, int]:
    return {finding: sum(1 for c in checks if c.finding == finding) for finding in ("found", "missing", "unverified", "conflict")}


def check_together(
    loaded: LoadedMatrix,
    checks: list[PinCheck],
    index_urls: dict[str, str],
    *,
    ca_bundle: Path | None = None,
    jobs: int = 4,
    fresh: bool = False,
) -> list[PinCheck]:
    """One row per (stack, arch): do all its pins resolve together for the target?

    A current, resolved lock already answers it: it is the resolver's output for exactly these
    inputs. Otherwise (or with ``fresh``) the target is resolved as ``ascendkit lock`` would,
    without writing. Not attempted (unverified) when one of its PyPI-style pins is missing or was
    not verified (git refs are not part of the resolution)."""
    client = IndexClient(ca_bundle=ca_bundle)
    reader = SdistReader(client)
    targets = list(dict.fromkeys((c.stack, c.arch) for c in checks))

    def one(key: tuple[str, str]) -> PinCheck:
        stack_id, arch = key
        base = PinCheck(stack_id, arch, COMPONENT_SET, "every pin", "", "uv pip compile", "found")
        pip_components = loaded.matrix.stacks[stack_id].pins()
        rows = [c for c in checks if (c.stack, c.arch) == key and c.component in pip_components]
        if any(c.finding != "found" for c in rows):
            return _with(base, "unverified", "not attempted: a pin is missing or its index did not answer")
        target = LockTarget(stack_id, arch)  # type: ignore[arg-type]  # arches come from the matrix
        if not fresh and lock_problem(loaded.root, lock_inputs(loaded, target)) is None:
            lock = read_lock(loaded.root / target.path)
            if lock.resolved:
                return _with(base, "found", f"{target.path} is current: {len(lock.packages)} packages resolved from these pins")
        # the pins' agreement has a row of its own (check_agreement): the resolver alone answers this one
        outcome = lock_one(
            loaded, target, client=client, reader=reader, index_urls=index_urls, ca_bundle=ca_bundle, write=False, agreement=False
        )
        if outcome.status == "resolved":
            return _with(base, "found", outcome.detail)
        return _with(base, "conflict" if outcome.status == "failed" else "unverified", outcome.detail)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, targets))


def check_agreement(
    loaded: LoadedMatrix, reader: Reader, *, stacks: Iterable[str] | None = None, arches: Iterable[str] | None = None
) -> tuple[list[PinCheck], list[str]]:
    """One row per (stack, arch): does every pin meet what the others declare they require
    (:mod:`buildkit.lock.agreement`)? A disagreement the stack does not override is a conflict;
    pins whose metadata could not be read leave the row unverified. Returns the rows and a warning
    per override that no longer overrides anything."""
    rows: list[PinCheck] = []
    warnings: list[str] = []
    wanted = list(arches) if arches is not None else list(ARCHES)
    for stack_id in stacks if stacks is not None else list(loaded.matrix.stacks):
        stack = loaded.matrix.stacks[stack_id]
        for arch in (a for a in wanted if a in stack.arches):
            found, unused, unread = check_stack(stack_id, stack, arch, functools.partial(reader, stack, arch))
            base = PinCheck(stack_id, arch, COMPONENT_AGREE, "every pin", "", "the pins' metadata", "found")
            conflicts = [d for d in found if not d.overridden]
            if conflicts:
                rows.append(_with(base, "conflict", "; ".join(d.message() for d in conflicts)))
            elif unread:
                rows.append(_with(base, "unverified", f"the metadata of {', '.join(unread)} could not be read"))
            else:
                overridden = sum(d.overridden for d in found)
                rows.append(_with(base, "found", f"every requirement met ({overridden} by the stack's overrides)" if overridden else ""))
            warnings += [
                f"{stack_id} {arch}: the override of {name} overrides nothing (every pin's requirement allows its pin): remove it"
                for name in unused
            ]
    return rows, sorted(set(warnings))
