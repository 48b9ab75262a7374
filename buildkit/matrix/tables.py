"""Support tables (release lines and SKUs) generated from the matrix, as Markdown or reStructuredText."""

from __future__ import annotations

from typing import Literal

from buildkit.framework import title_of
from buildkit.matrix.model import TOOL_COMPONENTS, Matrix, Stack

TableFormat = Literal["md", "rst"]
Table = tuple[list[str], list[list[str]]]


def _git(stack: Stack) -> str:
    parts = [p.ref for p in (stack.mindspeed, stack.megatron_lm) if p is not None]
    return " / ".join(parts) if parts else "-"


def tools_cell(stack: Stack) -> str:
    """Ascend's tools the stack's images carry (``-`` for none; ``ascend_tools: false`` carries none)."""
    tools = [f"{pin.dist(c)} {pin.version}" for c, pin in stack.pins().items() if c in TOOL_COMPONENTS]
    return ", ".join(tools) or "-"


def framework_cell(stack: Stack) -> str:
    """``verl 0.6.1``; ``OpenRLHF 0.7.5 @06ac74cf`` (built from that commit of its Ascend source)."""
    title = title_of(stack.framework)
    if (source := stack.framework_source) is not None:
        return f"{title} {source.version} @{source.ref[:8]}"
    return f"{title} {stack.framework_version}"


def stacks_table(matrix: Matrix) -> Table:
    header = [
        "stack",
        "CANN",
        "Python",
        "torch / torch_npu",
        "torchvision",
        "triton-ascend",
        "rollout engine",
        "transformers",
        "MindSpeed / Megatron-LM",
        "mbridge",
        "DeepSpeed",
        "Ascend tools",
        "framework",
        "OS",
        "SKUs",
    ]
    rows = []
    for name, s in matrix.stacks.items():
        rows.append(
            [
                f"{name} (default)" if s.default else name,
                s.cann,
                s.python,
                f"{s.torch.version} / {s.torch_npu.version}",
                s.torchvision.version,
                s.triton_ascend.version if s.triton_ascend else "-",
                s.rollout_pins,
                s.transformers.version,
                _git(s),
                s.mbridge.version if s.mbridge else "-",
                s.deepspeed.version if s.deepspeed else "-",
                tools_cell(s),
                framework_cell(s),
                ", ".join(s.os),
                ", ".join(s.skus),
            ]
        )
    return header, rows


def skus_table(matrix: Matrix) -> Table:
    header = ["--hw", "product", "chip", "CANN image chip", "SOC_VERSION", "NPUs per node", "k8s accelerator-type"]
    rows = []
    for sku_id, sku in matrix.skus.items():
        chip = matrix.chips[sku.chip]
        rows.append(
            [
                sku_id,
                sku.product,
                f"{sku.chip}: {chip.name}",
                chip.cann_chip,
                chip.soc_version,
                str(sku.npus_per_node),
                sku.k8s_accelerator_type,
            ]
        )
    for chip_id, chip in matrix.chips.items():
        if chip_id not in matrix.skus:
            members = [k for k, s in matrix.skus.items() if s.chip == chip_id]
            rows.append([chip_id, f"alias: {', '.join(members)}", f"{chip_id}: {chip.name}", chip.cann_chip, chip.soc_version, "-", "-"])
    return header, rows


def drivers_table(matrix: Matrix) -> Table:
    """The host drivers each CANN of the stacks runs on, with where Ascend says so."""
    header = ["CANN", "stacks", "host driver (Ascend HDK)", "source"]
    rows = []
    for cann in sorted({s.cann for s in matrix.stacks.values()}, key=lambda c: [int(p) if p.isdigit() else -1 for p in c.split(".")]):
        stacks = ", ".join(name for name, s in matrix.stacks.items() if s.cann == cann)
        entry = matrix.compat.cann_drivers.get(cann)
        hdk = entry.describe() if entry else "-"
        rows.append([cann, stacks, hdk, " ".join(entry.source.split()) if entry else "-"])
    return header, rows


def format_table(table: Table, fmt: TableFormat) -> str:
    header, rows = table
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def rule(char: str) -> str:
        return "+" + "+".join(char * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [rule("-"), line(header), rule("=")]
    for row in rows:
        out += [line(row), rule("-")]
    return "\n".join(out) + "\n"


def support_tables(matrix: Matrix, fmt: TableFormat) -> str:
    """The tables as they appear in docs/matrix.md: release lines, SKUs, host drivers."""
    return "\n".join(format_table(t(matrix), fmt) for t in (stacks_table, skus_table, drivers_table))
