"""The team image's build record and SBOM, in the forms a reference image's take (``manifests/<tag>.json`` and
``<tag>.cdx.json`` beside it), so that everything after a build takes a team image as it takes a reference one:
``publish`` (normalized against its base's layers, so two clean builds publish one image), ``mirror``, ``sign``,
``verify`` (its provenance names its base by digest, the team's commit and lock, and every escape), ``sbom`` and
``sbom diff`` against its base.

The record's ``team`` section is what the team build checked: the base by digest, the team's lock, files and fork,
each escape with its reason, what it added and what imported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from buildkit.doctor.base import Check
from buildkit.image.archive import ImageIdentity
from buildkit.image.engine import EngineFacts
from buildkit.image.manifest import found_in_image
from buildkit.image.record import source_of
from buildkit.image.sbom import BaseImage, Described, compose_sbom
from buildkit.image.verify import ImageFacts, normalize
from buildkit.plan.layers import EPOCH_LABEL, LABEL_PREFIX, SOURCE_DATE_EPOCH
from buildkit.team.dockerfile import TeamBuildInputs
from buildkit.team.resolve import TeamBase, free_of, lock_file
from buildkit.team.spec import LoadedTeam

TEAM_ROLE = "team"  # the SBOM's component property of what the team added


@dataclass(frozen=True)
class TeamChecked:
    """What the team build found in its base and in its image."""

    identity: ImageIdentity
    ref: str
    base: BaseImage
    base_labels: dict[str, str]
    before: dict[str, list[Any]]  # every distribution of the base (team.inimage.distributions)
    after: dict[str, list[Any]]  # and of the team image
    imported: list[str]
    facts: ImageFacts  # the verification probe's view of the team image
    unread: tuple[str, ...] = ()  # team packages whose files only the check after the build held to the base's, each why


def base_image_of(base_ref: str, inspect: dict[str, Any]) -> BaseImage:
    """The base as a build record names it: by its registry digest where it came from one, else its config."""
    name, at, digest = base_ref.partition("@")
    layers = len((inspect.get("RootFS") or {}).get("Layers") or [])
    if at:
        return BaseImage(name, digest, True, layers)
    return BaseImage(base_ref, str(inspect["Id"]), False, layers)


def pins(base: TeamBase, checked: TeamChecked) -> dict[str, str]:
    """Every pin of the base's matrix stack, at its version in the team image, and every distribution the team added:
    what the provenance records and ``verify`` compares (to the matrix, and to the SBOM)."""
    found = {name: str(checked.after[normalize(name)][0]) for name, _ in base.pins if normalize(name) in checked.after}
    found.update({name: str(checked.after[name][0]) for name in checked.after if name not in checked.before})
    return dict(sorted(found.items()))


def team_section(team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs, checked: TeamChecked) -> dict[str, Any]:
    """What the team build is made from and what it checked: its base by digest, the team's lock, files and fork,
    every escape with its reason, what it added and what it imported."""
    framework, before, after = team.spec.framework, checked.before, checked.after
    return {
        "name": team.spec.name,
        "base": {"ref": inputs.base_ref, "stack": base.stack_id, "sku": base.sku, "arch": base.arch, "image": base.image or None},
        "lock": lock_file(team, base.arch).name,
        "lock_sha256": inputs.lock_sha256,
        "files_sha256": inputs.files_sha256,
        "framework": {"pin": inputs.fork_pin, "git": framework.git, "commit": framework.commit} if framework else None,
        "replaces": {
            name: {
                "base": before[name][0],
                "team": after.get(name, ["(gone)"])[0],
                "reason": team.spec.replace.get(name, "the team's framework fork"),
            }
            for name in sorted(free_of(team, base))
            if name in before and after.get(name) != before[name]
        },
        "added": {name: after[name][0] for name in sorted(after) if name not in before},
        "checks": {
            "base_distributions_kept": sum(1 for n in before if after.get(n) == before[n]),
            "imported": checked.imported,
            "files_checked_after_the_build_only": list(checked.unread),
        },
    }


def _checks(section: dict[str, Any], checked: TeamChecked) -> list[Check]:
    kept, total = section["checks"]["base_distributions_kept"], len(checked.before)
    replaced = section["replaces"]
    escapes = f"; replaced by the team: {', '.join(replaced)}" if replaced else ""
    found = [
        Check(
            "base distributions as they were",
            "ok",
            f"{kept} of {total} (name, version, files, direct_url){escapes}",
            expected=str(total - len(replaced)),
            actual=str(kept),
        )
    ]
    found += [Check(f"import {module}", "ok", "imported as the image's user") for module in checked.imported]
    return found


def team_build_section(
    team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs, checked: TeamChecked, section: dict[str, Any]
) -> dict[str, Any]:
    """The record's ``build``: what the provenance is made from (buildkit.trust.provenance): the team repository's
    commit, the base by digest, the team's lock by sha256, every pin, the fork at its commit, and the team section."""
    labels = checked.base_labels
    framework = team.spec.framework
    return {
        "source": source_of(team.root),
        "stack": base.stack_id,
        "framework": base.framework,
        "chip": labels.get(f"{LABEL_PREFIX}.chip", ""),
        "arch": base.arch,
        "os": labels.get(f"{LABEL_PREFIX}.os", ""),
        "skus": [base.sku],
        "pins": [{"name": name, "version": version} for name, version in pins(base, checked).items()],
        "checkouts": [{"name": base.framework_dist, "uri": f"git+{framework.git}", "ref": framework.commit}] if framework else [],
        "lock_status": "fresh",
        "lock_files": {section["lock"]: inputs.lock_sha256},
        "base_image": {"ref": checked.base.ref, "digest": checked.base.digest, "from_registry": checked.base.from_registry}
        | ({"layers": checked.base.layers} if checked.base.layers >= 0 else {}),
        "reproducible": {"source_date_epoch": SOURCE_DATE_EPOCH, "label": EPOCH_LABEL, "caveats": []},
        "build_args": dict(inputs.index_args),
        "team": {k: section[k] for k in ("name", "lock_sha256", "files_sha256", "framework", "replaces", "added")},
    }


