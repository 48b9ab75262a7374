"""The test stack's OpenRLHF source: the stand-in tree of tests/fixtures/openrlhf-standin with the
real ``train_ppo_ray.py`` (vendored verbatim from the fork at the pinned commit) in its place, as a
git repository whose commit id depends on the files alone (the test matrix pins it: so its README
still names this module's old place, tests/openrlhf_standin.py, and tests/gitserver.py; a word
changed there is a new commit to pin)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from tests.harness.gitserver import make_repository

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STANDIN = FIXTURES / "openrlhf-standin"
UPSTREAM = FIXTURES / "upstream" / "openrlhf"
REPO_PATH = "ascendkit-standin/OpenRLHF.git"  # the test matrix's repo openrlhf-standin


def vendored() -> list[dict[str, Any]]:
    """The vendored upstream files and where they came from (SOURCES.json)."""
    files: list[dict[str, Any]] = json.loads((UPSTREAM / "SOURCES.json").read_text(encoding="utf-8"))["files"]
    return files


def vendored_file(path: str) -> Path:
    """A vendored file by its path in the upstream repository, its sha256 checked."""
    entry = next(e for e in vendored() if e["path"] == path)
    file: Path = UPSTREAM / entry["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry["sha256"], f"{file} is not the vendored upstream file"
    return file


def fork_archive() -> Path:
    """The fork's installable package at the pinned commit (a git archive, vendored), its sha256 and every member's
    git blob id checked; ``make cpu-run`` installs it into OpenRLHF stacks' CPU environments."""
    import tarfile

    entry = next(e for e in vendored() if "members" in e)
    file: Path = UPSTREAM / entry["file"]
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry["sha256"], f"{file} is not the vendored upstream archive"
    with tarfile.open(file) as archive:
        found = {}
        for member in archive.getmembers():
            if member.isfile():
                data = archive.extractfile(member).read()  # type: ignore[union-attr]
                found[member.name.split("/", 1)[1]] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert found == entry["members"], f"{file}: its members are not the recorded blobs of {entry['commit']}"
    return file


def standin_tree(dest: Path) -> Path:
    """The stand-in source tree with OpenRLHF's real CLI module in it, written to ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(STANDIN, dest, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(vendored_file("openrlhf/cli/train_ppo_ray.py"), dest / "openrlhf" / "cli" / "train_ppo_ray.py")
    return dest


def standin_repository(root: Path) -> str:
    """A bare repository of the tree at ``root/REPO_PATH``, for tests/harness/gitserver.py; returns its commit."""
    tree = standin_tree(root / "standin-tree")
    commit = make_repository(tree, root / REPO_PATH, "OpenRLHF-shaped stand-in source for ascendkit's tests")
    shutil.rmtree(tree)
    return commit
