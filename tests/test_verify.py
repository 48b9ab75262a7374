"""Verification's checks of what was built from source or changed after install, on recorded facts:
the commit a checkout holds, the requirements its NPU install was built with, the patches.
(The probe itself runs in real images: tests/test_build.py, tests/test_openrlhf_image.py.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from buildkit.doctor.base import Check
from buildkit.image.buildplan import plan_build
from buildkit.image.manifest import recorded_check
from buildkit.image.verify import Expected, ImageFacts, compare
from buildkit.matrix.load import load_matrix
from buildkit.plan import plan_image, plan_target
from tests.conftest import MATRIX

COMMIT = "06ac74cf1ea896c379ef4cb6a39dbd8488fb16fd"
LINE = 'os.environ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"'
RECORD = {"package": "vllm_ascend", "version": "0.8.5rc1", "file": "vllm_ascend/platform.py", "line": 48, "comment_out": LINE}


def _expected() -> Expected:
    loaded = load_matrix(MATRIX)
    plan = plan_image(loaded, plan_target(loaded, "a2", "openrlhf-cann8.1", None), "aarch64")
    return Expected(
        stack_id=plan.stack_id,
        chip_id=plan.chip_id,
        skus=plan.skus,
        os_name=plan.os_name,
        arch="aarch64",
        python="3.10",
        cann="8.1.RC1",
        base_image="b",
        packages=(),
        labels=(),
        commits=plan.expected_sources.commits,
        leaves_out=plan.expected_sources.leaves_out,
        patches=plan.expected_sources.patches,
    )


def _facts(**changes: Any) -> ImageFacts:
    base = ImageFacts(
        image_id="sha256:" + "1" * 64,
        architecture="arm64",
        labels={},
        python="3.10.12",
        machine="aarch64",
        packages={},
        os_release={"ID": "ubuntu", "VERSION_ID": "22.04"},
        cann_version="8.1.RC1",
        cann_source="x",
        env={"ASCEND_HOME_PATH": "/usr/local/Ascend"},
        doctor_exit=10,
        doctor_report={"checks": []},
        git_revisions=f"openrlhf {COMMIT} {COMMIT}\n",
        patches=({**RECORD, "sha256_after": "a" * 64, "sha256_now": "a" * 64},),
        requires={"openrlhf": ["torch==2.5.1", "deepspeed==0.16.7", "ray[default]==2.43.0", "transformers==4.52.2"]},
    )
    return replace(base, **changes)


def _status(facts: ImageFacts) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.actual) for c in compare(facts, _expected()) if c.name.startswith(("checkout", "openrlhf", "patch"))}


def test_the_expectations_come_from_the_matrix() -> None:
    expected = _expected()
    assert expected.commits == (("openrlhf", COMMIT),)
    assert expected.leaves_out == (("openrlhf", ("flash-attn", "bitsandbytes", "pynvml")),)
    assert expected.patches == (("vllm-ascend", "vllm_ascend/platform.py", LINE),)


def test_an_image_as_built_passes() -> None:
    assert _status(_facts()) == {
        "checkout openrlhf": ("ok", COMMIT),
        "openrlhf requirements": ("ok", "none of them (4 requirements)"),
        "patch vllm-ascend vllm_ascend/platform.py": ("ok", "commented out at line 48 of 0.8.5rc1"),
    }


def test_another_commit_a_gpu_build_or_a_lost_patch_fails() -> None:
    wrong = _status(_facts(git_revisions=f"openrlhf {COMMIT} {'f' * 40}\n"))
    assert wrong["checkout openrlhf"] == ("error", "f" * 40)
    gpu = _status(_facts(requires={"openrlhf": ["torch", "flash-attn==2.7.4.post1", "pynvml>=12.0.0", "ray[default]==2.43.0"]}))
    assert gpu["openrlhf requirements"] == ("error", "requires flash-attn, pynvml"), "built without TARGET_DEVICE=NPU"
    assert _status(_facts(requires={}))["openrlhf requirements"] == ("error", "not an installed distribution")
    assert _status(_facts(patches=()))["patch vllm-ascend vllm_ascend/platform.py"] == (
        "error",
        "not applied (no record in /etc/ascendkit/patches.json)",
    )
    edited = ({**RECORD, "sha256_after": "a" * 64, "sha256_now": "b" * 64},)
    assert _status(_facts(patches=edited))["patch vllm-ascend vllm_ascend/platform.py"] == ("error", "the file changed after the patch")
    other = ({**RECORD, "comment_out": "x = 1", "sha256_after": "a" * 64, "sha256_now": "a" * 64},)
    assert _status(_facts(patches=other))["patch vllm-ascend vllm_ascend/platform.py"][0] == "error"


USER = {
    "uid": 1000,
    "gid": 1000,
    "name": "HwHiAiUser",
    "home": "/home/HwHiAiUser",
    "writable": {"/home/HwHiAiUser": True, "/workspace": True},
    "unreadable": {"count": 0, "first": []},
    "imports": {"torch": {"torch": "", "torchgen": ""}, "uv": {"uv": ""}},
}


def _user_checks(**changes: Any) -> dict[str, tuple[str, str]]:
    facts = _facts(config_user=changes.pop("config_user", "1000:1000"), user={**USER, **changes})
    expected = replace(_expected(), user=("HwHiAiUser", 1000, 1000))
    return {c.name: (c.status, c.actual) for c in compare(facts, expected) if c.name.startswith("user")}


def test_the_image_runs_as_its_user_who_can_write_read_and_import() -> None:
    assert _user_checks() == {
        "user in config": ("ok", "1000:1000"),
        "user": ("ok", "HwHiAiUser 1000:1000"),
        "user can write": ("ok", "/home/HwHiAiUser, /workspace"),
        "user can read": ("ok", "all"),
        "user can import": ("ok", "3 modules of 2 pinned packages found"),
    }


def test_root_a_missing_passwd_entry_or_unreadable_files_fail_naming_them() -> None:
    assert _user_checks(config_user="")["user in config"] == ("error", "(root)")
    assert _user_checks(name=None, uid=1000)["user"] == ("error", "(no passwd entry) 1000:1000")
    assert _user_checks(gid=0)["user"] == ("error", "HwHiAiUser 1000:0")
    assert _user_checks(writable={"/home/HwHiAiUser": True, "/workspace": False})["user can write"] == ("error", "cannot write /workspace")
    unreadable = {"count": 31, "first": ["/opt/verl/", "/usr/lib/python3/dist-packages/x.py"]}
    assert _user_checks(unreadable=unreadable)["user can read"] == (
        "error",
        "31 unreadable: /opt/verl/, /usr/lib/python3/dist-packages/x.py",
    )
    imports = {"torch": {"torch": "not found on sys.path"}, "uv": {"uv": ""}}
    assert _user_checks(imports=imports)["user can import"] == ("error", "cannot import torch (torch): not found on sys.path")


def test_the_expected_user_comes_from_the_matrix(tmp_path: Path) -> None:
    text = MATRIX.read_text().replace("  uid: 1000\n  gid: 1000\n", "  uid: 1001\n  gid: 1002\n", 1)
    assert text != MATRIX.read_text()
    other = tmp_path / "compat_matrix.yaml"
    other.write_text(text)
    (tmp_path / "locks").symlink_to(MATRIX.parent / "locks")  # the user is not an input of any lock
    plan = plan_build(load_matrix(other), "a3", arch="aarch64", use_default_ca=False)
    assert plan.expected.user == ("HwHiAiUser", 1001, 1002)
    assert ("io.ascendkit.user", "HwHiAiUser 1001:1002") in plan.expected.labels
    assert "USER 1001:1002\n" in plan.dockerfile
    assert "add-user.sh HwHiAiUser 1001 1002 /home/HwHiAiUser /workspace" in plan.dockerfile


# ---------------------------------------------------------------------------------------------
# Compiled extensions a source build must produce (vllm-ascend's custom ops)

EXT = "vllm_ascend.vllm_ascend_C"
SO = "/usr/local/lib/python3.11/site-packages/vllm_ascend/vllm_ascend_C.cpython-311-aarch64-linux-gnu.so"


def _extension(found: dict[str, Any] | None) -> tuple[str, str]:
    expected = replace(_expected(), extensions=(("vllm_ascend", EXT),))
    facts = _facts(extensions={EXT: found} if found is not None else {})
    (check,) = [c for c in compare(facts, expected) if c.name.startswith("extension")]
    assert check.name == "extension vllm_ascend" and check.expected == f"{EXT} built, its libraries resolvable"
    return check.status, check.actual


def test_every_stack_expects_vllm_ascends_custom_ops(tmp_path: Path) -> None:
    plan = plan_build(load_matrix(MATRIX), "a3", arch="aarch64", use_default_ca=False)
    assert plan.expected.extensions == (("vllm_ascend", EXT),) and plan.expected.modules == (EXT,)
    loaded = load_matrix(MATRIX)
    assert all(stack.vllm_ascend.extensions == (EXT,) for stack in loaded.matrix.stacks.values() if stack.vllm_ascend is not None)


def test_an_extension_whose_libraries_resolve_passes_and_the_drivers_are_allowed() -> None:
    found = {"file": SO, "needed": ["libtorch.so", "libascendcl.so", "libascend_hal.so", "libc.so.6"], "unresolved": ["libascend_hal.so"]}
    assert _extension(found) == ("ok", f"{SO}: 4 libraries resolve (libascend_hal.so from the host's driver)")


def test_a_build_without_its_extension_or_with_unresolved_libraries_fails_naming_the_component() -> None:
    status, actual = _extension({"file": None, "error": "no vllm_ascend_C.*.so in /site/vllm_ascend"})
    assert status == "error" and actual.startswith("missing: no vllm_ascend_C.*.so") and "its kernels were not compiled" in actual
    assert _extension(None)[0] == "error", "not probed is not passed"
    status, actual = _extension({"file": SO, "needed": ["libascendcl.so", "libopapi.so"], "unresolved": ["libopapi.so"]})
    assert (status, actual) == ("error", f"{SO}: libopapi.so not found in the image (nor the driver's)")


def test_a_tool_that_does_not_import_fails_verification_naming_the_component() -> None:
    """Ascend's tools are imported for real in the image (`imports` of their pins), not only found."""
    expected = replace(_expected(), imports=(("msprobe", "msprobe"), ("ais_bench", "ais_bench")))
    facts = _facts(imported={"msprobe": "", "ais_bench": "ModuleNotFoundError: No module named 'pyext'"})
    checks = {c.name: c for c in compare(facts, expected) if c.name.startswith("import ")}
    assert (checks["import msprobe"].status, checks["import msprobe"].actual) == ("ok", "imported")
    assert checks["import ais_bench"].status == "error" and checks["import ais_bench"].expected == "ais-bench imports"
    assert checks["import ais_bench"].actual == "ModuleNotFoundError: No module named 'pyext'"
    missing = {c.name: c for c in compare(_facts(), expected) if c.name.startswith("import ")}
    assert missing["import msprobe"].status == "error" and missing["import msprobe"].actual == "not probed"


