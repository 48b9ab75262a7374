"""``ascendkit lock``: every Python package of an image, pinned with hashes, per stack and arch.

One uv resolution per (stack, arch), for the target's platform and CPython rather than the host's
(``uv pip compile --python-platform --python-version --generate-hashes``). Its inputs: the stack's
pins, one input file per pip layer of the image; the build requirements of the components built
from source; the stack's constraints and overrides; the indexes the matrix assigns.

vllm and vllm-ascend are installed from their sdists. uv cannot build those for another platform
to learn their dependencies, so ascendkit downloads each sdist (checked against the index's
sha256), reads the requirement file its setup.py installs from (vllm with
``VLLM_TARGET_DEVICE=empty``: ``requirements/common.txt``) and its ``[build-system] requires``,
and hands uv the first as static metadata; the second becomes the lock's ``build`` layer, which the
image installs before building those sdists without isolation.

The resolution is split by layer (each package goes to the first layer whose pins need it) and
written as a pip requirements file with a header: the sha256 of the matrix inputs it came from
(``render --check`` compares it), the status, and per package its hashes and the index it came
from. A target whose index cannot be reached gets a lock marked ``unresolved`` with the reason, so
the gap is written down and checked for staleness like any other lock, never silently filled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from buildkit.errors import InputError
from buildkit.fsio import write_atomic
from buildkit.lock.agreement import check_stack
from buildkit.lock.gitsource import GitSourceReader
from buildkit.lock.index import IndexClient, IndexUnreachable, ProjectMissing
from buildkit.lock.inputs import LockFailed, LockInputs, LockTarget, lock_inputs
from buildkit.lock.lockfile import lock_problem, render_lock, render_unresolved, write_sections
from buildkit.lock.metadata import MetadataReader, index_reader
from buildkit.lock.resolve import resolve
from buildkit.lock.sdist import SdistReader, public_url
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import PRIMARY_INDEX
from buildkit.settings import Mirrors


@dataclass(frozen=True)
class LockOutcome:
    target: LockTarget
    status: str  # "resolved", "unresolved", "failed"
    detail: str
    packages: int = 0
    changed: bool = False
    seconds: float = 0.0

    def describe(self) -> dict[str, object]:
        return {
            "stack": self.target.stack_id,
            "arch": self.target.arch,
            "lock": self.target.path,
            "status": self.status,
            "detail": self.detail,
            "packages": self.packages,
            "changed": self.changed,
            "seconds": round(self.seconds, 2),
        }


def _unreachable(client: IndexClient, inputs: LockInputs, index_urls: dict[str, str]) -> str | None:
    """The first index this target needs that does not answer, as a sentence; None if all answer."""
    probes = {index: dist for dist, index in inputs.assigned}
    for name, _ in inputs.indexes:
        try:
            client.project(index_urls[name], probes.get(name, "pip"))
        except IndexUnreachable as exc:
            return f"index {name} ({public_url(index_urls[name])}) could not be reached: {exc.why}"
        except ProjectMissing:
            pass  # it answered; a missing pin is reported by the resolution
    return None


def lock_one(
    loaded: LoadedMatrix,
    target: LockTarget,
    *,
    client: IndexClient,
    reader: SdistReader,
    index_urls: dict[str, str],
    ca_bundle: Path | None = None,
    upgrade: bool = False,
    write: bool = True,
    git: GitSourceReader | None = None,
    exclude_newer: str | None = None,
    agreement: bool = True,  # first hold the pins to each other's requirements (matrix verify has a row of its own)
) -> LockOutcome:
    started = time.monotonic()
    inputs = lock_inputs(loaded, target)
    git = git or GitSourceReader(loaded.root, keep=write)
    path = loaded.root / target.path
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    try:
        reason = inputs.unverified_archive or _unreachable(client, inputs, index_urls)
        if reason is not None:
            text, status, detail, count = render_unresolved(inputs, reason), "unresolved", reason, 0
        else:
            if agreement:
                _check_agreement(loaded, target, MetadataReader(client, reader), index_urls)
            sources = [
                reader.metadata(index_urls[_index_of(inputs, dist)], dist, version, inputs.project_of(dist))
                for dist, version in inputs.source_builds
            ]
            checkouts = tuple(git.requirements(spec) for spec in inputs.checkouts)
            previous = old if (old and not upgrade and "# status: resolved" in old) else None
            # narrowing hashes to the target's files costs an index query per package: only for a lock kept
            resolution = resolve(
                inputs,
                sources,
                index_urls,
                ca_bundle=ca_bundle,
                previous=previous,
                client=client if write else None,
                checkouts=checkouts,
                exclude_newer=exclude_newer,
            )
            text, status, count = render_lock(inputs, resolution), "resolved", sum(len(p) for p in resolution.layers.values())
            detail = f"{count} packages"
    except IndexUnreachable as exc:
        reason = str(exc)
        text, status, detail, count = render_unresolved(inputs, reason), "unresolved", reason, 0
    except (LockFailed, InputError) as exc:
        return LockOutcome(target, "failed", str(exc), seconds=time.monotonic() - started)
    if status == "unresolved" and old is not None and lock_problem(loaded.root, inputs) is None and "\n# status: resolved\n" in old:
        # an index that is down today does not undo a resolution of these very inputs: keep it
        text, detail = old, f"{detail}; kept the current resolved lock"
    changed = text != old
    if write:
        if changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        changed = bool(write_sections(loaded, target)) or changed
    return LockOutcome(target, status, detail, count, changed, time.monotonic() - started)


def _check_agreement(loaded: LoadedMatrix, target: LockTarget, metadata: MetadataReader, index_urls: dict[str, str]) -> None:
    """Before uv is asked: the pins meet each other's declared requirements (or the stack overrides
    them), so a conflict is named as the matrix has it, not as a resolver's search reports it."""
    stack = loaded.matrix.stacks[target.stack_id]
    read = index_reader(metadata, index_urls)
    found, _, _ = check_stack(target.stack_id, stack, target.arch, lambda component, pin: read(stack, target.arch, component, pin))
    conflicts = [d.message() for d in found if not d.overridden]
    if conflicts:
        raise LockFailed(
            "the pins disagree, so the resolver was not asked: "
            + "; ".join(conflicts)
            + " (change a pin, or name the package in the stack's overrides with the reason)"
        )


