"""The one image-tag grammar, derived from the matrix so tags are consistent by construction.

<repo>:verl<verl>-cann<cann>-torch_npu<torch_npu>-<chip>-<os>-py<python>   (full, immutable)
<repo>:<stack>-<chip>[-<os>]                                            (stack alias)
<repo>:latest-<chip>                                                    (default stack only)
"""

from __future__ import annotations

from buildkit.model import Stack


def full_tag(stack: Stack, chip_id: str, os_name: str) -> str:
    return f"verl{stack.verl.version}-cann{stack.cann.lower()}-torch_npu{stack.torch_npu.version}-{chip_id}-{os_name}-py{stack.python}"


def arch_tag(tag: str, arch: str) -> str:
    """What ``ascendkit build`` tags locally: every tag above, per architecture."""
    return f"{tag}-{arch}"


def alias_tags(stack_id: str, stack: Stack, chip_id: str, os_name: str) -> list[str]:
    """Moving aliases for a built image; the first OS of a stack also gets the short forms."""
    tags = [f"{stack_id}-{chip_id}-{os_name}"]
    if os_name == stack.os[0]:
        tags.append(f"{stack_id}-{chip_id}")
        if stack.default:
            tags.append(f"latest-{chip_id}")
    return tags
