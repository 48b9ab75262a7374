"""Vendored upstream source files (tests/fixtures/upstream/<project>/ with a SOURCES.json): where
each file came from and its sha256, checked here before a test reads the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


def vendored(project: str) -> dict[str, Path]:
    """Each file of ``project`` by its upstream path, every one's sha256 checked against SOURCES.json."""
    directory = UPSTREAM / project
    sources = json.loads((directory / "SOURCES.json").read_text(encoding="utf-8"))
    files: dict[str, Path] = {}
    for entry in sources["files"]:
        path = directory / entry["file"]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"{path} is not the file vendored from {sources['repository']}@{sources['tag']}"
        files[entry["path"]] = path
    return files
