"""``ascendkit matrix outdated``: newer releases of each pin on its own index, judged by the rules.

For every PyPI pin of a stack, the index the matrix assigns it (per arch) is asked for its stable
releases that the target can install on every arch of the stack. A newer one is then tried in the
matrix, alone and together with the other bumps, and kept only if no compatibility rule refuses
it (torch / torch_npu / CANN facts, the vllm / vllm-ascend pairing, ...). An index that cannot be
reached makes that pin "unreachable": nothing is guessed for it. ``propose`` writes a new stack
stanza from an existing one with the accepted bumps, each commented with where it came from.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from buildkit.errors import InputError
from buildkit.lock.index import IndexClient, IndexUnreachable, ProjectMissing, installable, target_tags
from buildkit.matrix import ruleset
from buildkit.matrix.load import LoadedMatrix, read_matrix_text, resolve_stack
from buildkit.matrix.model import Matrix, Stack

_IDENTIFIER = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class PinNews:
    stack: str
    component: str
    package: str
    pinned: str
    status: str  # current, outdated, unreachable or missing
    newer: tuple[str, ...] = ()  # stable releases above the pin, installable on every arch, newest first
    accepted: str | None = None  # the newest of them the rules accept with the rest of the stack
    refused: tuple[tuple[str, str], ...] = ()  # (version, why) for newer ones the rules refuse
    sources: tuple[str, ...] = ()  # the index URL per arch it was read from
    detail: str = ""

    def describe(self) -> dict[str, object]:
        return {**self.__dict__, "newer": list(self.newer), "refused": [list(r) for r in self.refused], "sources": list(self.sources)}


@dataclass(frozen=True)
class StackNews:
    stack: str
    pins: tuple[PinNews, ...]
    together: tuple[str, ...] = field(default=())  # what the rules say about all accepted bumps at once; empty when fine

    @property
    def bumps(self) -> dict[str, str]:
        return {p.component: p.accepted for p in self.pins if p.accepted}


def _with_versions(matrix: Matrix, stack_id: str, versions: dict[str, str]) -> Matrix:
    stack = matrix.stacks[stack_id]
    pins = stack.pins()
    update = {c: pins[c].model_copy(update={"version": v}) for c, v in versions.items()}
    stacks = {**matrix.stacks, stack_id: stack.model_copy(update=update)}
    return matrix.model_copy(update={"stacks": stacks})


def _refusals(matrix: Matrix, stack_id: str, before: set[str]) -> list[str]:
    """Rule errors about this stack that were not there before the change."""
    found = []
    for rule_id, v in ruleset.check(matrix):
        if v.severity == "error" and v.path[:2] == ("stacks", stack_id):
            text = f"{v.message} [{rule_id}]"
            if text not in before:
                found.append(text)
    return found


def _override_of(stack: Stack, package: str) -> str | None:
    """The stack's override of ``package`` (its ``overrides``, by canonical name), if it has one."""
    wanted = canonicalize_name(package)
    return next((spec for name, spec in stack.overrides.items() if canonicalize_name(name) == wanted), None)


def _installable_versions(client: IndexClient, url: str, package: str, arch: str, stack: Stack, from_source: bool) -> set[Version]:
    project = client.project(url, package)
    tags = target_tags(arch, stack.python)
    files = [f for f in project.files if installable(f, tags, stack.python) and (f.kind == "sdist" or not from_source)]
    return {f.version for f in files if not f.version.is_prerelease and not f.version.is_devrelease}


def _pin_news(loaded: LoadedMatrix, client: IndexClient, index_urls: dict[str, str], stack_id: str, before: set[str]) -> list[PinNews]:
    stack = loaded.matrix.stacks[stack_id]
    news = []
    for component, pin in stack.pins().items():
        package = pin.dist(component)
        base = PinNews(stack_id, component, package, pin.version, "current")
        urls = tuple(index_urls[pin.index_for(arch)] for arch in stack.arches)
        common: set[Version] | None = None
        try:
            for arch, url in zip(stack.arches, urls, strict=True):
                found = _installable_versions(client, url, package, arch, stack, pin.build_from_source)
                common = found if common is None else common & found
        except IndexUnreachable as exc:
            news.append(replace(base, status="unreachable", sources=urls, detail=str(exc)))
            continue
        except ProjectMissing as exc:
            news.append(replace(base, status="missing", sources=urls, detail=str(exc)))
            continue
        newer = sorted((v for v in common or set() if v > Version(pin.version)), reverse=True)
        accepted, refused = None, []
        held = _override_of(stack, package)
        for version in newer:
            if held is not None and not SpecifierSet(held).contains(version, prereleases=True):
                # the matrix overrides what another pin declares for this package (its comment says why): a release
                # outside the override is what that other pin refuses, unless the override moves with it
                refused.append((str(version), f"the stack's overrides hold {package} at {held} (see why): move the override with it"))
                continue
            why = _refusals(_with_versions(loaded.matrix, stack_id, {component: str(version)}), stack_id, before)
            if not why:
                accepted = str(version)
                break
            refused.append((str(version), why[0]))
        status = "outdated" if newer else "current"
        news.append(
            PinNews(stack_id, component, package, pin.version, status, tuple(map(str, newer[:10])), accepted, tuple(refused[:3]), urls)
        )
    return news


