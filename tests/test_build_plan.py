"""Build planning (what --dry-run prints): tags, base image, build args, secrets kept apart."""

from __future__ import annotations

import inspect
import json
import shutil
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.cli import app, build_cmd
from buildkit.errors import ExitCode, InputError
from buildkit.image.buildplan import plan_build
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import INSTALLERS
from buildkit.settings import Mirrors
from tests.conftest import MATRIX, ROOT, default_tag, write_unresolved_locks

TEST_MATRIX = ROOT / "tests/fixtures/test_matrix.yaml"
PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


@pytest.mark.default_stack
def test_plan_for_the_default_stack(loaded: LoadedMatrix) -> None:
    plan = plan_build(loaded, "a3", arch="aarch64", use_default_ca=False)
    assert plan.base_image == "quay.io/ascend/cann:8.3.rc1-a3-ubuntu22.04-py3.11"
    assert plan.platform == "linux/arm64"
    assert plan.refs == [
        f"ascendkit/verl:{default_tag(loaded)}-aarch64",
        "ascendkit/verl:cann8.3-a3-ubuntu22.04-aarch64",
        "ascendkit/verl:cann8.3-a3-aarch64",
        "ascendkit/verl:latest-a3-aarch64",
    ]
    assert dict(plan.expected.packages)["torch-npu"] == loaded.matrix.stacks[loaded.default_stack()].torch_npu.version
    labels = dict(plan.expected.labels)
    assert labels["org.opencontainers.image.base.name"] == plan.base_image
    assert labels["io.ascendkit.soc-version"] == "ascend910_9391"
    assert plan.dockerfile == (ROOT / "Dockerfile.a3").read_text()


def test_mirror_and_local_base(loaded: LoadedMatrix) -> None:
    plan = plan_build(
        loaded, "a2-box16", mirrors=Mirrors({"base_registry": "quay.nju.edu.cn/ascend"}, {"base_registry": "flag"}), use_default_ca=False
    )
    stack = loaded.matrix.stacks[loaded.default_stack()]
    assert plan.base_image == f"quay.nju.edu.cn/ascend/cann:{stack.cann.lower()}-910b-{stack.os[0]}-py{stack.python}"
    assert dict(plan.buildargs)["BASE_IMAGE"] == plan.base_image
    assert "swr.cn-south-1.myhuaweicloud.com/ascendhub/cann" in plan.base_mirrors
    with pytest.raises(InputError, match="give one"):
        plan_build(
            loaded, "a3", base_image="x:y", mirrors=Mirrors({"base_registry": "m/a"}, {"base_registry": "flag"}), use_default_ca=False
        )


