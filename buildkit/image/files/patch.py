"""ascendkit: comment one line out of an installed distribution's file, in the open, and record it.

Run by the image's build right after the layer that installs the distribution (the matrix's
``patches:``, rendered into the Dockerfile), with the image's own Python and no other package:

    python3 patch.py DIST FILE LINE REASON

The line must stand in the file exactly once (surrounding whitespace aside): a patch written for
one version that meets another fails the build, naming the distribution, its version and the file,
instead of silently doing nothing. The line becomes ``pass`` with the original after it as a
comment, so a block it was the only statement of stays valid Python; the file must still compile.
The change and a unified diff of it are appended to /etc/ascendkit/patches.json, which the image's
verification and its SBOM read.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import py_compile
import sys
from importlib import metadata
from pathlib import Path

RECORD = Path("/etc/ascendkit/patches.json")
MARK = "# ascendkit patch (see /etc/ascendkit/patches.json): "


def patch(dist: str, relative: str, line: str, reason: str, record: Path = RECORD) -> dict[str, object]:
    try:
        distribution = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"ascendkit patch: {dist} is not installed; the patch of {relative} cannot be applied") from None
    where = f"{dist} {distribution.version} {relative}"
    path = Path(str(distribution.locate_file(relative)))
    if not path.is_file():
        raise SystemExit(f"ascendkit patch: {where}: no such file in the installed distribution")
    before = path.read_text(encoding="utf-8")
    lines = before.splitlines(keepends=True)
    hits = [i for i, text in enumerate(lines) if text.strip() == line.strip()]
    if len(hits) != 1:
        raise SystemExit(
            f"ascendkit patch: {where}: the line {line.strip()!r} stands there {len(hits)} times, not once; "
            "the patch was written for another version of it"
        )
    index = hits[0]
    original = lines[index]
    indent = original[: len(original) - len(original.lstrip())]
    ending = original[len(original.rstrip("\r\n")) :] or "\n"
    lines[index] = f"{indent}pass  {MARK}{original.strip()}{ending}"
    after = "".join(lines)
    try:
        compile(after, str(path), "exec")
    except SyntaxError as exc:
        raise SystemExit(f"ascendkit patch: {where}: with line {index + 1} commented out the file does not compile: {exc.msg}") from None
    path.write_text(after, encoding="utf-8")
    py_compile.compile(str(path), doraise=True)  # the bytecode the install compiled is for the old text
    diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), lines, fromfile=f"a/{relative}", tofile=f"b/{relative}", n=1))
    entry: dict[str, object] = {
        "package": distribution.metadata["Name"],
        "version": distribution.version,
        "file": relative,
        "line": index + 1,
        "comment_out": original.strip(),
        "reason": reason,
        "sha256_before": hashlib.sha256(before.encode("utf-8")).hexdigest(),
        "sha256_after": hashlib.sha256(after.encode("utf-8")).hexdigest(),
        "diff": diff,
    }
    done = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else []
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps([*done, entry], indent=2) + "\n", encoding="utf-8")
    print(f"ascendkit patch: {where} line {index + 1}: commented out {original.strip()!r}")
    return entry


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: patch.py DIST FILE LINE REASON", file=sys.stderr)
        return 2
    dist, relative, line, reason = argv
    patch(dist, relative, line, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
