"""The image's software bill of materials: a CycloneDX 1.6 JSON document, and the diff of two.

Everything listed is what the verification probe found inside the built image (the Python
distributions, the OS package database, CANN's version file, /etc/ascendkit/git-revisions.txt and
the image's own lock sections with the hashes pip enforced); the plan only adds which pin of the
matrix each distribution stands for. The document depends on the image alone: no clock, no random
serial number, components sorted.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from buildkit.errors import InputError
from buildkit.image.verify import ImageFacts, normalize
from buildkit.imageref import split_ref
from buildkit.plan import ImagePlan, pin_of
from buildkit.version import __version__

SPEC_VERSION = "1.6"
MEDIA_TYPE = "application/vnd.cyclonedx+json"
SBOM_SUFFIX = ".cdx.json"
PROPERTY = "ascendkit"  # namespace of our CycloneDX properties
# bom-ref prefix -> the kind people read in tables and diffs
KINDS = {"pypi": "python", "deb": "os", "rpm": "os", "cann": "cann", "git": "git", "base": "base image"}
_LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


@dataclass(frozen=True)
class BaseImage:
    """The image a build started FROM, and its digest as the engine knows it."""

    ref: str
    digest: str  # sha256:... of the registry manifest, or of the config for a base that never came from a registry
    from_registry: bool
    layers: int = -1  # how many layers it has (the image's first, which publishing keeps as they are); -1: not known


def _purl_version(version: str) -> str:
    return quote(version, safe=".-_~:")


def _props(**values: str) -> list[dict[str, str]]:
    return [{"name": f"{PROPERTY}:{key.replace('_', '-')}", "value": value} for key, value in values.items() if value]


def lock_hashes(locks: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """normalized name -> version -> the sha256 hashes the image's lock sections allow for it."""
    found: dict[str, dict[str, list[str]]] = {}
    current: list[str] | None = None
    for text in locks.values():
        for line in text.splitlines():
            match = _LOCK_LINE.match(line)
            if match:
                current = found.setdefault(normalize(match[1]), {}).setdefault(match[2], [])
            elif current is not None and line.strip().startswith("--hash=sha256:"):
                current.append(line.strip().rstrip("\\").strip().removeprefix("--hash=sha256:"))
            elif line and not line[0].isspace():
                current = None
    return found


def _patch_pedigree(patches: list[dict[str, Any]]) -> dict[str, Any]:
    """CycloneDX's record of changes to a component: each patch as an unofficial diff, with its reason."""
    return {
        "patches": [
            {"type": "unofficial", "diff": {"text": {"contentType": "text/x-diff", "content": str(p.get("diff", ""))}}} for p in patches
        ],
        "notes": "; ".join(f"{p.get('file')} line {p.get('line')} commented out: {p.get('reason')}" for p in patches),
    }


