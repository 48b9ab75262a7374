"""What one lock is made from: the (stack, arch) target and the inputs the plan and matrix give it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from buildkit.arch import ARCHES, Arch
from buildkit.errors import AscendkitError, ExitCode, InputError
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import Stack
from buildkit.plan import LOCKS_DIR, PRIMARY_INDEX, lock_path, stack_layers

LOCK_FORMAT = 1
# The oldest glibc among the base OSes (Ubuntu 22.04: 2.35), so no locked wheel needs a newer one.
GLIBC = "2_35"
# Where a source-built component's runtime requirements live in its sdist, first match wins: vllm
# >= 0.8 (requirements/common.txt with VLLM_TARGET_DEVICE=empty), vllm 0.7, vllm-ascend. Without
# one, the sdist's PKG-INFO Requires-Dist.
REQUIREMENT_FILES = ("requirements/common.txt", "requirements-common.txt", "requirements.txt")
# pip's build requirements for an sdist that declares none (PEP 517 fallback for setup.py).
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
UV_TIMEOUT_S = 600


class LockFailed(AscendkitError):
    """The pins do not resolve together, or the resolution breaks a rule of the matrix."""

    exit_code = ExitCode.CHECK_FAILED


@dataclass(frozen=True)
class LockTarget:
    stack_id: str
    arch: Arch

    @property
    def path(self) -> str:
        return lock_path(self.stack_id, self.arch)

    @property
    def name(self) -> str:
        return f"{self.stack_id}-{self.arch}"


def canon(name: str) -> str:
    return str(canonicalize_name(name))


def python_platform(arch: str) -> str:
    return f"{arch}-manylinux_{GLIBC}"


@dataclass(frozen=True)
class CheckoutSpec:
    """A framework built from a git checkout in one layer: the lock resolves its requirements file."""

    layer: str  # the image layer (and distribution) it is built in
    repo_id: str
    repo_path: str  # e.g. zhuo97/OpenRLHF.git (OpenRLHF's Ascend fork)
    host_url: str  # the official host the matrix names
    commit: str
    file: str  # the requirements file its setup.py reads, relative to the repository
    install_env: tuple[tuple[str, str], ...] = ()

    @property
    def stored(self) -> str:
        """Where the file is kept once read, relative to the matrix's directory (``locks/_sources``)."""
        return f"{SOURCES_DIR}/{self.repo_id}/{self.commit}/{self.file}"

    @property
    def url(self) -> str:
        return f"{self.host_url.rstrip('/')}/{self.repo_path}"


SOURCES_DIR = f"{LOCKS_DIR}/_sources"  # "_" keeps it apart from the per-stack section folders


@dataclass(frozen=True)
class LockInputs:
    """Everything from the matrix a lock depends on; its digest goes into the lock's header."""

    target: LockTarget
    python: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]  # (layer, pinned requirements), in build order
    source_builds: tuple[tuple[str, str], ...]  # (dist, version) installed from the sdist
    constraints: tuple[str, ...]
    overrides: tuple[str, ...]
    indexes: tuple[tuple[str, str], ...]  # (name, matrix URL): the primary first, then the extras
    assigned: tuple[tuple[str, str], ...]  # (dist, index name) for every pin
    triton_ascend: str = ""  # the triton-ascend pin's dist, when the stack has one (the CUDA triton must stay out)
    order: tuple[str, ...] = ()  # every pip layer of the image in build order, the pinless build layer included
    checkouts: tuple[CheckoutSpec, ...] = ()  # frameworks built from a checkout: their requirements file is read at lock time
    leaves_out: tuple[str, ...] = ()  # canonical names no package of the lock may be (the framework's NPU install drops them)
    projects: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (dist, project file, extras): sdists built with another pyproject
    archives: tuple[tuple[str, str], ...] = ()  # (archive file, sha256 or ""): wheels from release archives, for this arch

    def project_of(self, dist: str) -> tuple[str, tuple[str, ...]] | None:
        """The project file and extras a source build reads its requirements from, when not its own pyproject."""
        return next(((file, extras) for d, file, extras in self.projects if canon(d) == canon(dist)), None)

    @property
    def unverified_archive(self) -> str | None:
        """Why this target cannot be resolved: a release archive it installs has no known sha256."""
        missing = [file for file, sha in self.archives if not sha]
        if not missing:
            return None
        return f"no sha256 is known for the release archive {', '.join(missing)} (compat_matrix.yaml sgl_kernel_npu.sha256)"

    @property
    def platform(self) -> str:
        return python_platform(self.target.arch)

    def digest(self) -> str:
        data = {
            "format": LOCK_FORMAT,
            "stack": self.target.stack_id,
            "arch": self.target.arch,
            "python": self.python,
            "platform": self.platform,
            "layers": self.layers,
            "source_builds": self.source_builds,
            "constraints": self.constraints,
            "overrides": self.overrides,
            "indexes": self.indexes,
            "assigned": self.assigned,
        }
        # Added only when a stack has them, so the locks of stacks without them keep their digest.
        if self.checkouts:
            data["checkouts"] = [
                [c.layer, c.repo_path, c.host_url, c.commit, c.file, [list(pair) for pair in c.install_env]] for c in self.checkouts
            ]
        if self.leaves_out:
            data["leaves_out"] = list(self.leaves_out)
        if self.projects:
            data["projects"] = [[d, f, list(e)] for d, f, e in self.projects]
        if self.archives:
            data["archives"] = [list(a) for a in self.archives]
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def pinned(self) -> dict[str, str]:
        """Canonical dist name -> exact version, for every pin of the stack."""
        result = {}
        for _, requirements in self.layers:
            for requirement in requirements:
                name, _, version = requirement.partition("==")
                result[canon(name)] = version
        return result


