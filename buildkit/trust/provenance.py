"""SLSA v1 provenance of one published image, as an in-toto v1 statement: made from the build
manifest (what the build ran from, see ``buildkit.image.record``) and the digest the registry
serves. It depends on those alone: no clock, no host name.

- ``buildDefinition.externalParameters``: the matrix stack and what the build was asked for
  (chip, arch, OS, SKUs, the build arguments) and the source (repository and commit);
- ``internalParameters``: the lock status and that verification passed, with its fingerprint;
- ``resolvedDependencies``: the source commit, the base image by digest, every lock section by
  sha256, every pin (``pkg:pypi/<name>@<version>``) and every git checkout at its ref;
- ``runDetails.builder``: ascendkit and its version.
"""

from __future__ import annotations

from typing import Any

from buildkit.version import __version__

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:ascendkit:build:image:v1"  # docs/trust.md says what its parameters mean
BUILDER_ID = "urn:ascendkit:builder"
PIN_PREFIX = "pkg:pypi/"


def _dependencies(build: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    source = build.get("source")
    if isinstance(source, dict) and source.get("commit"):
        found.append({"name": "source", "uri": f"git+{source['repository']}@{source['commit']}", "digest": {"gitCommit": source["commit"]}})
    base = build.get("base_image")
    if isinstance(base, dict) and str(base.get("digest", "")).startswith("sha256:"):
        dependency: dict[str, Any] = {
            "name": "base-image",
            "uri": str(base["ref"]),
            "digest": {"sha256": str(base["digest"]).removeprefix("sha256:")},
        }
        if base.get("from_registry") is False:  # loaded, not pulled: the digest is its config's, no registry ever gave one
            dependency["mediaType"] = "application/vnd.oci.image.config.v1+json"
            dependency["annotations"] = {"ascendkit.base": "loaded into the engine, not pulled: the digest is the image config's"}
        found.append(dependency)
    for path, sha256 in sorted((build.get("lock_files") or {}).items()):
        found.append({"name": f"lock:{path}", "uri": f"file:{path}", "digest": {"sha256": sha256}})
    for pin in build.get("pins") or []:
        found.append({"name": pin["name"], "uri": f"{PIN_PREFIX}{pin['name']}@{pin['version']}"})
    for checkout in build.get("checkouts") or []:
        found.append({"name": f"git:{checkout['name']}", "uri": f"{checkout['uri']}@{checkout['ref']}"})
    return found


def statement(repository: str, digest: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The provenance of image ``repository@digest``, whose build manifest is ``manifest``."""
    found = manifest.get("build")
    build: dict[str, Any] = found if isinstance(found, dict) else {}
    external = {
        "stack": manifest.get("stack", build.get("stack")),
        "framework": build.get("framework"),
        "chip": manifest.get("chip", build.get("chip")),
        "arch": manifest.get("arch", build.get("arch")),
        "os": manifest.get("os", build.get("os")),
        "skus": manifest.get("skus", build.get("skus")),
        "source": build.get("source"),
        "buildArgs": build.get("build_args"),
        "reproducible": build.get("reproducible"),  # the epoch it was built against: rebuilt from these inputs, the same digest
        "builder": (manifest.get("builder") or {}).get("name"),  # buildkit or classic: a rebuild takes the same
        # a team image (buildkit.team): its name, lock and files by sha256, its fork, every base package it replaces
        # with the reason, and what it added
        "team": build.get("team"),
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": repository, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {k: v for k, v in external.items() if v is not None},
                "internalParameters": {
                    "lockStatus": build.get("lock_status"),
                    "verification": {"passed": bool(manifest.get("passed")), "expectedSha256": manifest.get("expected_sha256")},
                    "imageId": (manifest.get("image") or {}).get("id"),
                    **({"normalized": manifest["normalized"]} if isinstance(manifest.get("normalized"), dict) else {}),
                },
                "resolvedDependencies": _dependencies(build),
            },
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"ascendkit": __version__}}},
        },
    }


def pins_of(statement_: dict[str, Any]) -> dict[str, str]:
    """name -> version of every pin a provenance statement records."""
    pins = {}
    for dep in statement_.get("predicate", {}).get("buildDefinition", {}).get("resolvedDependencies", []):
        uri = str(dep.get("uri", ""))
        if uri.startswith(PIN_PREFIX) and "@" in uri:
            name, _, version = uri.removeprefix(PIN_PREFIX).rpartition("@")
            pins[name] = version
    return pins
