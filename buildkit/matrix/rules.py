"""Compatibility rules over a structurally valid :class:`~buildkit.matrix.model.Matrix`.

Each rule is a plain function registered once in :data:`RULES`; it yields :class:`Violation`
values naming the field path, what is wrong and what would be valid. The loader turns paths into
file/line/column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit.framework import frameworks
from buildkit.matrix.model import FrameworkSource, Matrix, PypiPin, Stack, stanza_kind
from buildkit.violation import PathKey, Violation

Rule = Callable[[Matrix], Iterator[Violation]]
RULES: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[rule_id] = fn
        return fn

    return register


def base_version(version: str) -> str:
    """``2.7.1.post2`` -> ``2.7.1``; ``2.5.1rc1`` -> ``2.5.1``; local labels dropped."""
    return Version(version).base_version


def minor_line(version: str) -> str:
    """``2.10.0.post4`` -> ``2.10``."""
    v = Version(version)
    return f"{v.major}.{v.minor}"


def cann_minor(cann: str) -> str:
    """``8.3.RC1`` -> ``8.3``."""
    major, minor, _ = cann.split(".", 2)
    return f"{major}.{minor}"


def expected_torchvision(torch: str) -> str:
    """torchvision follows torch 2.N.p as 0.(N+15).p (2.5.1 -> 0.20.1, 2.10.0 -> 0.25.0)."""
    v = Version(torch)
    return f"0.{v.minor + 15}.{v.micro}"


def _stacks(matrix: Matrix) -> Iterator[tuple[str, Stack]]:
    yield from matrix.stacks.items()


def _no_fact(path: PathKey, what: str, table: str, key: str, known: Iterable[str]) -> Violation:
    """A stack needs a fact the compat tables do not hold: say which row to add."""
    return Violation(path, f"no {what} is recorded", hint=f'add compat.{table}."{key}" (known: {", ".join(known)})')


@rule("torch-npu-matches-torch")
def torch_npu_matches_torch(matrix: Matrix) -> Iterator[Violation]:
    """torch_npu X.Y.Z[.postN] needs torch == X.Y.Z exactly."""
    for name, stack in _stacks(matrix):
        want = base_version(stack.torch_npu.version)
        if Version(stack.torch.version) != Version(want):
            yield Violation(
                ("stacks", name, "torch_npu", "version"),
                f"torch_npu {stack.torch_npu.version} is built for torch {want}, but the stack pins torch {stack.torch.version}",
                hint=f"torch {want}, or a torch_npu {stack.torch.version}[.postN] release",
            )


@rule("torchvision-matches-torch")
def torchvision_matches_torch(matrix: Matrix) -> Iterator[Violation]:
    for name, stack in _stacks(matrix):
        want = expected_torchvision(stack.torch.version)
        if Version(base_version(stack.torchvision.version)) != Version(want):
            yield Violation(
                ("stacks", name, "torchvision", "version"),
                f"torchvision {stack.torchvision.version} does not match torch {stack.torch.version}; "
                "a mismatched torchvision makes pip replace torch and breaks torch_npu",
                hint=f"torchvision {want}",
            )


@rule("vllm-ascend-pairs-vllm")
def vllm_ascend_pairs_vllm(matrix: Matrix) -> Iterator[Violation]:
    for name, stack in _stacks(matrix):
        if stack.vllm is None or stack.vllm_ascend is None:
            continue
        plugin, core = minor_line(stack.vllm_ascend.version), minor_line(stack.vllm.version)
        if plugin != core:
            yield Violation(
                ("stacks", name, "vllm_ascend", "version"),
                f"vllm-ascend {stack.vllm_ascend.version} is the plugin for vllm {plugin}.*, but the stack pins vllm {stack.vllm.version}",
                hint=f"a vllm-ascend {core}.* release, or vllm {plugin}.*",
            )


@rule("python-supported-by-torch")
def python_supported_by_torch(matrix: Matrix) -> Iterator[Violation]:
    table = matrix.compat.torch_python
    for name, stack in _stacks(matrix):
        line = minor_line(stack.torch.version)
        spec = table.get(line)
        if spec is None:
            yield _no_fact(("stacks", name, "torch", "version"), f"Python range for torch {line}", "torch_python", line, table)
        elif Version(stack.python) not in SpecifierSet(spec):
            yield Violation(
                ("stacks", name, "python"),
                f"Python {stack.python} is outside what torch {line} / torch_npu publish wheels for ({spec})",
                hint=f"a Python in {spec}",
            )


@rule("python-offered-by-cann-base")
def python_offered_by_cann_base(matrix: Matrix) -> Iterator[Violation]:
    table = matrix.compat.cann_python
    for name, stack in _stacks(matrix):
        line = cann_minor(stack.cann)
        offered = table.get(line)
        if offered is None:
            yield _no_fact(("stacks", name, "cann"), f"base-image Python for CANN {line}", "cann_python", line, table)
        elif stack.python not in offered:
            yield Violation(
                ("stacks", name, "python"),
                f"no official CANN {stack.cann} base image ships Python {stack.python}",
                hint=f"one of {', '.join(offered)}",
            )


@rule("cann-has-driver-range")
def cann_has_driver_range(matrix: Matrix) -> Iterator[Violation]:
    """Every stack's CANN names the host drivers it runs on: doctor judges a node's driver by them."""
    table = matrix.compat.cann_drivers
    for name, stack in _stacks(matrix):
        if stack.cann not in table:
            yield _no_fact(("stacks", name, "cann"), f"Ascend HDK (driver) range for CANN {stack.cann}", "cann_drivers", stack.cann, table)


@rule("torch-npu-matches-cann")
def torch_npu_matches_cann(matrix: Matrix) -> Iterator[Violation]:
    table = matrix.compat.torch_npu_cann
    for name, stack in _stacks(matrix):
        version = stack.torch_npu.version
        canns = table.get(version)
        if canns is None:
            yield _no_fact(
                ("stacks", name, "torch_npu", "version"), f"CANN release for torch_npu {version}", "torch_npu_cann", version, table
            )
        elif stack.cann not in canns:
            fits = [v for v, cs in table.items() if stack.cann in cs]
            yield Violation(
                ("stacks", name, "torch_npu", "version"),
                f"torch_npu {version} belongs to CANN {', '.join(canns)}, not {stack.cann}",
                hint=f"for CANN {stack.cann}: torch_npu {', '.join(fits) or '(none recorded)'}",
            )


@rule("known-issues")
def known_issues(matrix: Matrix) -> Iterator[Violation]:
    for name, stack in _stacks(matrix):
        for issue in matrix.compat.known_issues:
            if issue.torch_npu == stack.torch_npu.version and issue.cann == stack.cann:
                yield Violation(
                    ("stacks", name, "torch_npu", "version"),
                    f"torch_npu {issue.torch_npu} with CANN {issue.cann}: {issue.reason}",
                    hint="a torch_npu release recorded for this CANN without a known issue" if issue.severity == "error" else "",
                    severity=issue.severity,
                )


@rule("one-framework")
def one_framework(matrix: Matrix) -> Iterator[Violation]:
    """An image carries one RL framework, named by its plug-in (buildkit/frameworks/) and in the form
    the plug-in installs it: an index pin, or a git checkout. (A key no plug-in owns is refused with
    the structure, as an unknown key.)"""
    known = frameworks()
    for name, stack in _stacks(matrix):
        given = list(stack.frameworks)
        for key in given:
            plugin = known.get(key)
            if plugin is not None and stanza_kind(stack.frameworks[key]) != plugin.install:
                form = "{repo, ref, version, requirements}" if plugin.install == "checkout" else "{version: ...}"
                yield Violation(
                    ("stacks", name, key),
                    f"{plugin.title} is built from "
                    + ("a git checkout" if plugin.install == "checkout" else "a release of the package index"),
                    hint=f"{key}: {form}",
                )
        if len(given) != 1:
            yield Violation(
                ("stacks", name),
                f"the stack names {' and '.join(given) if given else 'no framework'}; an image carries exactly one",
                hint=" or ".join(f"`{f.name}: {{...}}`" for f in known.values()),
            )


@rule("patches-name-pins")
def patches_name_pins(matrix: Matrix) -> Iterator[Violation]:
    """A patch changes a distribution the stack installs at a pinned version (the line it removes is
    only known to be there in that version)."""
    for name, stack in _stacks(matrix):
        dists = {canonical(pin.dist(component)): component for component, pin in stack.pins().items()}
        for i, patch in enumerate(stack.patches):
            if canonical(patch.package) not in dists:
                yield Violation(
                    ("stacks", name, "patches", i, "package"),
                    f"{patch.package} is not a pin of the stack: a patch needs the exact version it was written for",
                    hint=", ".join(sorted(dists)),
                )


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@rule("one-default-stack")
def one_default_stack(matrix: Matrix) -> Iterator[Violation]:
    defaults = [name for name, stack in _stacks(matrix) if stack.default]
    if not defaults:
        yield Violation(("stacks",), "no stack is marked `default: true`", hint="exactly one default stack")
    for name in defaults[1:]:
        yield Violation(
            ("stacks", name, "default"),
            f"more than one default stack ({', '.join(defaults)})",
            hint="exactly one stack with `default: true`",
        )


@rule("references-exist")
def references_exist(matrix: Matrix) -> Iterator[Violation]:
    """Every SKU, chip, index, repo and git host named somewhere is defined."""
    for sku_id, sku in matrix.skus.items():
        if sku.chip not in matrix.chips:
            yield Violation(("skus", sku_id, "chip"), f"unknown chip {sku.chip!r}", hint=", ".join(matrix.chips))
    for sku_id in matrix.ci.smoke_runners:
        if sku_id not in matrix.skus:
            yield Violation(("ci", "smoke_runners", sku_id), f"unknown SKU {sku_id!r}", hint=", ".join(matrix.skus))
    for repo_id, repo in matrix.repos.items():
        if repo.host not in matrix.git_hosts:
            yield Violation(
                ("repos", repo_id, "host"), f"unknown git host {repo.host!r}", hint=", ".join(matrix.git_hosts) or "define git_hosts"
            )
    for name, stack in _stacks(matrix):
        for i, sku_id in enumerate(stack.skus):
            if sku_id not in matrix.skus:
                yield Violation(("stacks", name, "skus", i), f"unknown SKU {sku_id!r}", hint=", ".join(matrix.skus))
        for component, pin in stack.pins().items():
            yield from _index_refs(matrix, ("stacks", name, component), pin)
        named: list[tuple[str, str]] = [(component, git.repo) for component, git in stack.git_pins().items()]
        named += [(c, source.repo) for c, source in stack.frameworks.items() if isinstance(source, FrameworkSource)]
        named += [("sgl_kernel_npu", stack.sgl_kernel_npu.repo)] if stack.sgl_kernel_npu is not None else []
        for component, repo_id in named:
            if repo_id not in matrix.repos:
                yield Violation(
                    ("stacks", name, component, "repo"), f"unknown repo {repo_id!r}", hint=", ".join(matrix.repos) or "define repos"
                )


def _index_refs(matrix: Matrix, path: PathKey, pin: PypiPin) -> Iterator[Violation]:
    known = ", ".join(matrix.indexes)
    if pin.index not in matrix.indexes:
        yield Violation((*path, "index"), f"unknown index {pin.index!r}", hint=known)
    for arch, index in pin.index_by_arch.items():
        if index not in matrix.indexes:
            yield Violation((*path, "index_by_arch", arch), f"unknown index {index!r}", hint=known)


_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


@rule("git-ref-is-commit")
def git_ref_is_commit(matrix: Matrix) -> Iterator[Violation]:
    """A branch or tag can move, so the image it builds is not reproducible (a warning: the hosts
    that would resolve it to a commit are not always reachable where the matrix is edited)."""
    for name, stack in _stacks(matrix):
        for component, git in stack.git_pins().items():
            if not _COMMIT.match(git.ref):
                yield Violation(
                    ("stacks", name, component, "ref"),
                    f"{component.replace('_', '-')} ref {git.ref!r} is a branch or tag, which can move; pin the commit it names "
                    "(each build records it in /etc/ascendkit/git-revisions.txt)",
                    hint="a commit id (7-40 hex digits)",
                    severity="warning",
                )


@rule("hw-names-unambiguous")
def hw_names_unambiguous(matrix: Matrix) -> Iterator[Violation]:
    """`--hw` takes SKU and chip ids; a name that is both must mean the same chip."""
    for sku_id, sku in matrix.skus.items():
        if sku_id in matrix.chips and sku.chip != sku_id:
            yield Violation(
                ("skus", sku_id, "chip"),
                f"{sku_id!r} is also a chip id, so `--hw {sku_id}` would be ambiguous",
                hint=f"chip: {sku_id}, or rename the SKU",
            )


@rule("build-args-unique")
def build_args_unique(matrix: Matrix) -> Iterator[Violation]:
    """Index and git-host ARG names become Dockerfile build ARGs and must not collide."""
    seen: dict[str, PathKey] = {}
    owners = [(("indexes", k, "arg"), v.arg) for k, v in matrix.indexes.items()]
    owners += [(("git_hosts", k, "arg"), v.arg) for k, v in matrix.git_hosts.items()]
    for path, arg in owners:
        if arg in seen or arg in RESERVED_ARGS:
            yield Violation(path, f"build ARG {arg} is already used", hint="a unique upper-case name")
        seen[arg] = path


# ARGs the Dockerfile template declares itself.
RESERVED_ARGS = frozenset({"BASE_REGISTRY", "BASE_IMAGE", "APT_MIRROR", "PIP_EXTRA_INDEX_URL", "SOC_VERSION"})
