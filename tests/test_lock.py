"""`ascendkit lock`: inputs and their digest, reading sdists, splitting by layer, the lock file,
staleness; then real resolutions against PyPI (the index these machines can reach)."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from buildkit.lock.inputs import LockFailed, LockTarget, lock_inputs, lock_targets
from buildkit.lock.lockfile import LockedPackage, Resolution, lock_problem, read_lock, render_lock, render_unresolved, section_texts
from buildkit.lock.resolve import _check, assign_layers, parse_uv_output
from buildkit.lock.sdist import SourceMetadata, read_sdist
from buildkit.matrix.load import LoadedMatrix, load_matrix
from tests.conftest import ROOT, TEST_MATRIX
from tests.harness import sglang_standin
from tests.harness.gitserver import serve
from tests.harness.openrlhf_standin import REPO_PATH, standin_repository

UV_OUTPUT = """\
attrs==21.4.0 \\
    --hash=sha256:aaa \\
    --hash=sha256:bbb
    # via markdown-it-py
    # from https://pypi.org/simple
markdown-it-py==2.0.0 \\
    --hash=sha256:ccc
    # via
    #   -r 01-torch.in
    #   rich
    # from https://pypi.org/simple
rich==13.0.0 \\
    --hash=sha256:ddd
    # via -r 02-verl.in
    # from https://pypi.org/simple
torch==2.7.1 \\
    --hash=sha256:eee
    # via
    #   -r 01-torch.in
    #   -c constraints.txt
    # from https://download.pytorch.org/whl/cpu
"""


def test_parse_uv_output_reads_hashes_parents_and_index() -> None:
    packages = {p.key: p for p in parse_uv_output(UV_OUTPUT)}
    assert list(packages) == ["attrs", "markdown-it-py", "rich", "torch"]
    assert packages["attrs"].hashes == ["sha256:aaa", "sha256:bbb"]
    assert packages["attrs"].via == ["markdown-it-py"]
    assert packages["markdown-it-py"].via == ["-r 01-torch.in", "rich"]
    assert packages["torch"].source == "https://download.pytorch.org/whl/cpu"


def test_each_package_goes_to_the_first_layer_that_needs_it() -> None:
    layers = assign_layers(parse_uv_output(UV_OUTPUT), {"torch": "01-torch.in", "verl": "02-verl.in"})
    assert [p.key for p in layers["torch"]] == ["attrs", "markdown-it-py", "torch"]
    # rich is verl's, and markdown-it-py (which rich needs too) was already installed by the torch layer
    assert [p.key for p in layers["verl"]] == ["rich"]


def test_a_package_no_layer_asks_for_is_an_error() -> None:
    packages = parse_uv_output(UV_OUTPUT)
    with pytest.raises(LockFailed, match="no layer asks for: rich"):
        assign_layers(packages, {"torch": "01-torch.in"})


def _sdist(path: Path, files: dict[str, str]) -> Path:
    top = path.name.removesuffix(".tar.gz").removesuffix(".zip")
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as archive:
            for name, text in files.items():
                archive.writestr(f"{top}/{name}", text)
        return path
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_sdist_requirements_follow_includes_and_drop_index_options(tmp_path: Path) -> None:
    sdist = _sdist(
        tmp_path / "vllm-9.9.9.tar.gz",
        {
            "requirements/common.txt": "# comment\nregex\nnumpy < 2.0.0  # inline\n\n--extra-index-url https://x\n-r extra.txt\n",
            "requirements/extra.txt": 'llguidance >= 0.7; platform_machine == "aarch64"\n',
            "requirements/cuda.txt": "torch==9.9\n",  # another device's file: not read
            "pyproject.toml": '[build-system]\nrequires = ["setuptools>=77", "torch == 2.8.0"]\n',
            "setup.py": "",
        },
    )
    meta = read_sdist(sdist, "vllm", "9.9.9", "0" * 64)
    assert meta.requires_from == "requirements/common.txt"
    assert meta.requires == ("regex", "numpy < 2.0.0", 'llguidance >= 0.7; platform_machine == "aarch64"')
    assert meta.build_requires == ("setuptools>=77", "torch == 2.8.0")


def test_sdist_without_requirement_files_uses_pkg_info_and_setuptools(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "pkg-1.0.zip", {"PKG-INFO": "Metadata-Version: 2.1\nName: pkg\nRequires-Dist: six>=1\n", "setup.py": ""})
    meta = read_sdist(sdist, "pkg", "1.0", "0" * 64)
    assert (meta.requires_from, meta.requires) == ("PKG-INFO", ("six>=1",))
    assert meta.build_requires == ("setuptools>=40.8.0", "wheel")


def test_a_bad_requirement_line_names_the_sdist_file_and_line(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "pkg-1.0.tar.gz", {"requirements.txt": "six\nnot a ( requirement\n"})
    with pytest.raises(InputError, match=r"pkg-1.0.tar.gz: requirements.txt line 2: not a requirement"):
        read_sdist(sdist, "pkg", "1.0", "0" * 64)


NPU_PROJECT = """[build-system]
requires = ["setuptools>=61.0", "setuptools-scm>=8.0"]