def team_manifest(
    team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs, checked: TeamChecked, engine: EngineFacts, builder: dict[str, Any]
) -> dict[str, Any]:
    """The team image's build record (buildkit.image.buildrecord): passed, as only a passed image gets one."""
    facts, section = checked.facts, team_section(team, base, inputs, checked)
    image: dict[str, Any] = {"id": checked.identity.config, "tags": [checked.ref], "architecture": facts.architecture}
    if checked.identity.engine_id != checked.identity.config:
        image["engine_id"] = checked.identity.engine_id
    labels = dict(sorted(facts.labels.items()))
    return {
        "schema_version": 1,
        "image": image,
        "stack": base.stack_id,
        "chip": labels.get(f"{LABEL_PREFIX}.chip", ""),
        "skus": [base.sku],
        "os": labels.get(f"{LABEL_PREFIX}.os", ""),
        "arch": base.arch,
        "base_image": inputs.base_ref,
        **found_in_image(facts),
        "passed": True,
        "expected_sha256": hashlib.sha256(f"{inputs.lock_sha256}\n{inputs.files_sha256}".encode()).hexdigest(),
        "checks": [c.describe() for c in _checks(section, checked)],
        "build": team_build_section(team, base, inputs, checked, section),
        "engine": engine.describe(),
        "builder": builder,
        "team": section,
    }


def team_sbom(team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs, checked: TeamChecked) -> dict[str, Any]:
    """The team image's CycloneDX document: what the probe found in it, the team's packages marked as the team's, the
    fork as the framework built from its commit, the base image by digest. ``sbom diff BASE TEAM`` then lists what
    the team added (and its fork, and the base each was built on)."""
    added = {name for name in checked.after if name not in checked.before}
    roles = dict.fromkeys(sorted(added), TEAM_ROLE)
    sources = {}
    if team.spec.framework is not None:
        dist = normalize(base.framework_dist)
        roles[dist] = f"{base.framework} (the team's fork)"
        sources[dist] = (team.spec.framework.git, team.spec.framework.commit)
    properties = {"stack": base.stack_id, "framework": base.framework, "team": team.spec.name, "arch": base.arch, "skus": base.sku}
    name, _, tag = checked.ref.rpartition(":")
    return compose_sbom(checked.facts, Described(name, tag, properties, roles, sources, {}), checked.base)
