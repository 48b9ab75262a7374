"""Which images a command means: --hw/--stack/--os/--arch checked against the matrix, one or all."""

from __future__ import annotations

from buildkit.arch import ARCHES, Arch
from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, check_stack_sku, resolve_hw, resolve_stack
from buildkit.plan.image import ImagePlan, RenderTarget, plan_image, stack_skus_on_chip


def default_stack_for(loaded: LoadedMatrix, hw: str) -> tuple[str, str | None]:
    """The stack ``--hw`` means without ``--stack``: the matrix's default where it builds ``hw``, else
    the one stack that does, with a note saying so (several or none: the default, which the caller refuses)."""
    default = loaded.default_stack()
    target = resolve_hw(loaded, hw)
    stacks = loaded.matrix.stacks

    def builds(stack_id: str) -> bool:
        stack = stacks[stack_id]
        return target.sku_id in stack.skus if target.sku_id is not None else bool(stack_skus_on_chip(loaded, stack, target.chip_id))

    able = [s for s in stacks if builds(s)]
    if builds(default) or len(able) != 1:
        return default, None
    return able[0], f"--hw {hw}: the default stack {default!r} builds none of it; using {able[0]!r}, the one stack that does"


def plan_target(loaded: LoadedMatrix, hw: str, stack_name: str | None, os_name: str | None, notes: list[str] | None = None) -> RenderTarget:
    """Check that ``--hw``/``--stack``/``--os`` name a Dockerfile the matrix supports. Without a
    stack, :func:`default_stack_for` picks it; its note, if any, is appended to ``notes``."""
    if stack_name is None:
        stack_name, note = default_stack_for(loaded, hw)
        if note and notes is not None:
            notes.append(note)
    stack_id, stack = resolve_stack(loaded, stack_name)
    target = resolve_hw(loaded, hw)
    if target.sku_id is not None:
        check_stack_sku(loaded, stack_id, target.sku_id)
    if not stack_skus_on_chip(loaded, stack, target.chip_id):
        others = [s for s, st in loaded.matrix.stacks.items() if stack_skus_on_chip(loaded, st, target.chip_id)]
        hint = f" (stacks for {target.chip_id}: {', '.join(others)}; pass --stack)" if others else ""
        raise InputError(f"stack {stack_id!r} has no SKU on chip {target.chip_id!r}; it supports: {', '.join(stack.skus)}{hint}")
    chosen_os = stack.os[0] if os_name is None else os_name
    if chosen_os not in stack.os:
        raise InputError(f"stack {stack_id!r} is not built on --os {chosen_os!r}; choose one of: {', '.join(stack.os)}")
    return RenderTarget(stack_id, target.chip_id, chosen_os)


def hosts_arch(loaded: LoadedMatrix, hw: str) -> Arch:
    """The CPU architecture of the hosts ``--hw`` names (the default --arch: images run there)."""
    arches = sorted({sku.host_arch for sku in resolve_hw(loaded, hw).skus(loaded).values()})
    if len(arches) != 1:
        raise InputError(f"the SKUs of --hw {hw} run on {' and '.join(arches) or 'no'} hosts; give --arch")
    return arches[0]


def all_targets(loaded: LoadedMatrix) -> list[RenderTarget]:
    targets = []
    for stack_id, stack in loaded.matrix.stacks.items():
        targets += [RenderTarget(stack_id, chip, os_name) for chip in loaded.matrix.stack_chips(stack) for os_name in stack.os]
    return targets


def plan_fleet(
    loaded: LoadedMatrix, *, stack: str | None = None, hw: str | None = None, os_name: str | None = None, arch: str | None = None
) -> list[ImagePlan]:
    """Every image the matrix defines (one per stack, chip, OS and arch), narrowed by the filters;
    in an order that shares build cache: by arch, then stack, chip and OS."""
    matrix = loaded.matrix
    if stack is not None:
        resolve_stack(loaded, stack)
    named = resolve_hw(loaded, hw) if hw is not None else None
    if os_name is not None and not any(os_name in s.os for s in matrix.stacks.values()):
        raise InputError(
            f"no stack is built on --os {os_name!r}; the matrix has: {', '.join(sorted({o for s in matrix.stacks.values() for o in s.os}))}"
        )
    if arch is not None and arch not in ARCHES:
        raise InputError(f"unknown --arch {arch!r}; choose one of: {', '.join(ARCHES)}")
    plans = []
    for target in all_targets(loaded):
        st = matrix.stacks[target.stack_id]
        if stack not in (None, target.stack_id) or os_name not in (None, target.os_name):
            continue
        if named is not None and (named.chip_id != target.chip_id or (named.sku_id is not None and named.sku_id not in st.skus)):
            continue
        plans += [plan_image(loaded, target, a) for a in st.arches if arch in (None, a)]
    if not plans:
        raise InputError("no image of the matrix matches these filters (see `ascendkit plan --all`)")
    return sorted(plans, key=lambda p: (p.arch, p.stack_id, p.chip_id, p.os_name))