[project]
name = "sg"
dependencies = ["aiohttp", "transformers==5.3.0"]

[project.optional-dependencies]
diffusion = ["diffusers==0.37.0"]
srt_npu = []
all_npu = ["sg[diffusion]"]
"""


def test_a_project_file_gives_the_requirements_and_build_of_an_sdist_built_with_it(tmp_path: Path) -> None:
    """SGLang's way: the sdist's pyproject_npu.toml, with an extra that names another of its own."""
    files = {"pyproject.toml": '[build-system]\nrequires = ["cuda-only-build"]\n[project]\ndependencies = ["sgl-kernel"]\n'}
    sdist = _sdist(tmp_path / "sg-1.0.tar.gz", {**files, "pyproject_npu.toml": NPU_PROJECT, "requirements.txt": "cuda-thing\n"})
    meta = read_sdist(sdist, "sg", "1.0", "0" * 64, ("pyproject_npu.toml", ("all_npu",)))
    assert meta.requires == ("aiohttp", "transformers==5.3.0", "diffusers==0.37.0")
    assert meta.requires_from == "pyproject_npu.toml[all_npu]"
    assert meta.build_requires == ("setuptools>=61.0", "setuptools-scm>=8.0")
    assert read_sdist(sdist, "sg", "1.0", "0" * 64, ("pyproject_npu.toml", ("srt_npu",))).requires == ("aiohttp", "transformers==5.3.0")
    with pytest.raises(InputError, match=r"sg-1.0.tar.gz: pyproject_npu.toml: no extra 'gpu' in \[project.optional-dependencies\]"):
        read_sdist(sdist, "sg", "1.0", "0" * 64, ("pyproject_npu.toml", ("gpu",)))
    with pytest.raises(LockFailed, match=r"has no pyproject_other\.toml, the project file the matrix builds sg with"):
        read_sdist(sdist, "sg", "1.0", "0" * 64, ("pyproject_other.toml", ()))


def test_a_stack_whose_release_archive_has_no_sha256_is_locked_unresolved_saying_so() -> None:
    """sglang-cann8.5: nothing is guessed; the lock says which archive and where its sha256 goes."""
    loaded = load_matrix()
    inputs = lock_inputs(loaded, LockTarget("sglang-cann8.5", "aarch64"))
    assert inputs.projects == (("sglang", "pyproject_npu.toml", ("srt_npu",)),)
    assert [file for file, sha in inputs.archives] == [
        f"sgl-kernel-npu-2026.02.01-torch2.8.0-py311-cann8.5.0-{chip}-aarch64.zip" for chip in ("910b", "a3")
    ]
    assert inputs.unverified_archive is not None and "sgl_kernel_npu.sha256" in inputs.unverified_archive
    lock = read_lock(ROOT / "locks" / "sglang-cann8.5-aarch64.txt")
    assert not lock.resolved and lock_problem(ROOT, inputs) is None
    assert "no sha256 is known for the release archive" in (ROOT / "locks" / "sglang-cann8.5-aarch64.txt").read_text()
    assert lock_inputs(loaded, LockTarget("cann8.5", "aarch64")).archives == ()


@pytest.fixture
def test_loaded() -> LoadedMatrix:
    return load_matrix(TEST_MATRIX)


def _copy_matrix(tmp_path: Path, replace: tuple[str, str] | None = None) -> Path:
    """The test matrix with its locks in a scratch directory, optionally with one edit."""
    path = tmp_path / "test_matrix.yaml"
    text = TEST_MATRIX.read_text()
    if replace:
        assert replace[0] in text
        text = text.replace(*replace)
    path.write_text(text)
    shutil.copytree(TEST_MATRIX.parent / "locks", tmp_path / "locks")
    return path


def test_inputs_follow_the_image_layers(test_loaded: LoadedMatrix) -> None:
    inputs = lock_inputs(test_loaded, LockTarget("teststack", "x86_64"))
    assert [layer for layer, _ in inputs.layers] == [
        "uv",
        "torch",
        "triton-ascend",
        "vllm",
        "vllm-ascend",
        "transformers",
        "ascend-tools",
        "verl",
    ]
    assert dict(inputs.layers)["torch"] == ("tomli==2.0.0", "h11==0.15.0", "markdown-it-py==2.0.0")
    assert inputs.source_builds == (("markupsafe", "2.0.1"), ("iniconfig", "2.0.0"))
    assert ("tomli", "pypi-again") in inputs.assigned  # torch's stand-in: its own index on x86_64
    assert inputs.indexes == (("pypi", "https://pypi.org/simple"), ("pypi-again", "https://pypi.org/simple"))
    assert inputs.platform == "x86_64-manylinux_2_35"
    order = list(inputs.order)
    assert order.index("build") == order.index("vllm") - 1  # right before the first source build


def test_digest_changes_with_what_the_lock_depends_on_only(tmp_path: Path, test_loaded: LoadedMatrix) -> None:
    target = LockTarget("teststack", "x86_64")
    digest = lock_inputs(test_loaded, target).digest()
    assert digest == lock_inputs(load_matrix(TEST_MATRIX), target).digest()
    cases = {
        "pin": ('version: "3.7"', 'version: "3.6"'),
        "constraint": ('numpy: "<2.0.0"', 'numpy: "<1.27"'),
        "override": ('      numpy: "<2.0.0"\n', '      numpy: "<2.0.0"\n    overrides:\n      six: "==1.16.0"\n'),
        "index": ("url: https://pypi.org/simple\n    arg: PYTORCH", "url: https://mirror.example/simple\n    arg: PYTORCH"),
    }
    for name, edit in cases.items():
        changed = tmp_path / name
        changed.mkdir()
        assert lock_inputs(load_matrix(_copy_matrix(changed, edit)), target).digest() != digest, name
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    edited = load_matrix(_copy_matrix(unrelated, ("CI test stack on the stand-in base", "renamed")))
    assert lock_inputs(edited, target).digest() == digest


def _resolution() -> Resolution:
    torch = LockedPackage("torch", "2.7.1", ["sha256:eee"], ["pins of layer torch"], "pypi")
    verl = LockedPackage("verl", "0.6.1", ["sha256:fff", "sha256:ggg"], ["pins of layer verl"], "pypi")
    source = SourceMetadata("vllm", "0.11.0", "vllm-0.11.0.tar.gz", "1" * 64, "requirements/common.txt", (), ("setuptools",))
    return Resolution({"torch": [torch], "verl": [verl]}, (source,), "uv 0.13.9")


def test_lock_file_round_trips_and_is_a_pip_requirements_file(test_loaded: LoadedMatrix, tmp_path: Path) -> None:
    inputs = lock_inputs(test_loaded, LockTarget("teststack", "aarch64"))
    text = render_lock(inputs, _resolution())
    assert "# status: resolved\n" in text and f"# inputs-sha256: {inputs.digest()}\n" in text
    assert "# layer: torch\ntorch==2.7.1 \\\n    --hash=sha256:eee\n    # index: pypi\n" in text
    path = tmp_path / "x.txt"
    path.write_text(text)
    lock = read_lock(path)
    assert lock.resolved and lock.source_builds == {"vllm"}
    assert [(layer, p.key, p.version, p.hashes, p.source) for layer, p in lock.packages] == [
        ("torch", "torch", "2.7.1", ["sha256:eee"], "pypi"),
        ("verl", "verl", "0.6.1", ["sha256:fff", "sha256:ggg"], "pypi"),
    ]
    # what pip reads: every requirement line carries its hashes (comments are ignored by pip)
    requirements = [line for line in text.splitlines() if line and not line.lstrip().startswith("#")]
    assert requirements[0] == "torch==2.7.1 \\" and requirements[1] == "    --hash=sha256:eee"


def test_unresolved_lock_says_why(test_loaded: LoadedMatrix, tmp_path: Path) -> None:
    inputs = lock_inputs(test_loaded, LockTarget("teststack", "x86_64"))
    path = tmp_path / "x.txt"
    path.write_text(render_unresolved(inputs, "index pypi-again (https://pypi.org/simple) could not be reached"))
    lock = read_lock(path)
    assert not lock.resolved and lock.packages == []
    assert lock.header["reason"].startswith("index pypi-again")


def test_lock_problems_missing_stale_and_garbage(tmp_path: Path) -> None:
    matrix = _copy_matrix(tmp_path)
    loaded = load_matrix(matrix)
    inputs = lock_inputs(loaded, LockTarget("teststack", "x86_64"))
    assert lock_problem(loaded.root, inputs) is None  # the committed locks are current
    (tmp_path / "s").mkdir()
    stale_loaded = load_matrix(_copy_matrix(tmp_path / "s", ('version: "3.7"', 'version: "3.6"')))
    stale = lock_problem(stale_loaded.root, lock_inputs(stale_loaded, LockTarget("teststack", "x86_64")))
    assert stale == (
        "locks/teststack-x86_64.txt is stale: the matrix changed since it was made; run `ascendkit lock --stack teststack --arch x86_64`"
    )
    (tmp_path / "locks" / "teststack-x86_64.txt").write_text("torch==1\n")
    assert "teststack-x86_64.txt:1: not a locked requirement: 'torch==1'" in (lock_problem(loaded.root, inputs) or "")
    (tmp_path / "locks" / "teststack-x86_64.txt").unlink()
    assert lock_problem(loaded.root, inputs) == (
        "locks/teststack-x86_64.txt is missing: run `ascendkit lock --stack teststack --arch x86_64`"
    )


def test_resolution_rules(test_loaded: LoadedMatrix) -> None:
    inputs = lock_inputs(test_loaded, LockTarget("teststack", "x86_64"))
    pins = [LockedPackage(name, version, ["sha256:x"], [], "pypi") for name, version in inputs.pinned.items()]
    for p in pins:
        if p.key == "tomli":
            p.source = "pypi-again"
    _check(inputs, pins)  # as the matrix says: fine
    moved = [LockedPackage(p.name, "0.0.1" if p.key == "six" else p.version, p.hashes, [], p.source) for p in pins]
    with pytest.raises(LockFailed, match=r"six==1\.16\.0 resolved as 0\.0\.1"):
        _check(inputs, moved)
    wrong_index = [LockedPackage(p.name, p.version, p.hashes, [], "pypi") for p in pins]
    with pytest.raises(LockFailed, match="tomli came from pypi, but the matrix assigns it to pypi-again"):
        _check(inputs, wrong_index)
    cuda = [*pins, LockedPackage("triton", "3.3.1", ["sha256:y"], ["h11"], "pypi")]
    _check(replace(inputs, triton_ascend=""), cuda)  # a stack without triton-ascend may have the CUDA triton
    with pytest.raises(LockFailed, match=r"triton==3.3.1 \(the CUDA build, pulled in by h11\) would overwrite triton-ascend"):
        _check(inputs, cuda)


def test_every_stack_and_arch_has_a_target(test_loaded: LoadedMatrix) -> None:
    assert [t.name for t in lock_targets(test_loaded)] == [
        "teststack-x86_64",
        "teststack-aarch64",
        "teststack-sglang-x86_64",
        "teststack-openrlhf-x86_64",
    ]
    with pytest.raises(InputError, match="unknown --stack 'nope'"):
        lock_targets(test_loaded, "nope")


def test_an_index_down_today_keeps_a_current_resolved_lock(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path)
    before = (tmp_path / "locks" / "teststack-x86_64.txt").read_text()
    argv = ["lock", "--matrix", str(matrix), "--stack", "teststack", "--arch", "x86_64", "--pip-index-url", "http://127.0.0.1:9/simple"]
    result = runner.invoke(app, [*argv, "--json"])
    assert result.exit_code == ExitCode.UNVERIFIED, result.output
    [report] = json.loads(result.stdout)["locks"]
    assert report["status"] == "unresolved" and report["changed"] is False
    assert report["detail"].endswith("; kept the current resolved lock")
    assert (tmp_path / "locks" / "teststack-x86_64.txt").read_text() == before


def test_unreachable_index_writes_an_unresolved_lock_and_exits_8(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path)
    (tmp_path / "locks" / "teststack-x86_64.txt").unlink()  # nothing resolved to keep
    argv = ["lock", "--matrix", str(matrix), "--stack", "teststack", "--arch", "x86_64", "--pip-index-url", "http://127.0.0.1:9/simple"]
    result = runner.invoke(app, [*argv, "--json"])
    assert result.exit_code == ExitCode.UNVERIFIED, result.output
    report = json.loads(result.stdout)["locks"]
    assert [(r["lock"], r["status"], r["changed"]) for r in report] == [("locks/teststack-x86_64.txt", "unresolved", True)]
    lock = read_lock(tmp_path / "locks" / "teststack-x86_64.txt")
    assert not lock.resolved and "index pypi (http://127.0.0.1:9/simple) could not be reached" in lock.header["reason"]
    # still current: an unresolved lock is checked for staleness like any other
    assert lock_problem(tmp_path, lock_inputs(load_matrix(matrix), LockTarget("teststack", "x86_64"))) is None


# --- against PyPI ---------------------------------------------------------------------------------

# The re-locks resolve as PyPI stood at one moment (uv's --exclude-newer), so a release after it
# cannot move them: after the newest file the committed locks pin (PyYAML 6.0.4, 2026-11-20T23:34Z)
# and before the releases a from-scratch re-lock would take instead (charset-normalizer 3.5.3 on
# 2026-11-23, packaging 26.4 the same day): without it, that re-lock changed within hours.
AS_OF = ("--exclude-newer", "2026-11-21T00:00:00Z")


@pytest.mark.network
def test_relocking_reproduces_the_committed_test_locks(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path)
    with sglang_standin.serve(sglang_standin.populate(tmp_path / "standin")) as mirror:  # teststack-sglang's index
        result = runner.invoke(app, ["lock", *AS_OF, "--matrix", str(matrix), "--ascend-index-url", f"{mirror}/simple", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in json.loads(result.stdout)["locks"]] == ["resolved"] * 4
    committed = sorted(p.relative_to(TEST_MATRIX.parent).as_posix() for p in (TEST_MATRIX.parent / "locks").rglob("*.txt"))
    # four locks; the per-layer sections of teststack's two arches and of teststack-openrlhf's and
    # teststack-sglang's one; the OpenRLHF source's requirements file, kept from the lock that read it
    # (no git host was asked now)
    assert len(committed) == 4 + 2 * 9 + 9 + 7 + 1
    for name in committed:
        assert (tmp_path / name).read_text() == (TEST_MATRIX.parent / name).read_text(), name


@pytest.mark.network
def test_relocking_reproduces_a_committed_production_lock(tmp_path: Path, runner: CliRunner) -> None:
    """vllm and vllm-ascend metadata from their sdists, the override, the build layer: the committed
    cann8.3 aarch64 lock is what `ascendkit lock` makes today from the matrix."""
    shutil.copy2(ROOT / "compat_matrix.yaml", tmp_path / "compat_matrix.yaml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    result = runner.invoke(
        app, ["lock", *AS_OF, "--matrix", str(tmp_path / "compat_matrix.yaml"), "--stack", "cann8.3", "--arch", "aarch64"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "locks" / "cann8.3-aarch64.txt").read_text() == (ROOT / "locks" / "cann8.3-aarch64.txt").read_text()
    lock = read_lock(ROOT / "locks" / "cann8.3-aarch64.txt")
    layers = {p.key: layer for layer, p in lock.packages}
    assert layers["torch-npu"] == "torch" and layers["setuptools-scm"] == "build" and layers["verl"] == "verl"
    assert "triton" not in layers  # no CUDA triton next to triton-ascend
    vllm = next(p for _, p in lock.packages if p.key == "vllm")
    assert vllm.hashes == ["sha256:f435a64c24e9c4178d657a76f8edd8548ddc444012f7d06a9f79ac3a6392bfae"]  # the sdist's only


@pytest.mark.network
def test_conflicting_pins_fail_and_leave_the_lock_alone(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path, ('      numpy: "<2.0.0"\n', '      numpy: "<2.0.0"\n      six: "<1.16"\n'))
    before = (tmp_path / "locks" / "teststack-aarch64.txt").read_text()
    result = runner.invoke(app, ["lock", *AS_OF, "--matrix", str(matrix), "--arch", "aarch64"])
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert "teststack-aarch64: the pins do not resolve together for aarch64-manylinux_2_35, Python 3.11" in result.stdout
    assert "six" in result.stdout
    assert (tmp_path / "locks" / "teststack-aarch64.txt").read_text() == before


@pytest.mark.network
def test_bumping_verl_changes_only_the_verl_section(tmp_path: Path, runner: CliRunner) -> None:
    """Each pip layer COPYs only its own section, so this is what keeps a verl bump a one-layer rebuild."""
    matrix = _copy_matrix(tmp_path, ('version: "3.7"', 'version: "3.6"'))  # verl's stand-in
    loaded = load_matrix(matrix)
    before = {path: text for t in lock_targets(loaded, "teststack") for path, text in section_texts(load_matrix(TEST_MATRIX), t).items()}
    result = runner.invoke(app, ["lock", *AS_OF, "--matrix", str(matrix), "--stack", "teststack"])
    assert result.exit_code == 0, result.output
    after = {path: text for t in lock_targets(loaded, "teststack") for path, text in section_texts(loaded, t).items()}
    assert sorted(path for path in after if after[path] != before[path]) == [
        "locks/teststack/verl-aarch64.txt",
        "locks/teststack/verl-x86_64.txt",
    ]
    assert "idna==3.6 \\" in after["locks/teststack/verl-x86_64.txt"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "locks" / "teststack").iterdir()) == sorted(after)


@pytest.mark.network
def test_a_relock_as_of_a_day_before_the_pins_existed_cannot_resolve(tmp_path: Path, runner: CliRunner) -> None:
    """--exclude-newer reaches uv: as PyPI stood in 2020, the pinned releases were not there yet."""
    matrix = _copy_matrix(tmp_path)
    before = (tmp_path / "locks" / "teststack-aarch64.txt").read_text()
    result = runner.invoke(
        app, ["lock", "--exclude-newer", "2020-01-01", "--matrix", str(matrix), "--stack", "teststack", "--arch", "aarch64"]
    )
    assert result.exit_code == ExitCode.CHECK_FAILED, result.output
    assert "do not resolve together" in result.stdout
    assert (tmp_path / "locks" / "teststack-aarch64.txt").read_text() == before


@pytest.mark.network
def test_matrix_verify_resolves_each_stack_as_a_whole(tmp_path: Path, runner: CliRunner) -> None:
    ok = runner.invoke(app, ["matrix", "verify", "--matrix", str(TEST_MATRIX), "--arch", "aarch64", "--json"])
    assert ok.exit_code == 0, ok.output
    [together] = [r for r in json.loads(ok.stdout)["results"] if r["component"] == "co-resolution"]
    assert together["finding"] == "found" and together["status"] == "ok"
    assert together["detail"] == "locks/teststack-aarch64.txt is current: 23 packages resolved from these pins"

    # every pin exists, but they cannot be installed together: a conflict, exit 1, the old lock untouched
    matrix = _copy_matrix(tmp_path, ('      numpy: "<2.0.0"\n', '      numpy: "<2.0.0"\n      six: "<1.16"\n'))
    bad = runner.invoke(app, ["matrix", "verify", "--matrix", str(matrix), "--arch", "aarch64", "--json"])
    assert bad.exit_code == ExitCode.CHECK_FAILED, bad.output
    data = json.loads(bad.stdout)
    assert data["summary"]["conflict"] == 1 and data["summary"]["missing"] == 0
    [together] = [r for r in data["results"] if r["component"] == "co-resolution"]
    assert together["finding"] == "conflict" and together["status"] == "error" and "six" in together["detail"]


# --- a framework built from a git checkout: its requirements read at the pinned commit ----------------


OPENRLHF = LockTarget("teststack-openrlhf", "x86_64")
OPENRLHF_LOCK = "locks/teststack-openrlhf-x86_64.txt"
STORED = "locks/_sources/openrlhf-standin/12e2a08edffda11502c61db53dfa9cc7b647b14f/requirements-npu.txt"


@pytest.fixture
def standin_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/harness/gitserver.py serving the OpenRLHF-shaped stand-in repository: the test matrix's GitHub."""
    root = tmp_path_factory.mktemp("git")
    standin_repository(root)
    with serve(root) as url:
        yield url


