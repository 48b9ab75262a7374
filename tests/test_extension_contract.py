"""The compiled extensions the matrix says a source build must produce, against the build scripts
of the very sdists the images build from (PyPI): each module the matrix names for a pin is an
extension module its setup.py declares, so verification looks for what the build really makes."""

from __future__ import annotations

import re

import pytest

from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from tests.conftest import ROOT
from tests.harness.upstream import sdist_member

PINS = sorted(
    {
        (pin.package or component.replace("_", "-"), pin.version, module)
        for stack in load_matrix(ROOT / DEFAULT_MATRIX).matrix.stacks.values()
        for component, pin in stack.pins().items()
        for module in pin.extensions
    }
)


def test_every_stack_names_vllm_ascends_kernels() -> None:
    assert {(p, m) for p, _, m in PINS} == {("vllm-ascend", "vllm_ascend.vllm_ascend_C")}
    built = {
        st.vllm_ascend.version
        for st in load_matrix(ROOT / DEFAULT_MATRIX).matrix.stacks.values()
        if st.vllm_ascend is not None and st.vllm_ascend.build_from_source
    }
    assert {v for _, v, _ in PINS} == built, "one per vllm-ascend release the stacks build from source, read from the matrix"


@pytest.mark.parametrize(("project", "version", "module"), PINS)
def test_the_extension_is_one_the_sdists_setup_py_builds(project: str, version: str, module: str) -> None:
    setup = sdist_member(project, version, "setup.py")
    declared = re.findall(r"Extension\(\s*name\s*=\s*[\"']([\w.]+)[\"']", setup)
    assert module in declared, f"{project} {version} setup.py declares {declared}"
    assert "COMPILE_CUSTOM_KERNELS" in setup, "built only with its custom kernels switched on, as the images build it"