# Pins the rules tie together: a newer one is often refused alone and accepted with its partners.
GROUPS = (("torch", "torchvision", "torch_npu"), ("vllm", "vllm_ascend"))
GROUP_CANDIDATES = 6  # newest releases tried per member (the pin itself is always a candidate)


def _group_bumps(loaded: LoadedMatrix, stack_id: str, pins: list[PinNews], before: set[str]) -> list[PinNews]:
    """For refused pins of a group, the newest combination with its partners that the rules accept."""
    by_component = {p.component: p for p in pins}
    for group in GROUPS:
        members = [by_component[c] for c in group if c in by_component]
        if not any(p.newer and not p.accepted for p in members) or any(p.status == "unreachable" for p in members):
            continue
        choices = [[*p.newer[:GROUP_CANDIDATES], p.pinned] for p in members]
        best: dict[str, str] | None = None
        for combo in itertools.product(*choices):  # newest first, member by member
            versions = {p.component: v for p, v in zip(members, combo, strict=True) if v != p.pinned}
            if versions and not _refusals(_with_versions(loaded.matrix, stack_id, versions), stack_id, before):
                best = versions
                break
        if best is None:
            continue
        partners = ", ".join(f"{c} {v}" for c, v in best.items())
        for p in members:
            if p.component in best:
                by_component[p.component] = replace(p, accepted=best[p.component], detail=f"together: {partners}")
    return [by_component[p.component] for p in pins]


def outdated(loaded: LoadedMatrix, client: IndexClient, index_urls: dict[str, str], stack: str | None = None) -> list[StackNews]:
    """What each stack (or ``stack``) could move to, pin by pin and all together."""
    stack_ids = [resolve_stack(loaded, stack)[0]] if stack is not None else list(loaded.matrix.stacks)
    results = []
    for stack_id in stack_ids:
        before = {f"{v.message} [{rule_id}]" for rule_id, v in ruleset.check(loaded.matrix)}
        pins = tuple(_group_bumps(loaded, stack_id, _pin_news(loaded, client, index_urls, stack_id, before), before))
        bumps = {p.component: p.accepted for p in pins if p.accepted}
        together = tuple(_refusals(_with_versions(loaded.matrix, stack_id, bumps), stack_id, before)) if bumps else ()
        results.append(StackNews(stack_id, pins, together))
    return results


def check_new_id(loaded: LoadedMatrix, new_id: str) -> None:
    """A proposed stack's id must be a valid, unused one (checked before any index is asked)."""
    if not _IDENTIFIER.match(new_id):
        raise InputError(f"--propose {new_id!r}: a stack id is lower-case letters, digits, '.', '_' and '-'")
    if new_id in loaded.matrix.stacks:
        raise InputError(f"--propose {new_id!r}: the matrix already has that stack")


def propose(loaded: LoadedMatrix, news: StackNews, new_id: str) -> str:
    """A stack stanza for ``stacks:``: the old one's text with the accepted bumps, each commented."""
    check_new_id(loaded, new_id)
    if news.together:
        raise InputError(f"the accepted bumps of {news.stack} are refused together: {news.together[0]}; pin one back by hand")
    lines = read_matrix_text(loaded.path).splitlines()
    start = loaded.source.keys[("stacks", news.stack)][0] - 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    stanza = lines[start:end]
    stanza[0] = f"{' ' * indent}{new_id}:"
    by_line = {}
    for pin in news.pins:
        if pin.accepted:
            line = loaded.source.keys[("stacks", news.stack, pin.component, "version")][0] - 1 - start
            where = ", ".join(sorted(set(pin.sources)))
            why = f"was {pin.pinned} in {news.stack}; the newest stable {pin.package} on {where} every arch installs and the rules accept"
            by_line[line] = (pin, why)
    for offset, (pin, comment) in by_line.items():
        key, _, _ = stanza[offset].partition(":")
        stanza[offset] = f'{key}: "{pin.accepted}"  # {comment}'
    stanza = [re.sub(r"^(\s*default:\s*)true\b.*$", r"\1false  # the matrix keeps one default stack", s) for s in stanza]
    head = [
        f"{' ' * indent}# Proposed by `ascendkit matrix outdated --stack {news.stack} --propose {new_id}`: stack {news.stack}",
        f"{' ' * indent}# with {len(by_line)} pin(s) moved to newer releases (each commented); every other value as in {news.stack}.",
        f"{' ' * indent}# Review the description, then `ascendkit lock --stack {new_id}` and `make render`.",
    ]
    return "\n".join(head + stanza) + "\n"
