"""The build manifest: what a build verified, as ``manifests/<tag>.json`` and a readable ``.md``
beside it, and whether an unchanged image was verified before against the same expectations."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from buildkit.doctor.base import Check
from buildkit.errors import InputError
from buildkit.fsio import write_atomic
from buildkit.image.buildrecord import SCHEMA_VERSION, read_record
from buildkit.image.verify import Expected, ImageFacts, failures


def expected_fingerprint(expected: Expected) -> str:
    """sha256 of what the image was checked against and how: the expectations and this module (its
    checks and probe). A verification holds for an image ID only while this is unchanged: an edited
    matrix may expect something else of the same image, a newer ascendkit may check more."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(expected), sort_keys=True).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def verified_before(directory: Path, name: str, image_id: str, expected: Expected, refs: list[str]) -> dict[str, Any] | None:
    """The build manifest that records a passed verification of this very image against these very
    expectations and tags, with its Markdown beside it; None when there is none."""
    path = directory / f"{name}.json"
    if not path.is_file():
        return None
    try:
        record = read_record(path)
    except InputError:  # not a record this ascendkit reads: verify again
        return None
    if record.image.id != image_id or record.image.tags != refs or not record.passed:
        return None
    if record.expected_sha256 != expected_fingerprint(expected) or not record.checks:
        return None
    return record.as_dict() if (directory / f"{name}.md").is_file() else None


# A record written before the one check vocabulary said pass, fail or absent, and had no detail.
_OLD_STATUS = {"pass": "ok", "fail": "error", "absent": "warn"}


def recorded_check(data: dict[str, Any]) -> Check:
    """A check as a build manifest recorded it (those written before the one vocabulary included)."""
    status = str(data.get("status", ""))
    expected, actual = str(data.get("expected", "")), str(data.get("actual", ""))
    return Check(
        str(data.get("name", "")), _OLD_STATUS.get(status, status), str(data.get("detail", actual)), expected=expected, actual=actual
    )


def manifest_data(facts: ImageFacts, expected: Expected, checks: list[Check], refs: list[str]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "image": {"id": facts.image_id, "tags": refs, "architecture": facts.architecture},
        "stack": expected.stack_id,
        "chip": expected.chip_id,
        "skus": list(expected.skus),
        "os": expected.os_name,
        "arch": expected.arch,
        "base_image": expected.base_image,
        **found_in_image(facts),
        "passed": not failures(checks),
        "expected_sha256": expected_fingerprint(expected),
        "checks": [c.describe() for c in checks],
    }


def found_in_image(facts: ImageFacts) -> dict[str, Any]:
    """What a build manifest says the verification probe found in the image (a reference image's or a team's)."""
    return {
        "python": facts.python,
        "os_release": {k: facts.os_release.get(k, "") for k in ("ID", "VERSION_ID", "PRETTY_NAME")},
        "cann": {"version": facts.cann_version, "source": facts.cann_source},
        "user": {k: facts.user.get(k) for k in ("name", "uid", "gid", "home")},
        "doctor": facts.doctor_report,
        "labels": dict(sorted(facts.labels.items())),
        "packages": [{"name": n, "version": v} for n, v in sorted(facts.packages.items())],
    }


def _md_rows(rows: Iterator[tuple[str, ...]]) -> str:
    return "".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |\n" for row in rows)


def manifest_markdown(data: dict[str, Any]) -> str:
    img = data["image"]
    lines = [
        f"# Build manifest: {img['tags'][0] if img['tags'] else img['id']}",
        "",
        f"Verification: **{'passed' if data['passed'] else 'FAILED'}**",
        "",
        "| | |",
        "|---|---|",
    ]
    summary = [
        ("image id", f"`{img['id']}`"),
        ("tags", ", ".join(f"`{t}`" for t in img["tags"])),
        ("stack", data["stack"]),
        ("chip / SKUs", f"{data['chip']} / {', '.join(data['skus'])}"),
        ("os / arch", f"{data['os']} / {data['arch']}"),
        ("base image", f"`{data['base_image']}`"),
        ("Python", data["python"]),
        ("CANN", data["cann"]["version"] or "no version file"),
        ("OS release", data["os_release"]["PRETTY_NAME"]),
    ]
    out = "\n".join(lines) + "\n" + _md_rows(iter(summary))
    out += "\n## Checks\n\n| check | expected | found | result |\n|---|---|---|---|\n"
    out += _md_rows((c["name"], c.get("expected", ""), c.get("actual", c.get("detail", "")), c["status"]) for c in data["checks"])
    reproducible = (data.get("build") or {}).get("reproducible") or {}
    if reproducible:
        out += (
            f"\n## Reproducible\n\nBuilt against the epoch {reproducible.get('source_date_epoch')} ({reproducible.get('label')}): "
            "publishing clamps every later time to it, so a clean rebuild of the same inputs publishes the same image "
            "(`ascendkit rebuild` checks one). What may still differ:\n\n| layer | why |\n|---|---|\n"
        )
        out += _md_rows((c["layer"], c["why"]) for c in reproducible.get("caveats") or [])
    out += "\n## Python packages\n\n| package | version |\n|---|---|\n"
    out += _md_rows((p["name"], p["version"]) for p in data["packages"])
    return out


def write_manifest(directory: Path, name: str, data: dict[str, Any]) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
    write_atomic(json_path, json.dumps(data, indent=2) + "\n")
    write_atomic(md_path, manifest_markdown(data))
    return json_path, md_path