def _python_components(facts: ImageFacts, roles: dict[str, str], sources: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """``sources``: distribution -> (git URL, commit) for those built from a checkout rather than an index."""
    hashes = lock_hashes(facts.locks)
    components = []
    for name, version in sorted(facts.packages.items()):
        purl = f"pkg:pypi/{name}@{_purl_version(version)}"
        if name in sources:  # the same name and version as a PyPI release, but built from this commit of another repository
            url, commit = sources[name]
            purl += "?vcs_url=" + quote(f"git+{url}@{commit}", safe="")
        component: dict[str, Any] = {"type": "library", "bom-ref": f"pypi:{name}", "name": name, "version": version, "purl": purl}
        allowed = sorted(set(hashes.get(name, {}).get(version, [])))
        if allowed:
            component["hashes"] = [{"alg": "SHA-256", "content": h} for h in allowed]
        patches = [p for p in facts.patches if normalize(str(p.get("package", ""))) == name]
        if patches:
            component["pedigree"] = _patch_pedigree(patches)
        source = f"git {sources[name][0]}@{sources[name][1]}" if name in sources else ""
        props = _props(component=roles.get(name, ""), locked="yes" if allowed else "", source=source, patched="yes" if patches else "")
        if props:
            component["properties"] = props
        components.append(component)
    return components


def _os_components(facts: ImageFacts) -> list[dict[str, Any]]:
    distro_id = facts.os_release.get("ID", "unknown").lower()
    distro = f"{distro_id}-{facts.os_release.get('VERSION_ID', '')}".rstrip("-")
    tool = "dpkg" if "dpkg" in facts.os_packages else "rpm"
    kind = "deb" if tool == "dpkg" else "rpm"  # the purl type
    components = []
    seen = set()
    for line in sorted(facts.os_packages.get(tool, "").splitlines()):
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[1] or parts[0] in seen:
            continue
        name, version, arch = parts
        seen.add(name)
        qualifiers = f"arch={arch}&distro={distro}"
        if tool == "rpm":
            epoch, _, version = version.partition(":")
            qualifiers += f"&epoch={epoch}" if epoch not in ("", "0", "(none)") else ""
        components.append(
            {
                "type": "library",
                "bom-ref": f"{kind}:{name}",
                "name": name,
                "version": version,
                "purl": f"pkg:{kind}/{distro_id}/{name}@{_purl_version(version)}?{qualifiers}",
            }
        )
    return components


def _git_components(facts: ImageFacts, urls: dict[str, str]) -> list[dict[str, Any]]:
    """The checkouts /etc/ascendkit/git-revisions.txt lists; ``urls``: checkout name -> its repository."""
    components = []
    for line in sorted(facts.git_revisions.splitlines()):
        parts = line.split()
        if len(parts) != 3:
            continue
        name, ref, commit = parts
        url = urls.get(name, "")
        component: dict[str, Any] = {"type": "library", "bom-ref": f"git:{name}", "name": name, "version": commit}
        if url.startswith("https://github.com/"):
            owner_repo = url.removeprefix("https://github.com/").removesuffix(".git").lower()
            component["purl"] = f"pkg:github/{owner_repo}@{commit}"
        elif url:
            component["purl"] = f"pkg:generic/{name}@{commit}?vcs_url={quote('git+' + url + '@' + commit, safe='')}"
        if url:
            component["externalReferences"] = [{"type": "vcs", "url": url}]
        component["properties"] = _props(git_ref=ref)
        components.append(component)
    return components


def _base_component(base: BaseImage) -> dict[str, Any]:
    name, tag, _ = split_ref(base.ref)
    last = name.rsplit("/", 1)[-1]
    qualifiers = f"repository_url={quote(name, safe='/:')}" + (f"&tag={quote(tag, safe='')}" if tag else "")
    return {
        "type": "container",
        "bom-ref": "base:image",
        "name": base.ref,
        "version": base.digest,
        "purl": f"pkg:oci/{last}@{quote(base.digest, safe='')}?{qualifiers}",
        "properties": _props(digest_kind="registry manifest" if base.from_registry else "image config (a local base, no registry digest)"),
    }


def _timestamp(created: str) -> str:
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", created)
    return f"{match[1]}Z" if match else ""


def sbom_document(facts: ImageFacts, plan: ImagePlan, base: BaseImage, repository: str) -> dict[str, Any]:
    """The CycloneDX 1.6 document of one built image."""
    roles = {normalize(pin_of(plan.stack, component).dist): component for component in plan.stack.pins()}
    sources = {}
    if plan.source_checkout is not None:
        roles[normalize(plan.source_checkout.name)] = plan.framework
        sources[normalize(plan.source_checkout.name)] = (plan.source_checkout.url, plan.source_checkout.ref)
    properties = {
        "stack": plan.stack_id,
        "framework": plan.framework,
        "chip": plan.chip_id,
        "os": plan.os_name,
        "arch": plan.arch,
        "skus": ",".join(plan.skus),
    }
    urls = {checkout.name: checkout.url for checkout in plan.checkouts}
    return compose_sbom(facts, Described(repository, plan.full_tag, properties, roles, sources, urls), base)


@dataclass(frozen=True)
class Described:
    """What an SBOM says of its image beyond what the probe found in it."""

    name: str  # the image component's name (its repository)
    version: str  # its tag
    properties: dict[str, str]  # ascendkit:<key> properties of the image component (image-id comes first)
    roles: dict[str, str]  # normalized distribution -> the role it plays (the matrix component, "team", ...)
    sources: dict[str, tuple[str, str]]  # normalized distribution -> (git URL, commit), built from a checkout
    git_urls: dict[str, str]  # checkout name -> its repository (for /etc/ascendkit/git-revisions.txt)


def compose_sbom(facts: ImageFacts, described: Described, base: BaseImage) -> dict[str, Any]:
    """The CycloneDX 1.6 document of an image from what the probe found in it: a reference image's, or a team's."""
    components = _python_components(facts, described.roles, described.sources)
    components += _os_components(facts) + _git_components(facts, described.git_urls)
    if facts.cann_version:
        components.append(
            {
                "type": "framework",
                "bom-ref": "cann:toolkit",
                "name": "cann-toolkit",
                "version": facts.cann_version,
                "supplier": {"name": "Huawei"},
                "purl": f"pkg:generic/huawei/cann-toolkit@{_purl_version(facts.cann_version)}",
                "properties": _props(source=facts.cann_source or ""),
            }
        )
    components.append(_base_component(base))
    image_ref = {
        "type": "container",
        "bom-ref": "image",
        "name": described.name,
        "version": described.version,
        "properties": _props(image_id=facts.image_id, **described.properties),
    }
    metadata: dict[str, Any] = {
        "tools": {"components": [{"type": "application", "name": "ascendkit", "version": __version__}]},
        "component": image_ref,
    }
    stamp = _timestamp(facts.created)
    if stamp:
        metadata = {"timestamp": stamp, **metadata}
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'ascendkit-image:' + facts.image_id)}",
        "version": 1,
        "metadata": metadata,
        "components": components,
        "dependencies": [{"ref": "image", "dependsOn": [c["bom-ref"] for c in components]}],
    }