def test_the_shipped_tools_are_imported_where_a_stack_carries_them() -> None:
    loaded = load_matrix(MATRIX)
    plan = plan_build(loaded, "a3", arch="aarch64", use_default_ca=False)
    assert plan.expected.imports == (("msprobe", "msprobe"), ("msprof_analyze", "msprof_analyze"), ("ais_bench", "ais_bench"))
    assert plan.expected.import_modules == ("msprobe", "msprof_analyze", "ais_bench")
    nine = plan_build(loaded, "a3", stack="cann9.1", arch="aarch64", use_default_ca=False)
    assert [m for _, m in nine.expected.imports] == ["msprobe", "msprof_analyze"], "ais-bench is left out of the NumPy 2 line"


def test_a_check_recorded_before_the_one_vocabulary_reads_in_it() -> None:
    """Build manifests written before checks had one vocabulary (pass, fail, absent; no detail) still read."""
    old = recorded_check({"name": "python", "expected": "3.11", "actual": "3.11", "status": "pass"})
    assert (old.status, old.detail, old.expected, old.actual) == ("ok", "3.11", "3.11", "3.11")
    assert recorded_check({"name": "cann", "expected": "8.3.RC1", "actual": "none", "status": "absent"}).status == "warn"
    assert recorded_check({"name": "user", "expected": "a", "actual": "b", "status": "fail"}).failed
    new = Check("lock", "warn", "expected x, found y", expected="x", actual="y")
    assert recorded_check(new.describe()) == new