def _index_of(inputs: LockInputs, dist: str) -> str:
    return dict(inputs.assigned).get(dist, PRIMARY_INDEX)


def lock_all(
    loaded: LoadedMatrix,
    targets: list[LockTarget],
    *,
    index_urls: dict[str, str],
    ca_bundle: Path | None = None,
    upgrade: bool = False,
    jobs: int = 4,
    on_done: Callable[[LockOutcome], None] | None = None,
    git_hosts: dict[str, str] | None = None,
    exclude_newer: str | None = None,
) -> list[LockOutcome]:
    """Lock every target, ``jobs`` at a time; outcomes in the order of ``targets``. ``git_hosts``
    maps a git host's URL in the matrix to the mirror to read checkouts from; ``exclude_newer``
    resolves as the indexes stood at that time (:func:`check_exclude_newer`)."""
    client = IndexClient(ca_bundle=ca_bundle)
    reader = SdistReader(client)
    git = GitSourceReader(loaded.root, git_hosts)

    def one(target: LockTarget) -> LockOutcome:
        outcome = lock_one(
            loaded,
            target,
            client=client,
            reader=reader,
            index_urls=index_urls,
            ca_bundle=ca_bundle,
            upgrade=upgrade,
            git=git,
            exclude_newer=exclude_newer,
        )
        if on_done is not None:
            on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, targets))


def check_exclude_newer(value: str) -> str:
    """A point in time for uv's ``--exclude-newer``: a date (2026-11-25) or an RFC 3339 time
    (2026-11-25T00:00:00Z); anything else is refused before an index is asked."""
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"--exclude-newer {value!r}: a date (2026-11-25) or an RFC 3339 time (2026-11-25T00:00:00Z)") from None
    return value


def git_hosts_for(loaded: LoadedMatrix, mirrors: Mirrors) -> dict[str, str]:
    """A git host's URL in the matrix -> the mirror given for it (flag, environment, config file)."""
    redirected = mirrors.build_args()
    return {host.url: redirected[host.arg] for host in loaded.matrix.git_hosts.values() if redirected.get(host.arg)}


def index_urls_for(loaded: LoadedMatrix, mirrors: Mirrors) -> dict[str, str]:
    """Index name -> URL to use: the mirror given for it (flag, environment, config file), else the matrix's."""
    redirected = mirrors.build_args()
    return {name: redirected.get(index.arg) or index.url for name, index in loaded.matrix.indexes.items()}
