"""Every compatibility rule with a passing and a failing example."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import MatrixError
from buildkit.framework import frameworks
from buildkit.frameworks.openrlhf.rules import CHECKED as OPENRLHF_CHECKED
from buildkit.matrix import load, rules, ruleset
from buildkit.matrix.load import LoadedMatrix, load_matrix, parse_matrix
from buildkit.matrix.model import GIT_COMPONENTS, PYPI_COMPONENTS, GitPin, Matrix, PypiPin, Stack
from buildkit.violation import Violation
from tests.conftest import MATRIX, MATRIX_TEXT, TEST_MATRIX

ROOT = Path(__file__).resolve().parents[1]


def changed(matrix: Matrix, **edits: Any) -> Matrix:
    """A copy of ``matrix`` with dotted-path edits, e.g. ``stacks__cann8_3__torch__version="2.8.0"``.

    Path parts are separated by ``__``; ``_`` inside a stack id stands for ``.`` (cann8_3 ->
    cann8.3). A value of ``...`` deletes the key.
    """
    data = matrix.model_dump(mode="python", exclude_none=True)
    for dotted, value in edits.items():
        parts = dotted.split("__")
        node: Any = data
        for part in parts[:-1]:
            key = part.replace("_", ".") if part.startswith("cann") else part
            node = node[key]
        last = parts[-1]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return Matrix.model_validate(data)


def run(rule_id: str, matrix: Matrix) -> list[Violation]:
    return list(ruleset.all_rules()[rule_id](matrix))


def test_every_rule_has_tests_below() -> None:
    tested = {
        "torch-npu-matches-torch",
        "torchvision-matches-torch",
        "one-rollout",
        "tool-fits-stack",
        "vllm-ascend-pairs-vllm",
        "python-supported-by-torch",
        "python-offered-by-cann-base",
        "torch-npu-matches-cann",
        "cann-has-driver-range",
        "known-issues",
        "one-framework",
        "openrlhf-matches-stack",
        "patches-name-pins",
        "one-default-stack",
        "references-exist",
        "hw-names-unambiguous",
        "build-args-unique",
        "git-ref-is-commit",
    }
    assert set(ruleset.all_rules()) == tested


def test_the_components_of_a_stack_are_its_pin_fields_listed_once() -> None:
    """pins() and git_pins() read the Stack's fields, and a framework from the index comes last;
    an OpenRLHF line names only components."""
    assert PYPI_COMPONENTS[:2] == ("torch", "torch_npu") and PYPI_COMPONENTS[-1] == "ais_bench"
    stack = load_matrix(TEST_MATRIX).matrix.stacks["teststack"]
    assert list(stack.pins())[-1] == stack.framework == "verl"
    assert GIT_COMPONENTS == ("mindspeed", "megatron_lm")
    assert set(OPENRLHF_CHECKED) <= set(PYPI_COMPONENTS)
    fields = {n: f.annotation for n, f in Stack.model_fields.items()}
    assert {n for n, a in fields.items() if "PypiPin" in str(a) or a is PypiPin} == set(PYPI_COMPONENTS)
    assert {n for n, a in fields.items() if "GitPin" in str(a) or a is GitPin} == set(GIT_COMPONENTS)


def test_shipped_matrix_has_no_rule_errors(loaded: LoadedMatrix) -> None:
    found = ruleset.check(loaded.matrix)
    assert [(r, v) for r, v in found if v.severity == "error"] == []
    # The documented warnings: the quickstart's torch_npu 2.7.1 on CANN 8.3.RC1, and the git refs
    # that are branches or tags (their hosts cannot be reached here to resolve them to commits).
    assert [(r, v.path) for r, v in found if r == "known-issues"] == [("known-issues", ("stacks", "cann8.3", "torch_npu", "version"))]
    refs = [v.path for r, v in found if r == "git-ref-is-commit"]
    assert refs and all(path[-1] == "ref" and path[2] in GIT_COMPONENTS for path in refs)


def test_a_text_is_parsed_once_per_process_and_a_refused_one_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """What parse_matrix keeps is keyed by all its result depends on: the text, the path its findings
    name and the plug-ins that judged it. A matrix it refused is refused again, in full."""
    first = parse_matrix(MATRIX_TEXT, MATRIX)
    assert parse_matrix(MATRIX_TEXT, MATRIX) is first
    elsewhere = parse_matrix(MATRIX_TEXT, Path("elsewhere.yaml"))
    assert elsewhere is not first and elsewhere.path == Path("elsewhere.yaml") and elsewhere.matrix == first.matrix
    edited = parse_matrix(MATRIX_TEXT.replace("schema_version: 1\n", "schema_version: 1\n\n"), MATRIX)
    assert edited is not first and edited.source.locate(("stacks",)).line == first.source.locate(("stacks",)).line + 1
    plugins = frameworks()
    monkeypatch.setattr(load, "frameworks", lambda: dict(plugins))  # the same plug-ins: the same result
    assert parse_matrix(MATRIX_TEXT, MATRIX) is first
    monkeypatch.setattr(load, "frameworks", lambda: {n: p for n, p in plugins.items() if n != "openrlhf"})
    with pytest.raises(MatrixError) as without:  # a stanza no plug-in owns now: judged again, and refused
        parse_matrix(MATRIX_TEXT, MATRIX)
    assert "unknown key 'openrlhf'" in str(without.value.findings)
    monkeypatch.undo()
    for n in range(load._PARSED_KEPT - 1):  # others parsed since: the one used most recently is kept
        parse_matrix(MATRIX_TEXT + f"# {n}\n", MATRIX)
        assert parse_matrix(MATRIX_TEXT, MATRIX) is first
    broken = MATRIX_TEXT.replace("schema_version: 1\n", "schema_version: 1\nstakcs: {}\n")
    for _ in range(2):
        with pytest.raises(MatrixError) as refused:
            parse_matrix(broken, MATRIX)
        assert "unknown key 'stakcs'" in str(refused.value.findings)


def test_torch_npu_matches_torch(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("torch-npu-matches-torch", m) == []  # 2.10.0.post4 on torch 2.10.0 passes too
    bad = changed(m, stacks__cann8_3__torch__version="2.8.0")
    (v,) = run("torch-npu-matches-torch", bad)
    assert v.path == ("stacks", "cann8.3", "torch_npu", "version")
    assert "built for torch 2.7.1" in v.message and "torch 2.8.0" in v.message


def test_torchvision_matches_torch(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("torchvision-matches-torch", m) == []
    bad = changed(m, stacks__cann9_1__torchvision__version="0.24.0")
    (v,) = run("torchvision-matches-torch", bad)
    assert v.hint == "torchvision 0.25.0"


@pytest.mark.parametrize(
    ("torch", "torchvision"), [("2.5.1", "0.20.1"), ("2.7.1", "0.22.1"), ("2.8.0", "0.23.0"), ("2.9.0", "0.24.0"), ("2.10.0", "0.25.0")]
)
def test_torchvision_table(torch: str, torchvision: str) -> None:
    assert rules.expected_torchvision(torch) == torchvision


def test_vllm_ascend_pairs_vllm(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("vllm-ascend-pairs-vllm", m) == []  # 0.7.3.post1 pairs with 0.7.3
    bad = changed(m, stacks__cann8_5__vllm__version="0.12.0")
    (v,) = run("vllm-ascend-pairs-vllm", bad)
    assert v.path == ("stacks", "cann8.5", "vllm_ascend", "version")
    assert v.hint.startswith("a vllm-ascend 0.12.* release")


SGLANG = "sglang-cann8.5"


def test_one_rollout(loaded: LoadedMatrix) -> None:
    """vLLM with vllm-ascend or SGLang with its kernels, whole, never both; kernels for every chip."""
    assert run("one-rollout", loaded.matrix) == []
    data = _data(loaded)
    data["stacks"]["cann8.3"]["sglang"] = data["stacks"][SGLANG]["sglang"]  # both engines
    del data["stacks"]["cann9.1"]["vllm_ascend"]  # half of one
    del data["stacks"][SGLANG]["sgl_kernel_npu"]["chips"]["a3"]  # no kernels for a chip it serves
    data["stacks"][OPENRLHF]["sglang"] = data["stacks"][SGLANG]["sglang"]
    data["stacks"][OPENRLHF]["sgl_kernel_npu"] = data["stacks"][SGLANG]["sgl_kernel_npu"]
    del data["stacks"][OPENRLHF]["vllm"], data["stacks"][OPENRLHF]["vllm_ascend"]
    found = {v.path: v.message for v in run("one-rollout", Matrix.model_validate(data))}
    whole = "a stack pins one rollout engine, whole: vllm and vllm_ascend, or sglang and sgl_kernel_npu"
    assert found == {
        ("stacks", "cann8.3"): whole,
        ("stacks", "cann9.1"): whole,
        ("stacks", SGLANG, "sgl_kernel_npu", "chips"): "the stack serves chip a3, for which sgl-kernel-npu names no archive",
        ("stacks", OPENRLHF, "sglang"): "OpenRLHF's images roll out with vLLM only",
    }
    data = _data(loaded)
    data["stacks"][SGLANG]["sglang"]["build_from_source"] = False
    (v,) = run("one-rollout", Matrix.model_validate(data))
    assert v.path == ("stacks", SGLANG, "sglang", "project_file") and v.hint == "build_from_source: true"


def test_tool_fits_stack(loaded: LoadedMatrix) -> None:
    """ais-bench-benchmark's numpy<2 keeps it off the NumPy 2 line; its Python floor and exact pins count too."""
    assert run("tool-fits-stack", loaded.matrix) == []
    data = _data(loaded)
    data["stacks"]["cann9.1"]["ais_bench"] = data["stacks"]["cann8.3"]["ais_bench"]  # numpy>=2.0.0 there
    data["stacks"]["cann8.3"]["python"] = "3.9"
    data["stacks"]["cann8.5"]["transformers"]["package"] = "tree-sitter"  # a pin the tool pins otherwise
    data["stacks"]["cann8.2"]["msprobe"]["version"] = "26.1.0"  # no row for it
    found = {v.path: v for v in run("tool-fits-stack", Matrix.model_validate(data))}
    nine = found[("stacks", "cann9.1", "ais_bench", "version")]
    assert nine.message == (
        "ais-bench-benchmark 3.1.20260630 requires numpy<2.0.0,>=1.23.4, which the stack's the constraint numpy>=2.0.0 rules out"
    )
    assert nine.hint == "leave ais_bench out of this stack, with the reason"
    assert "requires python>=3.10.0, which the stack's Python 3.9 rules out" in found[("stacks", "cann8.3", "ais_bench", "version")].message
    assert (
        "tree-sitter==0.21.3, which the stack's tree-sitter 4.57.6 rules out"
        in found[("stacks", "cann8.5", "ais_bench", "version")].message
    )
    assert found[("stacks", "cann8.2", "msprobe", "version")].message == "no requirements of mindstudio-probe 26.1.0 is recorded"
    data = _data(loaded)
    data["stacks"]["cann8.3"]["constraints_by_arch"] = {"x86_64": {"numpy": ">=2.1"}}  # one arch's constraint counts too
    (v,) = run("tool-fits-stack", Matrix.model_validate(data))
    assert v.path == ("stacks", "cann8.3", "ais_bench", "version") and "the constraint numpy>=2.1 rules out" in v.message
    data = _data(loaded)
    data["stacks"]["cann9.1"]["ais_bench"] = data["stacks"]["cann8.3"]["ais_bench"]
    data["stacks"]["cann9.1"]["ascend_tools"] = False  # left out of the images: nothing to refuse
    assert run("tool-fits-stack", Matrix.model_validate(data)) == []


