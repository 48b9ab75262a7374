"""The upstream files the repository reads at render time (``upstream/``), vendored from git snapshots.

verl publishes its Ascend images' Dockerfiles in ``docker/ascend/`` with the table of their tags
(``supported_tags.md``); those Dockerfiles install vllm-ascend's ``requirements.txt`` and verl's
``requirements-npu.txt`` from the branches they clone. ``upstream/SOURCES.json`` names each vendored
file's repository, branch, commit, git blob and sha256; ``tests/test_verl_parity.py`` checks every
sha256. After upstream moves, with local clones of both repositories:

    python -m tests.harness.upstream_files vendor VERL_GIT_DIR VLLM_ASCEND_GIT_DIR

rewrites ``upstream/`` from the refs below and the release archives (then commit it, re-run
``ascendkit render --all`` and read the parity page's diff); ``python -m tests.harness.upstream_files archives``
takes the release archives alone.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

UPSTREAM = ROOT / "upstream"
VERL = "https://github.com/verl-project/verl"
VLLM_ASCEND = "https://github.com/vllm-project/vllm-ascend"

# (repository, its key in the local clones, branch, the paths to take from its head)
WANTED: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (VERL, "verl", "main", ("docker/ascend/*", "requirements-npu.txt")),
    # supported_tags.md points the v0.6.1 and v0.7.0 release images at their release branches' Dockerfiles.
    (VERL, "verl", "release/v0.6.1", ("docker/ascend/Dockerfile.ascend_8.2.rc1_*", "requirements-npu.txt")),
    (VERL, "verl", "release/v0.7.0", ("docker/ascend/Dockerfile.ascend_8.3.rc1_*", "requirements-npu.txt")),
    (VERL, "verl", "release/v0.7.1", ("requirements-npu.txt",)),
    (VERL, "verl", "release/v0.8.0", ("requirements-npu.txt",)),
    # vllm-ascend's tags and release branches the Dockerfiles clone: the requirements.txt they install.
    (VLLM_ASCEND, "vllm-ascend", "v0.9.1", ("requirements.txt",)),
    (VLLM_ASCEND, "vllm-ascend", "v0.11.0rc1", ("requirements.txt",)),
    (VLLM_ASCEND, "vllm-ascend", "v0.11.0", ("requirements.txt",)),
    (VLLM_ASCEND, "vllm-ascend", "releases/v0.13.0", ("requirements.txt",)),
    (VLLM_ASCEND, "vllm-ascend", "releases/v0.18.0", ("requirements.txt",)),
    (VLLM_ASCEND, "vllm-ascend", "releases/v0.23.0", ("requirements.txt", "Dockerfile")),  # its own image, for matrix import
)


# Releases read from their source archive on PyPI where no git snapshot holds them: (the project, which also names
# their folder here, the release, the sdist's sha256 as PyPI's index listed it when it was read, the members to take).
# vllm-ascend 0.30.0rc2 (2026-10-13) is the newest of the v0.30.0 line on PyPI: the fetchable git snapshot of
# vllm-project/vllm-ascend ends at 2026-08-22 and PyPI has no v0.30.0 final.
ARCHIVES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "vllm-ascend",
        "0.30.0rc2",
        "05cb51448c0cd174ea338b16ebbfc8e215f44b373ea2a0d65f1314523a01152f",
        (
            "Dockerfile",
            "Dockerfile.a3",
            "Dockerfile.a5",
            "Dockerfile.openEuler",
            "Dockerfile.a3.openEuler",
            "Dockerfile.a5.openEuler",
            "requirements.txt",
            "docs/source/community/versioning_policy.md",
            ".github/workflows/scripts/install_daily_deps.sh",  # the Dockerfiles' last step: TorchNPU and triton-ascend dailies
        ),
    ),
)

ABOUT = (
    "Upstream files ascendkit reads: verl's Ascend Dockerfiles and their tag table, the requirement files those "
    "Dockerfiles install, and vllm-ascend's own Dockerfiles and requirements where no git snapshot holds the release "
    "(taken from its sdist on PyPI, checked against the sdist's sha256: `archive`, `archive_sha256`). "
    "The parity page (docs/verl-parity.md) and `ascendkit matrix import` read them; "
    "tests/test_verl_parity.py checks each sha256. Vendor again with `python -m tests.harness.upstream_files vendor`."
)


def vendor_archives() -> list[dict[str, str]]:
    """The ARCHIVES' members, from the sdist as :func:`tests.harness.upstream.fetch` takes it from PyPI (checked
    against the index's sha256), which must still be the sha256 recorded here before one byte is written."""
    from tests.harness.upstream import fetch, members

    entries = []
    for project, version, sha256, wanted in ARCHIVES:
        path, artifact = fetch(project, version, "sdist")
        if artifact.sha256 != sha256:
            raise SystemExit(f"{artifact.url}: sha256 {artifact.sha256}, {sha256} when it was read")
        found = members(path, wanted)  # each one named must be there
        for member in wanted:  # in the order written here
            text = found[member]
            file = f"{project}/v{version}/{member.rsplit('/', 1)[-1]}"
            (UPSTREAM / file).parent.mkdir(parents=True, exist_ok=True)
            (UPSTREAM / file).write_bytes(text)
            entries.append(
                {
                    "file": file,
                    "repository": f"https://pypi.org/project/{project}/{version}/",
                    "branch": f"v{version}",
                    "path": member,
                    "archive": artifact.url,
                    "archive_sha256": sha256,
                    "blob": hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest(),
                    "sha256": hashlib.sha256(text).hexdigest(),
                    "license": "Apache-2.0",
                }
            )
    return entries


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True, text=True).stdout


