"""``docs/verl-parity.md``: every image verl publishes for Ascend, beside the stack and tags ascendkit builds for
it, and each difference with its reason. Written by ``ascendkit render --all`` from the matrix and the vendored
upstream files (``upstream/``), guarded by ``render --check``: a new verl image, a moved pin or a new reason
changes the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.parity import ImageParity, Row, Vendored, parities, problems
from buildkit.matrix.upstream import CHIP_OF_CANN
from buildkit.plan import full_tag
from buildkit.text import md_cell as _cell

PARITY_PAGE = "docs/verl-parity.md"
TAGS_FILE = "verl/main/supported_tags.md"
_LINK = re.compile(r"\[([^\]]+)\]\((https://github\.com/[^/]+/[^/]+/blob/(.+)/docker/ascend/([^)/]+))\)")


@dataclass(frozen=True)
class VerlImage:
    section: str
    device: str
    cann: str
    backend: str
    release: str  # the verl release, in the release section; else the model, or ""
    tag: str
    linked: str  # the Dockerfile the table links, as vendored (verl/<branch>/<name>)


def verl_images(text: str) -> list[VerlImage]:
    """The rows of verl's supported_tags.md, by section, in its order."""
    images: list[VerlImage] = []
    section, header = "", list[str]()
    for line in text.splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), []
            continue
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = [c.lower() for c in cells]
            continue
        row = dict(zip(header, cells, strict=False))
        link = _LINK.search(row.get("dockerfile", ""))
        tag = row.get("image tag", "").strip("`")
        extra = row.get("verl release version") or row.get("model") or ""
        linked = f"verl/{link.group(3)}/{link.group(4)}" if link else ""
        images.append(
            VerlImage(section, row.get("device", ""), row.get("cann base image", ""), row.get("inference backend", ""), extra, tag, linked)
        )
    return images


def _file_for(image: VerlImage, vendored: Vendored) -> str:
    """The vendored Dockerfile a row stands for: the one it links, or, where the tree moved it, the same name on main."""
    if image.linked in vendored.sources:
        return image.linked
    name = image.linked.rsplit("/", 1)[-1]
    return f"verl/main/{name}" if f"verl/main/{name}" in vendored.sources else ""


def _for_device(image: VerlImage, parity: ImageParity, found: list[ImageParity]) -> tuple[ImageParity, str]:
    """The stack's image for the row's device: where verl's table links the other chip's file (its v0.7.0 rows
    do), the sibling built for the device, with a note saying so."""
    chip = CHIP_OF_CANN.get(image.device.lower())  # verl's table names devices as the CANN base tags do
    if parity.image.base is None or chip is None or parity.image.base.chip == chip:
        return parity, ""
    for other in found:
        if other.stack_id == parity.stack_id and other.image.base is not None and other.image.base.chip == chip:
            return (
                other,
                f" (verl's table links {parity.file.rsplit('/', 1)[-1]} for this device; {other.file.rsplit('/', 1)[-1]} builds it)",
            )
    return parity, ""


def _images_table(loaded: LoadedMatrix, vendored: Vendored, found: list[ImageParity]) -> list[str]:
    by_file = {p.file: p for p in found}
    lines = []
    section = ""
    for image in verl_images(vendored.text(TAGS_FILE)):
        if image.section != section:
            section = image.section
            lines += [
                "",
                f"### {section}",
                "",
                "| device | CANN | engine | verl | verl's tag | Dockerfile | ascendkit stack | ascendkit tag |",
                "|---|---|---|---|---|---|---|---|",
            ]
        file = _file_for(image, vendored)
        parity = by_file.get(file)
        if not file:
            dockerfile, ours, tag = f"{image.linked.rsplit('/', 1)[-1]} (not in the tree at {vendored.commit(TAGS_FILE)[:8]})", "none", ""
        else:
            dockerfile = f"[{file.removeprefix('verl/')}]({vendored.url(file)})"
            if parity is None:
                ours, tag = "none", ""
            else:
                parity, note = _for_device(image, parity, found)
                stack = loaded.matrix.stacks[parity.stack_id]
                chip = parity.image.base.chip if parity.image.base is not None else None
                ours = f"`{parity.stack_id}`" + note
                tag = f"`{full_tag(stack, chip, stack.os[0])}`" if chip is not None else ""
        cells = [image.device, image.cann, image.backend, image.release, f"`{image.tag}`", dockerfile, ours, tag]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _difference_rows(rows: list[tuple[str, Row]]) -> list[str]:
    lines = ["| component | upstream installs | ascendkit pins | read from | why |", "|---|---|---|---|---|"]
    for file, row in rows:
        why = row.reason if row.reason is not None else "**no reason given**"
        lines.append("| " + " | ".join(_cell(c) for c in (row.component, row.theirs, row.ours, row.where or file, why)) + " |")
    return lines