def test_python_supported_by_torch(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("python-supported-by-torch", m) == []
    bad = changed(m, stacks__cann8_3__python="3.12")
    (v,) = run("python-supported-by-torch", bad)
    assert v.path == ("stacks", "cann8.3", "python")
    assert v.hint == "a Python in >=3.9,<3.12"
    data = m.model_dump(mode="python", exclude_none=True)
    del data["compat"]["torch_python"]["2.10"]
    found = run("python-supported-by-torch", Matrix.model_validate(data))
    assert {v.path[1] for v in found} == {"cann9.1", "cann9.2"}, found  # the stacks on torch 2.10
    assert all(v.message == "no Python range for torch 2.10 is recorded" for v in found)


def test_python_offered_by_cann_base(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("python-offered-by-cann-base", m) == []
    bad = changed(m, stacks__cann8_1__python="3.11")
    (v,) = run("python-offered-by-cann-base", bad)
    assert "no official CANN 8.1.RC1 base image ships Python 3.11" in v.message
    assert v.hint == "one of 3.10"


def test_torch_npu_matches_cann(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("torch-npu-matches-cann", m) == []
    wrong_line = changed(m, stacks__cann8_5__cann="8.3.RC1")
    (v,) = run("torch-npu-matches-cann", wrong_line)
    assert "torch_npu 2.8.0.post2 belongs to CANN 8.5.0, not 8.3.RC1" in v.message
    assert "2.7.1" in v.hint and "2.8.0" in v.hint
    unknown = changed(m, stacks__cann8_5__torch_npu__version="2.8.0.post9")
    (v,) = run("torch-npu-matches-cann", unknown)
    assert v.message == "no CANN release for torch_npu 2.8.0.post9 is recorded"
    assert v.hint.startswith('add compat.torch_npu_cann."2.8.0.post9" (known: 2.5.1, ')


def test_cann_has_driver_range(loaded: LoadedMatrix, tmp_path: Path) -> None:
    m = loaded.matrix
    assert run("cann-has-driver-range", m) == []
    assert all(entry.source.strip() for entry in m.compat.cann_drivers.values()), "every range says where it comes from"
    data = m.model_dump(mode="python", exclude_none=True)
    del data["compat"]["cann_drivers"]["8.5.0"]
    data["stacks"] = {k: st for k, st in data["stacks"].items() if st["cann"] != "8.5.0" or k == "cann8.5"}
    (v,) = run("cann-has-driver-range", Matrix.model_validate(data))
    assert v.path == ("stacks", "cann8.5", "cann") and v.message == "no Ascend HDK (driver) range for CANN 8.5.0 is recorded"
    assert v.hint.startswith('add compat.cann_drivers."8.5.0" (known: 8.1.RC1, 8.2.RC1, 8.3.RC1')
    # through the CLI, on the file: `matrix validate` fails, naming the line; `matrix show` prints the range
    text = (ROOT / "compat_matrix.yaml").read_text()
    start = text.index('    "8.5.0":\n      hdk:')
    cut = text[:start] + text[text.index('    "9.1.0":\n      hdk:') :]
    (tmp_path / "compat_matrix.yaml").write_text(cut)
    (tmp_path / "locks").symlink_to(ROOT / "locks")
    bad = CliRunner().invoke(app, ["matrix", "validate", "--matrix", str(tmp_path / "compat_matrix.yaml")])
    said = "stacks.cann8.5.cann: no Ascend HDK (driver) range for CANN 8.5.0 is recorded [cann-has-driver-range]"
    assert bad.exit_code == 2 and said in bad.output
    shown = CliRunner().invoke(app, ["matrix", "show", "cann8.5", "--matrix", str(ROOT / "compat_matrix.yaml"), "--json"])
    assert json.loads(shown.stdout)["drivers"]["hdk"] == ["25.0.X", "25.2.X", "25.3.X", "25.5.X"]
    table = CliRunner().invoke(app, ["matrix", "show", "cann8.5", "--matrix", str(ROOT / "compat_matrix.yaml")], env={"COLUMNS": "300"})
    assert "host driver (Ascend HDK)" in table.stdout and "25.0.X, 25.2.X, 25.3.X, 25.5.X" in table.stdout


def test_a_driver_both_supported_and_refused_is_refused_with_its_line(tmp_path: Path) -> None:
    text = (ROOT / "compat_matrix.yaml").read_text()
    assert '      refused: ["25.0.X"]\n' in text
    (tmp_path / "compat_matrix.yaml").write_text(text.replace('      refused: ["25.0.X"]\n', '      refused: ["25.0.X", "25.5.X"]\n', 1))
    (tmp_path / "locks").symlink_to(ROOT / "locks")
    bad = CliRunner().invoke(app, ["matrix", "validate", "--matrix", str(tmp_path / "compat_matrix.yaml")])
    line = text[: text.index('      refused: ["25.0.X"]\n')].count("\n")  # the 9.1.0 entry's line range
    assert bad.exit_code == 2, bad.output
    assert "compat.cann_drivers.9.1.0" in bad.output and "25.5.X both supported (hdk) and refused" in bad.output, bad.output
    assert "compat_matrix.yaml:" in bad.output and any(f":{n}:" in bad.output for n in range(line - 8, line + 2)), bad.output
    shown = CliRunner().invoke(app, ["matrix", "show", "cann9.1", "--matrix", str(ROOT / "compat_matrix.yaml")], env={"COLUMNS": "300"})
    assert "25.7.RC1, 26.0.RC1, 26.1.0; not 25.0.X" in shown.stdout


def test_known_issues(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    (warning,) = run("known-issues", m)
    assert warning.severity == "warning"
    # torch_npu 2.7.1 on CANN 9.0.0 is recorded as broken: an error.
    data = m.model_dump(mode="python", exclude_none=True)
    data["stacks"]["cann9.1"].update(cann="9.0.0", torch={"version": "2.7.1"}, torch_npu={"version": "2.7.1"})
    found = run("known-issues", Matrix.model_validate(data))
    errors = [v for v in found if v.severity == "error"]
    assert len(errors) == 1
    assert "use 2.7.1.post4" in errors[0].message
    assert errors[0].path == ("stacks", "cann9.1", "torch_npu", "version")


def test_one_default_stack(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    default = loaded.default_stack()
    other = next(s for s in ("cann9.1", "cann8.2") if s != default)
    assert run("one-default-stack", m) == []
    (v,) = run("one-default-stack", changed(m, **{f"stacks__{default.replace('.', '_')}__default": False}))
    assert v.path == ("stacks",)
    (v,) = run("one-default-stack", changed(m, **{f"stacks__{other.replace('.', '_')}__default": True}))
    assert v.path == ("stacks", other, "default")
    assert ", ".join(sorted([default, other])) in v.message


OPENRLHF = "openrlhf-cann8.1"


def _data(loaded: LoadedMatrix) -> dict[str, Any]:
    return loaded.matrix.model_dump(mode="python", exclude_none=True)


def test_one_framework(loaded: LoadedMatrix) -> None:
    assert run("one-framework", loaded.matrix) == []
    data = _data(loaded)
    data["stacks"]["cann8.3"]["openrlhf"] = data["stacks"][OPENRLHF]["openrlhf"]
    del data["stacks"]["cann9.1"]["verl"]
    found = {v.path: v.message for v in run("one-framework", Matrix.model_validate(data))}
    assert found == {
        ("stacks", "cann8.3"): "the stack names verl and openrlhf; an image carries exactly one",
        ("stacks", "cann9.1"): "the stack names no framework; an image carries exactly one",
    }


def test_openrlhf_matches_stack(loaded: LoadedMatrix) -> None:
    assert run("openrlhf-matches-stack", loaded.matrix) == []
    data = _data(loaded)
    stack = data["stacks"][OPENRLHF]
    stack["vllm_ascend"]["version"] = "0.9.1"  # a pair vllm-ascend-pairs-vllm would flag too; this rule names the fork's
    stack["transformers"]["version"] = "4.52.4"
    del stack["ring_attn_ascend"]
    found = {v.path: v for v in run("openrlhf-matches-stack", Matrix.model_validate(data))}
    assert set(found) == {
        ("stacks", OPENRLHF, "vllm_ascend", "version"),
        ("stacks", OPENRLHF, "transformers", "version"),
        ("stacks", OPENRLHF),
    }
    wrong = found[("stacks", OPENRLHF, "vllm_ascend", "version")]
    assert wrong.message == "OpenRLHF 0.7.5's Ascend branch was validated with vllm-ascend ==0.8.5rc1, not 0.9.1"
    assert wrong.hint == "vllm-ascend 0.8.5rc1"
    assert "needs ring-attn-ascend (>=0.0.1), which the stack does not pin" in found[("stacks", OPENRLHF)].message

    data = _data(loaded)
    data["stacks"][OPENRLHF]["openrlhf"]["version"] = "0.9.0"
    (v,) = run("openrlhf-matches-stack", Matrix.model_validate(data))
    assert v.path == ("stacks", OPENRLHF, "openrlhf", "version")
    assert "no Ascend validation for OpenRLHF 0.9.0 is recorded" in v.message and 'compat.openrlhf_ascend."0.9.0"' in v.hint

    data = _data(loaded)
    data["stacks"][OPENRLHF]["cann"] = "8.2.RC1"
    paths = {v.path for v in run("openrlhf-matches-stack", Matrix.model_validate(data))}
    assert paths == {("stacks", OPENRLHF, "cann")}


def test_patches_name_pins(loaded: LoadedMatrix) -> None:
    assert run("patches-name-pins", loaded.matrix) == []
    data = _data(loaded)
    data["stacks"][OPENRLHF]["patches"][0]["package"] = "vllm_Ascend"  # any spelling of the pinned distribution
    assert run("patches-name-pins", Matrix.model_validate(data)) == []
    data["stacks"][OPENRLHF]["patches"][0]["package"] = "ray"  # installed, but not at a version the matrix pins
    (v,) = run("patches-name-pins", Matrix.model_validate(data))
    assert v.path == ("stacks", OPENRLHF, "patches", 0, "package")
    assert "ray is not a pin of the stack" in v.message and "vllm-ascend" in v.hint


def test_references_exist(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("references-exist", m) == []
    bad = changed(
        m,
        stacks__cann8_2__skus=["a2-box16", "a9"],
        stacks__cann8_3__triton_ascend={"version": "3.2.0", "index": "tuna"},
        stacks__cann8_3__mindspeed={"repo": "mindspeed-fork", "ref": "abc"},
    )
    paths = {v.path for v in run("references-exist", bad)}
    assert paths == {
        ("stacks", "cann8.2", "skus", 1),
        ("stacks", "cann8.3", "triton_ascend", "index"),
        ("stacks", "cann8.3", "mindspeed", "repo"),
    }
    data = m.model_dump(mode="python", exclude_none=True)
    data["skus"]["a3"]["chip"] = "a4"
    data["repos"]["mindspeed"]["host"] = "gitee"
    data["stacks"][OPENRLHF]["openrlhf"]["repo"] = "openrlhf"
    paths = {v.path for v in run("references-exist", Matrix.model_validate(data))}
    assert paths == {("skus", "a3", "chip"), ("repos", "mindspeed", "host"), ("stacks", OPENRLHF, "openrlhf", "repo")}


def test_hw_names_unambiguous(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("hw-names-unambiguous", m) == []  # SKU a3 is on chip a3: same meaning
    data = m.model_dump(mode="python", exclude_none=True)
    data["skus"]["a2"] = {**data["skus"]["a3"]}  # a SKU named a2 on the a3 chip
    (v,) = run("hw-names-unambiguous", Matrix.model_validate(data))
    assert v.path == ("skus", "a2", "chip")


def test_build_args_unique(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    assert run("build-args-unique", m) == []
    data = m.model_dump(mode="python", exclude_none=True)
    data["git_hosts"]["gitcode"]["arg"] = "PIP_INDEX_URL"
    data["indexes"]["ascend"]["arg"] = "BASE_IMAGE"
    paths = {v.path for v in run("build-args-unique", Matrix.model_validate(data))}
    assert paths == {("git_hosts", "gitcode", "arg"), ("indexes", "ascend", "arg")}


@pytest.mark.parametrize(
    ("version", "base", "minor"), [("2.7.1.post2", "2.7.1", "2.7"), ("2.10.0.post4", "2.10.0", "2.10"), ("2.5.1rc1", "2.5.1", "2.5")]
)
def test_version_helpers(version: str, base: str, minor: str) -> None:
    assert rules.base_version(version) == base
    assert rules.minor_line(version) == minor


def test_cann_minor() -> None:
    assert rules.cann_minor("8.3.RC1") == "8.3"
    assert rules.cann_minor("9.1.0") == "9.1"


def test_git_ref_is_commit(loaded: LoadedMatrix) -> None:
    m = loaded.matrix
    found = {v.path: v for v in run("git-ref-is-commit", m)}
    assert ("stacks", "cann8.3", "mindspeed", "ref") not in found  # f2b0977e is a commit
    warning = found[("stacks", "cann9.1", "megatron_lm", "ref")]
    assert warning.severity == "warning" and "'core_r0.16.0' is a branch or tag, which can move" in warning.message
    pinned = changed(m, stacks__cann9_1__megatron_lm__ref="0123456789abcdef0123456789abcdef01234567")
    assert ("stacks", "cann9.1", "megatron_lm", "ref") not in {v.path for v in run("git-ref-is-commit", pinned)}
