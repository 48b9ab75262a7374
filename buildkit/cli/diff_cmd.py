"""``ascendkit diff A B``: two published images compared file by file (which layer, which file, what differs)."""

from __future__ import annotations

from typing import Annotated

import typer

from buildkit.cli.base import ArchChoice, JsonFlag, app, out, print_json, user_errors
from buildkit.errors import ExitCode


@app.command("diff")
@user_errors
def diff(
    image_a: Annotated[str, typer.Argument(help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:... (a registry's copy).", metavar="A")],
    image_b: Annotated[str, typer.Argument(help="The image to compare it with, named the same way.", metavar="B")],
    arch: ArchChoice = None,
    full: Annotated[
        bool,
        typer.Option("--all", help="List each file that differs only in what publishing normalizes (its time), not a count a layer."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare two published images as a rebuild is checked: the same manifest digest, or what differs. The layers
    are paired first, so a layer only one image has (added on top, inserted or dropped anywhere) is named with its
    step and every file it adds or removes (whiteouts as removals); in the layers both have, each file whose content,
    mode, owner, link, kind or presence differs; then, one line per layer, what is only normalization (times, tar
    headers, compression; --all lists it). Exit 0 when they are the same image, 1 when they differ."""
    from buildkit.ship.imagediff import check_ref, diff_images, normalization_summary, read_published, report_lines

    for ref in (image_a, image_b):  # both, before either registry is asked
        check_ref(ref)
    a, b = read_published(image_a, arch), read_published(image_b, arch)
    same = a.manifest.digest == b.manifest.digest
    found = [] if same else diff_images(a, b)
    if as_json:
        print_json(
            {
                "a": a.manifest.digest, "b": b.manifest.digest, "same": same, "differences": [d.as_dict() for d in found],
                "normalization": normalization_summary(found),
            }
        )  # fmt: skip
    elif same:
        out.print(f"the same image: {a.manifest.digest}")
    else:
        changed = sum(not d.normalization for d in found)
        out.print(f"{a.manifest.digest} (A) and {b.manifest.digest} (B) differ in {len(found)} place(s), {changed} beyond normalization:")
        for line in report_lines(found, full):
            out.print(f"  {line}")
    if not same:
        raise typer.Exit(ExitCode.CHECK_FAILED)