def _stack_sections(loaded: LoadedMatrix, found: list[ImageParity]) -> list[str]:
    lines: list[str] = []
    for stack_id in dict.fromkeys(p.stack_id for p in found):
        mine = [p for p in found if p.stack_id == stack_id]
        lines += ["", f"### `{stack_id}`", "", "Compared with " + ", ".join(f"`{p.file.removeprefix('verl/')}`" for p in mine) + "."]
        differing = [(p.file, row) for p in mine for row in p.differences]
        seen: dict[tuple[str, str, str], tuple[str, Row]] = {}
        for file, row in differing:  # the same difference in the a2 and a3 files is one row
            seen.setdefault((row.component, row.theirs, row.ours), (file, row))
        if seen:
            lines += ["", *_difference_rows(list(seen.values()))]
        else:
            lines += ["", "No differences."]
        loose = sorted({f"{row.component} ({row.theirs})" for p in mine for row in p.rows if row.status == "unpinned upstream"})
        if loose:
            lines += ["", "Left unpinned upstream, pinned here: " + ", ".join(loose) + "."]
        same = sorted({row.component for p in mine for row in p.rows if row.status == "same"})
        lines += ["", "The same on both sides: " + ", ".join(same) + "."]
        upstream = loaded.matrix.stacks[stack_id].upstream
        if upstream is not None and upstream.unconfirmed:
            lines += ["", "Not confirmed from a primary source (pinned as the evidence below allows, and said so):", ""]
            lines += [f"- **{component}**: {' '.join(why.split())}" for component, why in upstream.unconfirmed.items()]
    return lines


def parity_page(loaded: LoadedMatrix) -> str:
    vendored = Vendored.load(loaded.root)
    found = parities(loaded, vendored)
    tags = vendored.sources[TAGS_FILE]
    lines = [
        "# ascendkit and verl's Ascend images",
        "",
        "<!-- Generated by `ascendkit render --all` from compat_matrix.yaml and upstream/; do not edit. -->",
        "",
        "verl publishes Ascend images and keeps their Dockerfiles in `docker/ascend/` with the table of their tags, "
        f"`supported_tags.md` (read at verl-project/verl@{tags['commit'][:8]}, vendored in `upstream/`). ",
        "Each ascendkit stack that stands for some of them names them (`upstream.images` in the matrix); the pins each "
        "Dockerfile installs are read from it the way its shell runs it (for aarch64, the Ascend hosts'), following the "
        "requirement files it installs from vllm-ascend's and verl's branches, and set beside the stack. Every difference "
        "carries its reason from the matrix; `tests/test_verl_parity.py` fails on one without.",
        "",
        "## verl's images and the ascendkit stack for each",
        *_images_table(loaded, vendored, found),
        "",
        "## Differences, stack by stack",
        *_stack_sections(loaded, found),
    ]
    left = problems(loaded, found)
    if left:
        lines += ["", "## Not yet explained", "", *[f"- {_cell(p)}" for p in left]]
    return "\n".join(lines) + "\n"