def lock_targets(loaded: LoadedMatrix, stack: str | None = None, arch: str | None = None) -> list[LockTarget]:
    """Every (stack, arch) the matrix supports, narrowed by ``--stack`` / ``--arch``."""
    stacks = loaded.matrix.stacks
    if stack is not None and stack not in stacks:
        raise InputError(f"unknown --stack {stack!r}; the matrix has: {', '.join(stacks)}")
    if arch is not None and arch not in ARCHES:
        raise InputError(f"unknown --arch {arch!r}; choose one of: {', '.join(ARCHES)}")
    targets = []
    for stack_id, st in stacks.items():
        if stack is not None and stack_id != stack:
            continue
        for a in st.arches:
            if arch is None or a == arch:
                targets.append(LockTarget(stack_id, a))
    if not targets:
        raise InputError(f"stack {stack!r} is not built for --arch {arch!r}")
    return targets


def lock_inputs(loaded: LoadedMatrix, target: LockTarget) -> LockInputs:
    matrix = loaded.matrix
    stack: Stack = matrix.stacks[target.stack_id]
    planned = stack_layers(stack, matrix.installer)
    layers = tuple((layer.name, tuple(p.requirement for p in layer.pins)) for layer in planned.all if layer.pins)
    dists = {p.dist: p for layer in planned.all for p in layer.pins}
    assigned = []
    for component, pin in stack.pins().items():
        assigned.append((_pin_dist(stack, component), pin.index_for(target.arch)))
    used = sorted({index for _, index in assigned} - {PRIMARY_INDEX})
    constraints = {**stack.constraints, **stack.constraints_by_arch.get(target.arch, {})}
    checkouts: tuple[CheckoutSpec, ...] = ()
    if (source := stack.framework_source) is not None:
        repo = matrix.repos[source.repo]
        checkouts = (
            CheckoutSpec(
                planned.framework.name,
                source.repo,
                repo.path,
                matrix.git_hosts[repo.host].url,
                source.ref,
                source.requirements,
                tuple(sorted(source.install_env.items())),
            ),
        )
    return LockInputs(
        target=target,
        python=stack.python,
        layers=layers,
        source_builds=tuple((p.dist, p.version) for p in dists.values() if p.from_source),
        constraints=tuple(f"{name}{spec}" for name, spec in sorted(constraints.items())),
        overrides=tuple(f"{name}{spec}" for name, spec in sorted(stack.overrides.items())),
        indexes=tuple((name, matrix.indexes[name].url) for name in [PRIMARY_INDEX, *used]),
        assigned=tuple(sorted(assigned)),
        triton_ascend=_pin_dist(stack, "triton_ascend"),
        order=planned.names,
        checkouts=checkouts,
        leaves_out=tuple(sorted(canon(n) for n in source.leaves_out)) if source else (),
        projects=tuple(
            (_pin_dist(stack, c), pin.project_file, pin.extras) for c, pin in stack.pins().items() if pin.project_file is not None
        ),
        archives=_archives(loaded, stack, target.arch),
    )


def _archives(loaded: LoadedMatrix, stack: Stack, arch: str) -> tuple[tuple[str, str], ...]:
    """Every release archive the stack's images install on ``arch`` (one per chip), with its sha256."""
    archive = stack.sgl_kernel_npu
    if archive is None:
        return ()
    names = (archive.filename(chip, arch) for chip in loaded.matrix.stack_chips(stack))
    return tuple((name, archive.sha256.get(name, "")) for name in names)


def _pin_dist(stack: Stack, component: str) -> str:
    pin = stack.pins().get(component)
    return "" if pin is None else canon(pin.dist(component))
