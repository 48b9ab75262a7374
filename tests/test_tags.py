"""The image tag grammar."""

from __future__ import annotations

from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import alias_tags, full_tag
from tests.conftest import TEST_MATRIX


def test_full_tag() -> None:
    """The grammar, on the test matrix's stacks (their pins are the fixture's, not the shipped ones)."""
    stacks = load_matrix(TEST_MATRIX).matrix.stacks
    assert full_tag(stacks["teststack"], "a3", "debian12") == "verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11"
    assert full_tag(stacks["teststack-openrlhf"], "a2", "debian12") == "openrlhf0.7.5-cann8.3.rc1-torch_npu2.0.0-a2-debian12-py3.11"


def test_aliases_for_default_and_other_stacks(loaded: LoadedMatrix) -> None:
    name = loaded.default_stack()
    default = loaded.matrix.stacks[name]
    chip, os_name = loaded.matrix.stack_chips(default)[0], default.os[0]
    assert alias_tags(name, default, chip, os_name) == [f"{name}-{chip}-{os_name}", f"{name}-{chip}", f"latest-{chip}"]
    assert name != "cann9.1", "the other stack below is not the default"
    other = loaded.matrix.stacks["cann9.1"]
    assert alias_tags("cann9.1", other, "a3", "ubuntu22.04") == ["cann9.1-a3-ubuntu22.04", "cann9.1-a3"]
    assert alias_tags("cann9.1", other, "a3", "openeuler24.03") == ["cann9.1-a3-openeuler24.03"]


def test_tags_are_valid_docker_tags(loaded: LoadedMatrix) -> None:
    import re

    for stack_id, stack in loaded.matrix.stacks.items():
        for os_name in stack.os:
            for tag in [full_tag(stack, "a2", os_name), *alias_tags(stack_id, stack, "a2", os_name)]:
                assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag


def test_the_tag_grammar_round_trips() -> None:
    """plan/ owns the grammar ship/ asks: per-arch tags, the index's bare names, compression variants."""
    from buildkit.plan import arch_tag, index_tag, tag_of, variant_tag

    name = "verl0.6.1-cann8.3.rc1-torch_npu2.7.1-a3-ubuntu22.04-py3.11"
    per_arch = arch_tag(name, "aarch64")
    assert per_arch == f"{name}-aarch64" and index_tag(per_arch, "aarch64") == name
    assert index_tag(per_arch, "x86_64") == per_arch, "only its own arch is taken off"
    assert variant_tag(per_arch, "gzip") == per_arch and variant_tag(per_arch, "zstd") == f"{name}-aarch64-zstd"
    assert tag_of(f"ascendkit/verl:{per_arch}") == per_arch and tag_of(f"127.0.0.1:5000/x/verl:{name}") == name