def vendor(clones: dict[str, Path]) -> list[dict[str, str]]:
    entries = []
    for repository, key, branch, patterns in WANTED:
        git_dir = clones[key]
        kind = "tags" if branch.startswith("v") else "heads"
        commit = _git(git_dir, "rev-parse", f"refs/{kind}/{branch}^{{commit}}").strip()
        listed = _git(git_dir, "ls-tree", "-r", commit).splitlines()
        for line in sorted(listed):
            meta, path = line.split("\t", 1)
            if not any(path == p or (p.endswith("*") and path.startswith(p[:-1])) for p in patterns):
                continue
            blob = meta.split()[2]
            data = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "blob", blob], check=True, capture_output=True).stdout
            name = path.rsplit("/", 1)[-1]
            file = f"{key}/{branch}/{name}"
            target = UPSTREAM / file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            entries.append(
                {
                    "file": file,
                    "repository": repository,
                    "branch": branch,
                    "path": path,
                    "commit": commit,
                    "blob": blob,
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "license": "Apache-2.0",
                }
            )
    entries += vendor_archives()
    (UPSTREAM / "SOURCES.json").write_text(json.dumps({"about": ABOUT, "files": entries}, indent=2) + "\n", encoding="utf-8")
    return entries


def add_archives() -> list[dict[str, str]]:
    """Vendor ARCHIVES again and put them in SOURCES.json beside the git files already there."""
    index = json.loads((UPSTREAM / "SOURCES.json").read_text(encoding="utf-8"))
    added = vendor_archives()
    names = {e["file"] for e in added}
    index["about"] = ABOUT
    index["files"] = [e for e in index["files"] if e["file"] not in names and "archive" not in e] + added
    (UPSTREAM / "SOURCES.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return added


def main(argv: list[str]) -> int:
    if argv == ["archives"]:
        print(f"vendored {len(add_archives())} files from release archives into {UPSTREAM}")
        return 0
    if len(argv) != 3 or argv[0] != "vendor":
        print(__doc__, file=sys.stderr)
        return 2
    entries = vendor({"verl": Path(argv[1]), "vllm-ascend": Path(argv[2])})
    print(f"vendored {len(entries)} files into {UPSTREAM}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
