"""The resolved image plan: for one (stack, chip, OS, arch), everything later stages read.

Computed once from the matrix: the ordered install layers with their pins and lock sections
(:mod:`buildkit.ship.layers.compressing`), the git checkouts, the base image, tags, labels and the versions verification
expects (:mod:`.image`), and which images a command means (:mod:`.targets`). lock, render,
wheelhouse, build, verify and smoke take these values; none of them re-derives any of it.

Tag grammar (one place, so tags are consistent by construction):
    <repo>:verl<verl>-cann<cann>-torch_npu<torch_npu>-<chip>-<os>-py<python>   (full, immutable)
    <repo>:<stack>-<chip>[-<os>]                                            (stack alias)
    <repo>:latest-<chip>                                                    (default stack only)
each per arch as <tag>-<arch> (the index takes the bare names), and each in another compression
as <tag>-<compression> (<tag>-zstd): arch_tag, index_tag, variant_tag in :mod:`.image`.
"""

from __future__ import annotations

from buildkit.plan.image import (
    DEFAULT_COMPRESSION,
    GitCheckout,
    ImagePlan,
    RenderTarget,
    alias_tags,
    arch_tag,
    base_image_ref,
    base_image_tag,
    full_tag,
    index_tag,
    plan_image,
    stack_skus_on_chip,
    tag_of,
    variant_tag,
)
from buildkit.plan.layers import (
    BUILD_LAYER,
    CONSTRAINTS_FILE,
    DOCKERFILES_DIR,
    ENTRYPOINT,
    GIT_LAYER,
    IMAGE_LOCKS_DIR,
    INSTALLER_ARG,
    INSTALLERS,
    LABEL_PREFIX,
    LOCKS_DIR,
    PRIMARY_INDEX,
    USER_LABEL,
    UV_LAYER,
    WORKSPACE,
    FrameworkCheckout,
    Layer,
    Pin,
    StackLayers,
    dist_name,
    expected_packages,
    lock_path,
    pin_of,
    section_path,
    stack_layers,
)
from buildkit.plan.targets import all_targets, hosts_arch, plan_fleet, plan_target

__all__ = [
    "BUILD_LAYER",
    "CONSTRAINTS_FILE",
    "DEFAULT_COMPRESSION",
    "DOCKERFILES_DIR",
    "ENTRYPOINT",
    "GIT_LAYER",
    "IMAGE_LOCKS_DIR",
    "INSTALLERS",
    "INSTALLER_ARG",
    "LABEL_PREFIX",
    "LOCKS_DIR",
    "PRIMARY_INDEX",
    "USER_LABEL",
    "UV_LAYER",
    "WORKSPACE",
    "FrameworkCheckout",
    "GitCheckout",
    "ImagePlan",
    "Layer",
    "Pin",
    "RenderTarget",
    "StackLayers",
    "alias_tags",
    "all_targets",
    "arch_tag",
    "base_image_ref",
    "base_image_tag",
    "dist_name",
    "expected_packages",
    "full_tag",
    "hosts_arch",
    "index_tag",
    "lock_path",
    "pin_of",
    "plan_fleet",
    "plan_image",
    "plan_target",
    "section_path",
    "stack_layers",
    "stack_skus_on_chip",
    "tag_of",
    "variant_tag",
]
