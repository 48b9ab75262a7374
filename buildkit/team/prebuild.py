"""Before a team image is built: the files each of the team's locked wheels would write, held to the files the base's
distributions own. Two distributions owning one file (``opencv-python`` beside the base's ``opencv-python-headless``,
a package that vendors a module the base ships) is refused here, naming the package and who asked for it, instead of
after a build whose image then goes.

Each wheel is the one the lock allows (its sha256 among the lock's hashes) and the target would install, found on the
base's indexes (mirrors applied); its member names are read from the zip's central directory by HTTP ranges, never
the whole wheel where the server answers ranges. A package the lock holds only as an sdist is built in the image, so
its files are known only after the build: said, and left to the check after it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from packaging.tags import Tag

from buildkit.errors import Unavailable
from buildkit.lock.index import DistFile, IndexClient, IndexUnreachable, ProjectMissing, installable, target_tags
from buildkit.lock.lockfile import LockedPackage, read_lock
from buildkit.lock.metadata import MetadataUnavailable, wheel_names
from buildkit.lock.sdist import public_url
from buildkit.team.inimage import names_overlap
from buildkit.team.resolve import TEAM_LAYER, TeamBase, free_of, lock_file
from buildkit.team.spec import LoadedTeam

READERS = 8  # wheels read at once: each a few small requests, most of their time waiting on the index


@dataclass(frozen=True)
class PrebuildFiles:
    """What the check found: files a base distribution owns (each a sentence), and packages it could not read."""

    overlaps: tuple[str, ...]
    unread: tuple[str, ...]  # "name==version: why"
    read: int  # wheels whose files were read


def _wheel(client: IndexClient, indexes: list[str], package: LockedPackage, tags: frozenset[Tag], python: str) -> DistFile | str:
    """The wheel of ``package`` the lock allows for the target (``tags``, ``python``), or why there is none to read."""
    allowed = {h.removeprefix("sha256:") for h in package.hashes}
    sdist = False
    for index in indexes:
        try:
            project = client.project(index, package.key)
        except ProjectMissing:
            continue
        except IndexUnreachable as exc:
            raise Unavailable(f"index {public_url(index)} cannot be reached to read {package.key}'s wheel: {exc.why}") from None
        for file in project.files:
            if file.sha256 not in allowed:
                continue
            if file.kind == "wheel" and installable(file, tags, python):
                return file
            sdist = sdist or file.kind == "sdist"
    if sdist:
        return "the lock holds its sdist, built in the image: its files are checked after the build"
    return "no file the lock allows was found on the base's indexes"


def check_team_wheels(
    team: LoadedTeam, base: TeamBase, index_urls: dict[str, str], before: dict[str, list[Any]], client: IndexClient | None = None
) -> PrebuildFiles:
    """Hold every wheel of the team lock's package layer to the files the base (``before``: the base image's
    distributions) owns. An index that cannot be reached is exit 4 (raised), as for the lock."""
    client = client or IndexClient()
    lock = read_lock(lock_file(team, base.arch))
    indexes = [index_urls.get(name, url) for name, url in base.indexes]
    free = free_of(team, base)
    tags = target_tags(base.arch, base.python)
    overlaps: list[str] = []
    unread: list[str] = []
    read = 0

    def names_of(package: LockedPackage) -> tuple[DistFile, list[str]] | str:
        try:
            wheel = _wheel(client, indexes, package, tags, base.python)
            return wheel if isinstance(wheel, str) else (wheel, wheel_names(client, wheel))
        except MetadataUnavailable as exc:
            return f"its wheel could not be read ({exc})"

    packages = lock.layers.get(TEAM_LAYER, [])
    # the wheels' central directories read side by side (a few small range requests each); said in the lock's order
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        found = list(pool.map(names_of, packages))
    for package, names in zip(packages, found, strict=True):
        if isinstance(names, str):
            unread.append(f"{package.key}=={package.version}: {names}")
            continue
        read += 1
        via = ", ".join(package.via) or "the team file"
        what = f"{package.key} {package.version} (asked for by {via}; wheel {names[0].filename})"
        overlaps += names_overlap(names[1], what, package.key, before, free)
    return PrebuildFiles(tuple(overlaps), tuple(unread), read)