def test_credentials_never_become_build_args(loaded: LoadedMatrix, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(PEM)
    mirrors = Mirrors(
        {
            "ca_bundle": str(ca),
            "pip_index_url": "https://bot:t0k3n@mirror.example.com/simple",
            "pytorch_index_url": "https://mirror.example.com/torch-cpu",
        }
    )
    plan = plan_build(loaded, "a3", mirrors=mirrors)
    assert dict(plan.buildargs)["PIP_INDEX_URL"] == "https://mirror.example.com/simple"
    assert dict(plan.buildargs)["PYTORCH_INDEX_URL"] == "https://mirror.example.com/torch-cpu"
    assert "t0k3n" not in json.dumps(plan.describe())
    assert plan.secrets.ca_bundle == PEM
    assert plan.secrets.env == (("PIP_INDEX_URL", "https://bot:t0k3n@mirror.example.com/simple"),)
    assert "t0k3n" not in repr(plan)


def test_default_ca_from_environment(loaded: LoadedMatrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "host.pem"
    ca.write_bytes(PEM)
    monkeypatch.delenv("PIP_CERT", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert plan_build(loaded, "a3").secrets.ca_bundle == PEM
    assert plan_build(loaded, "a3", use_default_ca=False).secrets.ca_bundle == b""


def test_unsupported_arch(loaded: LoadedMatrix) -> None:
    with pytest.raises(InputError, match="not built for --arch 'riscv64'"):
        plan_build(loaded, "a3", arch="riscv64", use_default_ca=False)


def test_test_stack_plan() -> None:
    plan = plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", use_default_ca=False)
    assert plan.refs[0] == "ascendkit/verl:verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11-x86_64"
    assert dict(plan.expected.packages) == {
        "h11": "0.15.0",
        "idna": "3.7",
        "iniconfig": "2.0.0",
        "markdown-it-py": "2.0.0",
        "markupsafe": "2.0.1",
        "mccabe": "0.7.0",
        "six": "1.16.0",
        "tomli": "2.0.0",
        "wcwidth": "0.2.13",
    }


def test_dry_run_json(runner: CliRunner) -> None:
    result = runner.invoke(
        app, ["build", "--hw", "a3", "--dry-run", "--json", "--no-ca-bundle", "--arch", "x86_64", "--matrix", str(MATRIX)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["dry_run"] is True
    assert data["plan"]["tags"][0].endswith("-a3-ubuntu22.04-py3.11-x86_64")
    assert data["plan"]["ca_bundle"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--push"], "--push needs --registry"),
        (["--registry", "nohost"], "expected HOST[:PORT]/REPO"),
        (["--ca-bundle", "/nonexistent.pem"], "not found"),
        (["--arch", "ppc64le"], "'ppc64le' is not one of 'aarch64', 'x86_64'"),
        (["--builder", "kaniko"], "'kaniko' is not one of 'auto', 'buildkit', 'classic'"),
        (["--builder", "classic", "--cache-repo", "harbor.example.com/ml/buildcache"], "--cache-repo needs BuildKit"),
        (["--cache-repo", "harbor.example.com/ml/buildcache:v1"], "expected a registry repository without a tag"),
        (["--cache-repo", "buildcache"], "expected a registry repository without a tag, HOST[:PORT]/PATH"),
    ],
)
def test_bad_build_options(runner: CliRunner, argv: list[str], message: str) -> None:
    result = runner.invoke(app, ["build", "--hw", "a3", "--dry-run", *argv, "--matrix", str(MATRIX)])
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert message in result.stderr


def test_the_registry_cache_is_one_tag_per_stack_chip_os_and_arch(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """--cache-repo (or ASCENDKIT_CACHE_REPO, as the CI files set it; empty: none) names the
    repository; each image's cache is a tag in it. The plan keeps both renders of the Dockerfile."""
    plan = plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", use_default_ca=False, cache_repo="harbor.example.com/ml/buildcache")
    assert plan.cache_ref == "harbor.example.com/ml/buildcache:buildcache-teststack-a3-debian12-x86_64"
    assert plan.builder == "auto" and plan.describe()["cache"] == plan.cache_ref
    assert "--mount=type=cache" in plan.dockerfile_for("buildkit") and "--mount" not in plan.dockerfile_for("classic")
    argv = ["build", "--hw", "a3", "--dry-run", "--json", "--no-ca-bundle", "--arch", "x86_64", "--matrix", str(TEST_MATRIX)]
    monkeypatch.setenv("ASCENDKIT_CACHE_REPO", "127.0.0.1:5000/ci/buildcache")
    described = json.loads(runner.invoke(app, argv).stdout)["plan"]
    assert described["cache"] == "127.0.0.1:5000/ci/buildcache:buildcache-teststack-a3-debian12-x86_64"
    monkeypatch.setenv("ASCENDKIT_CACHE_REPO", "")
    assert json.loads(runner.invoke(app, argv).stdout)["plan"]["cache"] is None


def test_only_declared_args_are_passed() -> None:
    mirrors = Mirrors({"gitcode_url": "https://gitcode.example.com", "apt_mirror": "http://mirrors.example.com"})
    plan = plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", mirrors=mirrors, use_default_ca=False)
    assert "GITCODE_URL" not in dict(plan.buildargs)  # the test stack's Dockerfile has no such ARG
    assert dict(plan.buildargs)["APT_MIRROR"] == "http://mirrors.example.com"


def test_credentials_in_extra_index_urls(loaded: LoadedMatrix) -> None:
    extra = "https://a.example.com/simple https://bot:pw@b.example.com/simple"
    plan = plan_build(loaded, "a3", mirrors=Mirrors({"pip_extra_index_url": extra}), use_default_ca=False)
    assert dict(plan.buildargs)["PIP_EXTRA_INDEX_URL"] == "https://a.example.com/simple https://b.example.com/simple"
    assert plan.secrets.env == (("PIP_EXTRA_INDEX_URL", extra),)


def test_plan_carries_both_locks_and_checks_every_locked_package() -> None:
    plan = plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", use_default_ca=False)
    layers = ["uv", "torch", "triton-ascend", "build", "vllm", "vllm-ascend", "transformers", "ascend-tools", "verl"]
    assert [relative for relative, _ in plan.lock_files] == [
        f"locks/teststack/{layer}-{arch}.txt" for arch in ("x86_64", "aarch64") for layer in layers
    ]
    sections = dict(plan.lock_files)
    assert sections["locks/teststack/verl-x86_64.txt"].splitlines()[1:3] == ["# status: resolved", "idna==3.7 \\"]
    assert plan.lock_status == "resolved" and plan.warnings == ()
    assert plan.expected.lock == "locks/teststack-x86_64.txt"
    assert ("wheel", "0.48.0") in plan.expected.locked  # the build layer's packages are verified too
    assert plan.describe()["lock"] == "locks/teststack-x86_64.txt"


def test_a_stale_lock_refuses_the_build(tmp_path: Path) -> None:
    matrix = tmp_path / "test_matrix.yaml"
    matrix.write_text(TEST_MATRIX.read_text().replace('version: "3.7"', 'version: "3.6"'))
    shutil.copytree(TEST_MATRIX.parent / "locks", tmp_path / "locks")
    with pytest.raises(InputError, match=r"locks/teststack-x86_64.txt is stale: .*\(the image carries it; nothing was built\)"):
        plan_build(load_matrix(matrix), "a3", arch="x86_64", use_default_ca=False)


def test_an_unresolved_lock_builds_with_a_warning(tmp_path: Path) -> None:
    matrix = tmp_path / "test_matrix.yaml"
    shutil.copy2(TEST_MATRIX, matrix)
    write_unresolved_locks(matrix, "index pypi-again could not be reached")
    plan = plan_build(load_matrix(matrix), "a3", arch="x86_64", use_default_ca=False)
    assert plan.lock_status == "unresolved" and plan.expected.lock == ""
    assert plan.expected.unresolved_lock == "locks/teststack-x86_64.txt"  # the manifest will say so
    assert plan.warnings == (
        "locks/teststack-x86_64.txt is unresolved (index pypi-again could not be reached): this image installs its pins "
        "without hash checks; run `ascendkit lock` where the index answers to enforce them",
    )
    with pytest.raises(InputError, match="an offline build needs a resolved lock"):
        plan_build(load_matrix(matrix), "a3", arch="x86_64", use_default_ca=False, wheelhouse=tmp_path)


def test_offline_needs_both_flags(runner: CliRunner, tmp_path: Path) -> None:
    for argv in (["--offline"], ["--wheelhouse", str(tmp_path)]):
        result = runner.invoke(app, ["build", "--hw", "a3", "--dry-run", *argv, "--matrix", str(TEST_MATRIX)])
        assert result.exit_code == ExitCode.INVALID_INPUT
        assert "--offline and --wheelhouse DIR go together" in result.stderr


def test_the_default_arch_is_the_skus_hosts_and_emulation_is_said(loaded: LoadedMatrix, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("buildkit.image.buildplan.platform.machine", lambda: "x86_64")
    plan = plan_build(loaded, "a3", use_default_ca=False)
    assert plan.arch == "aarch64", "A2/A3 hosts are aarch64 (Kunpeng); the image is for them"
    assert any("emulated with qemu" in w and "--arch x86_64 builds for this machine" in w for w in plan.warnings)
    native = plan_build(loaded, "a3", arch="x86_64", use_default_ca=False)
    assert not any("emulated" in w for w in native.warnings)
    monkeypatch.setattr("buildkit.image.buildplan.platform.machine", lambda: "aarch64")
    assert not any("emulated" in w for w in plan_build(loaded, "a2", use_default_ca=False).warnings)


def test_the_default_arch_follows_the_matrix(loaded: LoadedMatrix) -> None:
    from buildkit.plan import hosts_arch

    assert {hosts_arch(loaded, hw) for hw in ("a2", "a2-box16", "900-podc", "a3")} == {"aarch64"}
    assert hosts_arch(load_matrix(TEST_MATRIX), "a3") == "x86_64"  # the stand-in SKUs are the CI machines


def test_the_installer_is_a_build_arg_only_when_it_is_not_the_dockerfiles_default(loaded: LoadedMatrix) -> None:
    """uv is the Dockerfile's default, so a uv build passes no ARG (plain `docker build` of the
    committed Dockerfile shares its cache); pip is passed; anything else is refused before a build."""
    assert "ASCENDKIT_INSTALLER" not in dict(plan_build(loaded, "a3", use_default_ca=False).buildargs)
    assert dict(plan_build(loaded, "a3", use_default_ca=False, installer="pip").buildargs)["ASCENDKIT_INSTALLER"] == "pip"
    with pytest.raises(InputError, match="--installer 'conda': choose one of uv, pip"):
        plan_build(loaded, "a3", use_default_ca=False, installer="conda")


def test_the_cli_offers_exactly_the_installers_the_plan_knows() -> None:
    """`build --installer` is a Literal for Typer's own choice checking; it must list what
    buildkit.plan.INSTALLERS lists, default first."""
    hint = typing.get_type_hints(build_cmd.build, include_extras=True)["installer"]
    choices = typing.get_args(typing.get_args(hint)[0])
    assert choices == INSTALLERS
    assert inspect.signature(build_cmd.build).parameters["installer"].default == INSTALLERS[0]
