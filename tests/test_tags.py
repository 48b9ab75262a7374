"""The image tag grammar."""

from __future__ import annotations

from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import alias_tags, full_tag


def test_full_tag(loaded: LoadedMatrix) -> None:
    stack = loaded.matrix.stacks["cann8.3"]
    assert full_tag(stack, "a3", "ubuntu22.04") == "verl0.6.1-cann8.3.rc1-torch_npu2.7.1-a3-ubuntu22.04-py3.11"


def test_aliases_for_default_and_other_stacks(loaded: LoadedMatrix) -> None:
    default = loaded.matrix.stacks["cann8.3"]
    assert alias_tags("cann8.3", default, "a2", "ubuntu22.04") == ["cann8.3-a2-ubuntu22.04", "cann8.3-a2", "latest-a2"]
    other = loaded.matrix.stacks["cann9.1"]
    assert alias_tags("cann9.1", other, "a3", "ubuntu22.04") == ["cann9.1-a3-ubuntu22.04", "cann9.1-a3"]
    assert alias_tags("cann9.1", other, "a3", "openeuler24.03") == ["cann9.1-a3-openeuler24.03"]


def test_tags_are_valid_docker_tags(loaded: LoadedMatrix) -> None:
    import re

    for stack_id, stack in loaded.matrix.stacks.items():
        for os_name in stack.os:
            for tag in [full_tag(stack, "a2", os_name), *alias_tags(stack_id, stack, "a2", os_name)]:
                assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag
