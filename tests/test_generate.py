"""render --all / --check: every generated file, drift detection, stale and missing files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit import generate
from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.matrix.model import Matrix
from buildkit.plan import all_targets
from tests.conftest import ROOT, default_verl


def test_repository_is_up_to_date(loaded: LoadedMatrix) -> None:
    assert generate.check(loaded) == []


def test_expected_outputs_cover_everything(loaded: LoadedMatrix) -> None:
    paths = {f.path for f in generate.expected_outputs(loaded)}
    assert {"Dockerfile.a2", "Dockerfile.a3", "docs/matrix.md", "compat_matrix.schema.json"} <= paths
    assert "dockerfiles/cann9.1/Dockerfile.a3-openeuler24.03" in paths
    assert "dockerfiles/openrlhf-cann8.1/Dockerfile.a2-ubuntu22.04" in paths
    assert len([p for p in paths if p.startswith("dockerfiles/")]) == len(all_targets(loaded))


def test_drift_in_a_dockerfile_is_reported_and_fixed(repo_copy: Path, runner: CliRunner) -> None:
    target = repo_copy / "Dockerfile.a3"
    target.write_text(target.read_text().replace(f"verl=={default_verl(load_matrix(repo_copy / 'compat_matrix.yaml'))}", "verl==0.0.1"))
    result = runner.invoke(app, ["render", "--check", "--matrix", str(repo_copy / "compat_matrix.yaml")])
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert "--- a/Dockerfile.a3" in result.stdout and "+++ b/Dockerfile.a3" in result.stdout
    assert "-    ascendkit_install verl verl==0.0.1;" in result.stdout
    assert "1 generated file(s) are out of date" in result.stderr

    result = runner.invoke(app, ["render", "--all", "--matrix", str(repo_copy / "compat_matrix.yaml")])
    assert result.exit_code == 0
    assert "wrote Dockerfile.a3" in result.stderr
    assert target.read_text() == (ROOT / "Dockerfile.a3").read_text()
    assert runner.invoke(app, ["render", "--all", "--check", "--matrix", str(repo_copy / "compat_matrix.yaml")]).exit_code == 0


def test_matrix_change_without_rerender_fails_check(repo_copy: Path) -> None:
    matrix = repo_copy / "compat_matrix.yaml"
    matrix.write_text(matrix.read_text().replace("      version: 0.9.1  # 0.9.0", "      version: 0.9.0  # 0.9.0"))
    diffs = generate.check(load_matrix(matrix))
    locks = [d for d in diffs if d.startswith("lock: ")]
    changed = sorted(d.splitlines()[1].removeprefix("+++ b/") for d in diffs if d not in locks)
    dockerfiles = sorted(t.path for t in all_targets(load_matrix(matrix)) if t.stack_id == "cann9.1")
    assert changed == [*dockerfiles, "docs/matrix.md", "docs/repositories/verl.md", "docs/verl-parity.md"]  # the parity page shows its tag
    # ... and both of the stack's locks no longer describe it
    stale = "is stale: the matrix changed since it was made; run `ascendkit lock --stack cann9.1"
    assert locks == [f"lock: locks/cann9.1-{arch}.txt {stale} --arch {arch}`\n" for arch in ("aarch64", "x86_64")]


def test_stale_and_missing_files(repo_copy: Path) -> None:
    stale = repo_copy / "dockerfiles" / "cann7.0" / "Dockerfile.a2-ubuntu22.04"
    stale.parent.mkdir()
    stale.write_text("FROM scratch\n")
    missing = repo_copy / "dockerfiles" / "cann8.5" / "Dockerfile.a3-openeuler24.03"
    missing.unlink()
    loaded = load_matrix(repo_copy / "compat_matrix.yaml")
    diffs = generate.check(loaded)
    assert len(diffs) == 2
    assert any("--- a/dockerfiles/cann7.0/Dockerfile.a2-ubuntu22.04\n+++ /dev/null" in d for d in diffs)
    assert any("--- /dev/null\n+++ b/dockerfiles/cann8.5/Dockerfile.a3-openeuler24.03" in d for d in diffs)
    touched = generate.write_all(loaded)
    assert "dockerfiles/cann7.0/Dockerfile.a2-ubuntu22.04 (removed)" in touched
    assert not stale.parent.exists()
    assert missing.exists()
    assert generate.check(loaded) == []


def test_support_table_drift(repo_copy: Path) -> None:
    readme = repo_copy / "docs" / "matrix.md"
    default = load_matrix(repo_copy / "compat_matrix.yaml").default_stack()
    readme.write_text(readme.read_text().replace(f"| {default} (default) |", f"| {default} |"))
    diffs = generate.check(load_matrix(repo_copy / "compat_matrix.yaml"))
    assert len(diffs) == 1 and "+++ b/docs/matrix.md" in diffs[0]


def test_a_tables_page_without_markers_is_an_error(repo_copy: Path) -> None:
    readme = repo_copy / "docs" / "matrix.md"
    readme.write_text("# my fork\n")
    with pytest.raises(InputError, match="generated-table markers are missing"):
        generate.check(load_matrix(repo_copy / "compat_matrix.yaml"))


def test_schema_file_matches_models() -> None:
    committed = json.loads((ROOT / "compat_matrix.schema.json").read_text())
    assert committed == Matrix.model_json_schema()
    assert committed["additionalProperties"] is False
    assert "stacks" in committed["required"]


def test_schema_command(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "schema"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["title"] == "ascendkit compatibility matrix"
    out = tmp_path / "schema.json"
    assert runner.invoke(app, ["matrix", "schema", "-o", str(out)]).exit_code == 0
    assert out.read_text() == result.stdout


def test_the_build_record_schema_is_the_model_and_reads_what_builds_wrote(tmp_path: Path) -> None:
    """build_manifest.schema.json is BuildRecord's; a record a build wrote reads back whole, and a
    file that is not one is refused naming the file and the field."""
    from buildkit.image.buildrecord import BuildRecord, read_record

    assert json.loads((ROOT / "build_manifest.schema.json").read_text()) == BuildRecord.model_json_schema()
    data = {
        "schema_version": 1, "image": {"id": "sha256:" + "a" * 64, "tags": ["ascendkit/verl:x-x86_64"], "architecture": "amd64"},
        "passed": True, "arch": "x86_64", "labels": {"io.ascendkit.arches": "aarch64,x86_64"}, "doctor": {"outcome": "ready"},
        "published": {"repository": "r/x", "digest": "sha256:" + "b" * 64, "registries": {}}, "a newer field": [1, 2],
    }  # fmt: skip
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    record = read_record(path)
    assert record.arches == ("aarch64", "x86_64") and record.published is not None
    assert record.published.every_registry()["r/x"].digests() == {"gzip": "sha256:" + "b" * 64}
    assert record.as_dict() == data, "read and dumped, the same data: nothing unknown lost, no default added"
    path.write_text(json.dumps({**data, "image": {"id": "x", "tags": []}}))
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: not an ascendkit build manifest: image\.tags: "):
        read_record(path)
    path.write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(InputError, match="schema_version 2; this ascendkit reads version 1"):
        read_record(path)
