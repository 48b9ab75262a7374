"""Verification's checks of what was built from source or changed after install, on recorded facts:
the commit a checkout holds, the requirements its NPU install was built with, the patches.
(The probe itself runs in real images: tests/test_build.py, tests/test_openrlhf_image.py.)"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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
        "checkout openrlhf": ("pass", COMMIT),
        "openrlhf requirements": ("pass", "none of them (4 requirements)"),
        "patch vllm-ascend vllm_ascend/platform.py": ("pass", "commented out at line 48 of 0.8.5rc1"),
    }


def test_another_commit_a_gpu_build_or_a_lost_patch_fails() -> None:
    wrong = _status(_facts(git_revisions=f"openrlhf {COMMIT} {'f' * 40}\n"))
    assert wrong["checkout openrlhf"] == ("fail", "f" * 40)
    gpu = _status(_facts(requires={"openrlhf": ["torch", "flash-attn==2.7.4.post1", "pynvml>=12.0.0", "ray[default]==2.43.0"]}))
    assert gpu["openrlhf requirements"] == ("fail", "requires flash-attn, pynvml"), "built without TARGET_DEVICE=NPU"
    assert _status(_facts(requires={}))["openrlhf requirements"] == ("fail", "not an installed distribution")
    assert _status(_facts(patches=()))["patch vllm-ascend vllm_ascend/platform.py"] == (
        "fail",
        "not applied (no record in /etc/ascendkit/patches.json)",
    )
    edited = ({**RECORD, "sha256_after": "a" * 64, "sha256_now": "b" * 64},)
    assert _status(_facts(patches=edited))["patch vllm-ascend vllm_ascend/platform.py"] == ("fail", "the file changed after the patch")
    other = ({**RECORD, "comment_out": "x = 1", "sha256_after": "a" * 64, "sha256_now": "a" * 64},)
    assert _status(_facts(patches=other))["patch vllm-ascend vllm_ascend/platform.py"][0] == "fail"
