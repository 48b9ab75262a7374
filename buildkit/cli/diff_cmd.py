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
    as_json: JsonFlag = False,
) -> None:
    """Compare two published images as a rebuild is checked: the same manifest digest, or each differing file
    named with its layer and what differs (content, mtime, mode, owner, link, kind, on one side only) and each
    differing config field. Exit 0 when they are the same image, 1 when they differ."""
    from buildkit.ship.imagediff import check_ref, diff_images, read_published

    for ref in (image_a, image_b):  # both, before either registry is asked
        check_ref(ref)
    a, b = read_published(image_a, arch), read_published(image_b, arch)
    same = a.manifest.digest == b.manifest.digest
    found = [] if same else diff_images(a, b)
    if as_json:
        print_json({"a": a.manifest.digest, "b": b.manifest.digest, "same": same, "differences": [d.as_dict() for d in found]})
    elif same:
        out.print(f"the same image: {a.manifest.digest}")
    else:
        out.print(f"{a.manifest.digest} (A) and {b.manifest.digest} (B) differ in {len(found)} place(s):")
        for difference in found:
            out.print(f"  {difference.line()}")
    if not same:
        raise typer.Exit(ExitCode.CHECK_FAILED)