def sbom_path(manifest_dir: Path, manifest_name: str) -> Path:
    """Where a build writes the SBOM: beside its build manifest (``<name>.json``)."""
    return manifest_dir / f"{manifest_name}{SBOM_SUFFIX}"


def sbom_beside(manifest: Path) -> Path:
    """The SBOM of the build whose manifest is ``manifest`` (``<name>.json``)."""
    return sbom_path(manifest.parent, manifest.name.removesuffix(".json"))


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def loads(text: str | bytes, where: str) -> dict[str, Any]:
    """A CycloneDX JSON document as read from a file or a registry; refused when it is not one."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX" or not isinstance(document.get("components"), list):
        raise InputError(f"{where}: not a CycloneDX document (no bomFormat CycloneDX with components)")
    return document


# ---- reading and comparing ---------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Entry:
    """One component as tables and diffs show it."""

    kind: str  # python, os, cann, git, base image
    name: str
    version: str
    detail: str = ""  # the pin it stands for, the git ref, or the purl

    @property
    def key(self) -> tuple[str, str]:
        """What a diff pairs by: its kind and name; an image has one base, whatever it is called (a team image's base is
        a reference image, whose own base is another: the diff says the base changed, not that one went and one came)."""
        return (self.kind, "" if self.kind == KINDS["base"] else self.name)


def entries(document: dict[str, Any]) -> list[Entry]:
    found = []
    for component in document.get("components", []):
        if not isinstance(component, dict):
            continue
        ref = str(component.get("bom-ref", ""))
        kind = KINDS.get(ref.split(":", 1)[0], str(component.get("type", "other")))
        props = {p.get("name"): p.get("value") for p in component.get("properties", []) if isinstance(p, dict)}
        detail = props.get(f"{PROPERTY}:component") or props.get(f"{PROPERTY}:git-ref") or ""
        if props.get(f"{PROPERTY}:patched") == "yes":
            detail = f"{detail}, patched" if detail else "patched"
        found.append(Entry(kind, str(component.get("name", "")), str(component.get("version", "")), str(detail)))
    return sorted(found)


@dataclass(frozen=True)
class SbomDiff:
    added: tuple[Entry, ...]
    removed: tuple[Entry, ...]
    changed: tuple[tuple[Entry, Entry], ...]  # (before, after): same kind and name, another version

    def describe(self) -> dict[str, Any]:
        def one(e: Entry) -> dict[str, str]:
            return {"kind": e.kind, "name": e.name, "version": e.version, "pin": e.detail}

        return {
            "added": [one(e) for e in self.added],
            "removed": [one(e) for e in self.removed],
            "changed": [
                {"kind": a.kind, "name": renamed(a, b), "from": a.version, "to": b.version, "pin": b.detail} for a, b in self.changed
            ],
        }


def renamed(before: Entry, after: Entry) -> str:
    """A changed component's name as a diff shows it: ``OLD -> NEW`` where it changed too (an image's base)."""
    return before.name if before.name == after.name else f"{before.name} -> {after.name}"


def diff(before: dict[str, Any], after: dict[str, Any]) -> SbomDiff:
    old = {e.key: e for e in entries(before)}
    new = {e.key: e for e in entries(after)}
    return SbomDiff(
        added=tuple(new[k] for k in sorted(new.keys() - old.keys())),
        removed=tuple(old[k] for k in sorted(old.keys() - new.keys())),
        changed=tuple((old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k].version != new[k].version),
    )