@pytest.mark.network
def test_a_checkouts_requirements_are_read_from_its_git_host_once_and_kept(tmp_path: Path, runner: CliRunner, standin_host: str) -> None:
    matrix = _copy_matrix(tmp_path)
    shutil.rmtree(tmp_path / "locks" / "_sources")
    (tmp_path / OPENRLHF_LOCK).unlink()
    argv = ["lock", *AS_OF, "--matrix", str(matrix), "--stack", "teststack-openrlhf", "--json"]
    result = runner.invoke(app, [*argv, "--github-url", standin_host])
    assert result.exit_code == 0, result.output
    assert (tmp_path / STORED).read_text() == (TEST_MATRIX.parent / STORED).read_text(), "the file at the commit, kept beside the locks"
    assert (tmp_path / OPENRLHF_LOCK).read_text() == (TEST_MATRIX.parent / OPENRLHF_LOCK).read_text()
    lock = read_lock(tmp_path / OPENRLHF_LOCK)
    (line,) = lock.checkouts
    assert line.startswith(f"openrlhf https://github.com/{REPO_PATH}@12e2a08edffda11502c61db53dfa9cc7b647b14f {STORED} sha256:")
    assert standin_host not in (tmp_path / OPENRLHF_LOCK).read_text(), "the lock names the matrix's host, not the mirror used"
    layers = {p.key: layer for layer, p in lock.packages}
    assert layers["ray"] == "openrlhf" and layers["docopt"] == "deepspeed" and "pynvml" not in layers
    ray = next(p for _, p in lock.packages if p.key == "ray")
    assert ray.via == ["requirements-npu.txt of openrlhf"]
    # kept: a re-lock needs no git host (an unreachable mirror is not even asked)
    again = runner.invoke(app, [*argv, "--github-url", "http://127.0.0.1:9", "--upgrade"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / OPENRLHF_LOCK).read_text() == (TEST_MATRIX.parent / OPENRLHF_LOCK).read_text()


@pytest.mark.network
def test_without_the_file_or_its_git_host_the_lock_is_unresolved_and_says_why(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path)
    shutil.rmtree(tmp_path / "locks" / "_sources")
    assert "was made from locks/_sources/" in (lock_problem(tmp_path, lock_inputs(load_matrix(matrix), OPENRLHF)) or "")
    argv = ["lock", *AS_OF, "--matrix", str(matrix), "--stack", "teststack-openrlhf", "--github-url", "http://127.0.0.1:9", "--json"]
    result = runner.invoke(app, argv)
    assert result.exit_code == ExitCode.UNVERIFIED, result.output
    [report] = json.loads(result.stdout)["locks"]
    assert report["status"] == "unresolved" and "127.0.0.1:9" in report["detail"]
    assert re.search(r"git fetch (failed|of \w+ took over 5 s)", report["detail"]), "refused, or timed out on a busy machine"


@pytest.mark.network
def test_a_commit_the_host_does_not_have_fails_the_lock(tmp_path: Path, runner: CliRunner, standin_host: str) -> None:
    missing = "0123456789abcdef0123456789abcdef01234567"
    matrix = _copy_matrix(tmp_path, ("ref: 12e2a08edffda11502c61db53dfa9cc7b647b14f", f"ref: {missing}"))
    argv = ["lock", *AS_OF, "--matrix", str(matrix), "--stack", "teststack-openrlhf", "--github-url", standin_host, "--json"]
    result = runner.invoke(app, argv)
    assert result.exit_code == ExitCode.CHECK_FAILED, result.output
    [report] = json.loads(result.stdout)["locks"]
    assert report["status"] == "failed" and f"has no commit {missing}" in report["detail"]


@pytest.mark.network
def test_a_package_the_npu_install_leaves_out_fails_the_lock(tmp_path: Path, runner: CliRunner) -> None:
    matrix = _copy_matrix(tmp_path, ("leaves_out: [flash-attn, bitsandbytes, pynvml]", "leaves_out: [flash-attn, Ray]"))
    result = runner.invoke(app, ["lock", *AS_OF, "--matrix", str(matrix), "--stack", "teststack-openrlhf", "--json"])
    assert result.exit_code == ExitCode.CHECK_FAILED, result.output
    [report] = json.loads(result.stdout)["locks"]
    assert (
        "ray==2.43.0 (pulled in by requirements-npu.txt of openrlhf) is one of the packages the framework's NPU install leaves out"
        in (report["detail"])
    )


def test_an_edited_copy_of_the_checkouts_requirements_makes_the_lock_stale(tmp_path: Path) -> None:
    matrix = _copy_matrix(tmp_path)
    loaded = load_matrix(matrix)
    assert lock_problem(tmp_path, lock_inputs(loaded, OPENRLHF)) is None
    stored = tmp_path / STORED
    stored.write_text(stored.read_text() + "flash-attn\n")
    problem = lock_problem(tmp_path, lock_inputs(loaded, OPENRLHF))
    assert problem is not None and "was made from another" in problem and STORED in problem


def test_the_checkout_and_what_it_leaves_out_are_lock_inputs(test_loaded: LoadedMatrix) -> None:
    inputs = lock_inputs(test_loaded, OPENRLHF)
    (spec,) = inputs.checkouts
    assert (spec.layer, spec.repo_path, spec.commit, spec.file) == (
        "openrlhf",
        REPO_PATH,
        "12e2a08edffda11502c61db53dfa9cc7b647b14f",
        "requirements-npu.txt",
    )
    assert spec.install_env == (("TARGET_DEVICE", "NPU"),) and spec.stored == STORED
    assert inputs.leaves_out == ("bitsandbytes", "flash-attn", "pynvml")
    plain = lock_inputs(test_loaded, LockTarget("teststack", "x86_64"))
    assert plain.checkouts == () and plain.leaves_out == ()
