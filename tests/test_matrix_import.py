"""``ascendkit matrix import``: a stack proposed from an upstream Ascend Dockerfile (buildkit/matrix/importer.py),
tried on every vendored verl Dockerfile: each proposal pins what the parity reader reads from it, and validates
with the matrix, except where verl's own image breaks a rule of the matrix (each such case listed below with what
verl does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode
from buildkit.matrix.importer import findings, propose
from buildkit.matrix.parity import Vendored
from tests.conftest import MATRIX, MATRIX_TEXT, ROOT

VENDORED = Vendored.load(ROOT)
DOCKERFILES = sorted(f for f in VENDORED.sources if f.rsplit("/", 1)[-1].startswith("Dockerfile"))
SGLANG_83 = ["one-rollout", "torch-npu-matches-cann"]  # sgl-kernel-npu built from a commit; torch_npu 2.7.1.post2 is 8.5.0's
# Where verl's image itself breaks a rule, the proposal keeps verl's pins and matrix validate says so.
BREAKS_A_RULE = {
    # torch_npu 2.9.0.post2 (vllm-ascend releases/v0.18.0's, the CANN 9.0.0 build) on a CANN 8.5.0 base
    "verl/main/Dockerfile.ascend_8.5.0_a2": ["torch-npu-matches-cann"],
    "verl/main/Dockerfile.ascend_8.5.0_a3": ["torch-npu-matches-cann"],
    # torch_npu==2.8.0 (the CANN 8.3.RC1 build) installed over vllm-ascend's 2.8.0.post2 on a CANN 8.5.0 base
    "verl/main/Dockerfile.ascend_8.5.0_a2_v0.7.1": ["torch-npu-matches-cann"],
    "verl/main/Dockerfile.ascend_8.5.0_a3_v0.7.1": ["torch-npu-matches-cann"],
    # the "8.5.2" Qwen3.5 images build on the 8.5.1 base, for which no driver range is recorded, with torch_npu 2.9.0 (8.5.0's)
    "verl/main/Dockerfile.ascend_8.5.2_a2_qwen3-5": ["cann-has-driver-range", "torch-npu-matches-cann"],
    "verl/main/Dockerfile.ascend_8.5.2_a3_qwen3-5": ["cann-has-driver-range", "torch-npu-matches-cann"],
    "verl/main/Dockerfile.ascend.sglang_8.3.rc1_a2": SGLANG_83,
    "verl/main/Dockerfile.ascend.sglang_8.3.rc1_a3": SGLANG_83,
    # vllm-ascend 0.30.0rc2 declares torch-npu==2.10.0.post4 (a CANN 9.1.0 build) on its CANN 9.2.0 daily base (its
    # Dockerfiles' last step installs a TorchNPU 26.2.0 daily over it: see stacks.cann9.2.upstream)
    "vllm-ascend/v0.30.0rc2/Dockerfile": ["torch-npu-matches-cann"],
    "vllm-ascend/v0.30.0rc2/Dockerfile.a3": ["torch-npu-matches-cann"],
    "vllm-ascend/v0.30.0rc2/Dockerfile.a5": ["torch-npu-matches-cann"],
    "vllm-ascend/v0.30.0rc2/Dockerfile.openEuler": ["torch-npu-matches-cann"],
    "vllm-ascend/v0.30.0rc2/Dockerfile.a3.openEuler": ["torch-npu-matches-cann"],
    "vllm-ascend/v0.30.0rc2/Dockerfile.a5.openEuler": ["torch-npu-matches-cann"],
}


def _stanza(text: str) -> dict[str, Any]:
    parsed = yaml.safe_load(text)
    assert isinstance(parsed, dict) and len(parsed) == 1
    stanza = next(iter(parsed.values()))
    assert isinstance(stanza, dict)
    return stanza


@pytest.mark.parametrize("file", DOCKERFILES)
def test_each_vendored_dockerfile_gives_a_stack_that_validates_or_says_why_not(file: str) -> None:
    image = VENDORED.image(file)
    proposal = propose(parse_matrix_once(), image, file)
    rules = sorted({f.rule for f in findings(MATRIX_TEXT, MATRIX, proposal)})
    assert rules == BREAKS_A_RULE.get(file, []), [f.format() for f in findings(MATRIX_TEXT, MATRIX, proposal)]
    stanza = _stanza(proposal.text())
    assert image.base is not None and (stanza["cann"], stanza["python"], stanza["os"]) == (
        image.base.cann,
        image.base.python,
        [image.base.os],
    )
    for component, pin in image.pins.items():  # every release the Dockerfile names, the proposal pins
        if pin.kind == "version" and component in stanza and "version" in stanza[component]:
            assert str(stanza[component]["version"]) == pin.value.split("+")[0], (component, pin)
        elif pin.kind == "branch" and component in stanza:
            assert str(stanza[component]["version"]) == pin.value, (component, pin)
        elif pin.kind in ("ref", "commit") and component in ("mindspeed", "megatron_lm"):
            assert stanza[component]["ref"] == pin.value, (component, pin)
    named = {c for c, p in image.pins.items() if p.kind in ("version", "branch")}
    assert named - set(stanza) <= {"sgl_kernel_npu"}, "a release the Dockerfile names is missing from the proposal"


_LOADED: list[Any] = []


def parse_matrix_once() -> Any:
    from buildkit.matrix.load import load_matrix

    if not _LOADED:
        _LOADED.append(load_matrix(MATRIX).matrix)
    return _LOADED[0]


def test_what_the_dockerfile_does_not_pin_is_said_on_its_line() -> None:
    proposal = propose(parse_matrix_once(), VENDORED.image("verl/main/Dockerfile.ascend_9.1.0_a3"), "verl/main/Dockerfile.ascend_9.1.0_a3")
    text = proposal.text()
    assert (
        "transformers:  # the Dockerfile: commit cc7ab9be508c at verl/main/Dockerfile.ascend_9.1.0_a3:57; 5.10.4 from stack cann9.1" in text
    )
    assert "verl:  # the Dockerfile: unpinned at verl/main/Dockerfile.ascend_9.1.0_a3:73; 0.9.1 from stack cann9.1" in text
    assert "#   verl/main/Dockerfile.ascend_9.1.0_a3:61: flash-linear-attention==0.5.0: no matrix component" in text


def _import(runner: CliRunner, dockerfile: Path | str, *args: str) -> Any:
    return runner.invoke(app, ["matrix", "import", str(ROOT / "upstream" / dockerfile), *args, "--matrix", str(MATRIX)])


def test_the_command_prints_the_proposal_and_judges_it(runner: CliRunner, tmp_path: Path) -> None:
    ok = _import(runner, "verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0")
    assert ok.exit_code == 0, ok.output
    assert "  ascend-9.0.0-a3-v0.8.0:\n    description: imported from verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0\n" in ok.stdout
    out = tmp_path / "proposal.yaml"
    written = runner.invoke(
        app,
        [
            "matrix",
            "import",
            str(ROOT / "upstream/verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0"),
            "--id",
            "mine",
            "-o",
            str(out),
            "--matrix",
            str(MATRIX),
        ],
    )
    assert written.exit_code == 0 and out.read_text(encoding="utf-8").count("\n  mine:\n") == 1, written.output
    bad = _import(runner, "verl/main/Dockerfile.ascend_8.5.0_a3_v0.7.1")
    assert bad.exit_code == ExitCode.CHECK_FAILED, bad.output
    assert "torch_npu 2.8.0 belongs to CANN 8.3.RC1, not 8.5.0 [torch-npu-matches-cann]" in bad.stderr
    assert "  ascend-8.5.0-a3-v0.7.1:\n" in bad.stdout, "the proposal is printed either way"
    taken = _import(runner, "verl/main/Dockerfile.ascend_9.1.0_a3", "--id", "cann9.1")
    assert taken.exit_code == ExitCode.INVALID_INPUT and "a stack named cann9.1 exists" in taken.stderr, taken.output
    missing = _import(runner, tmp_path / "Dockerfile.none")
    assert missing.exit_code == ExitCode.INVALID_INPUT and "cannot read the Dockerfile" in missing.stderr, missing.output


def test_a_dockerfile_from_elsewhere_reads_the_vendored_requirements_at_its_ref(runner: CliRunner, tmp_path: Path) -> None:
    copy = tmp_path / "Dockerfile.ascend_9.0.0_a2_v0.8.0"
    copy.write_text((ROOT / "upstream/verl/main/Dockerfile.ascend_9.0.0_a2_v0.8.0").read_text(encoding="utf-8"), encoding="utf-8")
    result = runner.invoke(app, ["matrix", "import", str(copy), "--ref", "release/v0.8.0", "--matrix", str(MATRIX)])
    assert result.exit_code == 0, result.output
    stanza = _stanza(result.stdout)
    assert stanza["torch_npu"]["version"] == "2.9.0.post2" and stanza["triton_ascend"] == {"version": "3.2.1", "index": "ascend"}
    assert stanza["skus"] == ["a2-box16", "900-podc"] and stanza["verl"] == {"version": "0.8.0"}
