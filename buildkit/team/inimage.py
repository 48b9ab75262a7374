"""What the team's commands read in images: every distribution a base or a team image holds (to compare them), the
modules a distribution gives (to import them), and the base a published image is (its locks and image.json)."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import docker
from docker.errors import ImageNotFound, NotFound
from packaging.utils import canonicalize_name

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import InputError, Unavailable, VerifyFailed
from buildkit.image.engine import remove_containers
from buildkit.lock.inputs import python_platform
from buildkit.lock.lockfile import PACKAGE_LINE
from buildkit.team.resolve import BasePackage, BaseUnresolved, TeamBase
from buildkit.team.spec import LoadedTeam

# Every installed distribution: its version, a digest of its RECORD and of every file RECORD lists as it is on disk
# (a file another package or a COPY wrote over changes it), its direct_url.json (PEP 610: where it came from), the
# absolute paths it owns and the directory it is installed in.
# Standard library only: it runs in the image.
DISTRIBUTIONS = """
import hashlib, json, importlib.metadata as md, os, re
out = {}
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
    files = hashlib.sha256((dist.read_text("RECORD") or "").encode())
    owned = []
    for path in sorted(str(f) for f in dist.files or ()):
        where = os.path.normpath(str(dist.locate_file(path)))
        owned.append(where)
        try:
            digest = hashlib.sha256()
            with open(where, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            files.update(f"{path}\\0{digest.hexdigest()}\\n".encode())
        except OSError:
            files.update(f"{path}\\0missing\\n".encode())
    home = os.path.normpath(str(dist.locate_file("")))
    out[name] = [dist.version, files.hexdigest(), dist.read_text("direct_url.json") or "", owned, home]
print(json.dumps(out, sort_keys=True))
"""


# Each named distribution's top-level modules (top_level.txt, else the packages and modules its RECORD lists), imported
# one by one as the image's user; what failed, with its error. Standard library only.
IMPORTS = """
import importlib, importlib.metadata as md, json, sys
failed, imported = {}, []
for name in sys.argv[1:]:
    dist = md.distribution(name)
    top = (dist.read_text("top_level.txt") or "").split()
    if not top:
        for path in dist.files or ():
            parts = path.parts
            if len(parts) == 1 and parts[0].endswith(".py"):
                top.append(parts[0][:-3])
            elif len(parts) > 1 and parts[1] == "__init__.py" and not parts[0].endswith((".dist-info", ".data")):
                top.append(parts[0])
    for module in sorted(set(m for m in top if m.isidentifier() and not m.startswith("_"))):
        try:
            importlib.import_module(module)
            imported.append(module)
        except BaseException as exc:
            failed[module] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps({"imported": imported, "failed": failed}, sort_keys=True))
"""


def _run_python(client: docker.APIClient, image: str, program: str, args: list[str], user: str, what: str) -> Any:
    """A Python program in a container of ``image`` (no network, removed however it ends): its last line, as JSON."""
    container = client.create_container(image, ["python3", "-c", program, *args], entrypoint=[], user=user, network_disabled=True)
    try:
        client.start(container)
        status = client.wait(container, timeout=300)["StatusCode"]
        logs = client.logs(container, stdout=True, stderr=True).decode(errors="replace")
        if status != 0:
            raise VerifyFailed(f"{image}: {what} failed (exit {status}): {logs[-500:]}")
        return json.loads(logs.strip().splitlines()[-1])
    finally:
        remove_containers(client, [container["Id"]])


def distributions(client: docker.APIClient, image: str) -> dict[str, list[Any]]:
    """What ``image`` has installed, read in a container of it (removed however it ends)."""
    found: dict[str, list[Any]] = _run_python(client, image, DISTRIBUTIONS, [], "0:0", "listing its distributions")
    return found


def imports(client: docker.APIClient, image: str, names: list[str], user: str) -> dict[str, Any]:
    """The top-level modules of ``names`` imported in ``image`` as ``user``: which did and which failed, with why."""
    if not names:
        return {"imported": [], "failed": {}}
    found: dict[str, Any] = _run_python(client, image, IMPORTS, names, user, "importing the team's packages")
    return found


def moved(before: dict[str, list[Any]], after: dict[str, list[Any]], free: set[str]) -> list[str]:
    """Each base distribution the team image does not hold as the base did (gone, or another version, files or
    origin), except those the team file's ``replace`` names."""
    problems = []
    for name, (version, record, origin, *_) in sorted(before.items()):
        if name in free:
            continue
        if name not in after:
            problems.append(f"{name} {version}: gone")
            continue
        now_version, now_record, now_origin, *_ = after[name]
        if now_version != version:
            problems.append(f"{name}: {version} in the base, {now_version} in the team image")
        elif now_record != record:
            problems.append(f"{name} {version}: its files differ from the base's (RECORD, or a file it lists rewritten)")
        elif now_origin != origin:
            problems.append(f"{name} {version}: installed from elsewhere (direct_url.json)")
    return problems


def shared(before: dict[str, list[Any]], after: dict[str, list[Any]], free: set[str]) -> list[str]:
    """Files two distributions own: one the team brought (or changed) and one of the base's (``free`` ones aside)."""
    owners = {path: name for name, entry in before.items() if name not in free for path in (entry[3] if len(entry) > 3 else ())}
    problems = []
    for name, entry in sorted(after.items()):
        if before.get(name, [None])[:3] == entry[:3]:
            continue  # the base's own, unchanged
        for path in entry[3] if len(entry) > 3 else ():
            if path in owners and owners[path] != name and not path.endswith((".pyc", "RECORD", "INSTALLER", "REQUESTED")):
                problems.append(f"{path}: {name} {entry[0]} writes it, and the base's {owners[path]} owns it")
    return problems


def names_overlap(names: list[str], what: str, dist: str, before: dict[str, list[Any]], free: set[str]) -> list[str]:
    """Before anything is built: the files a wheel (its member ``names``) would write into site-packages that a base
    distribution other than the one it replaces (``dist``, or one of ``free``) owns, each said with ``what`` writes it.
    A wheel's ``.data/purelib`` and ``.data/platlib`` land in site-packages too; its other ``.data`` (scripts,
    headers) is left to the check after the build."""
    homes = Counter(str(entry[4]) for entry in before.values() if len(entry) > 4 and entry[4])
    # where it lands: beside the distribution it replaces, else where most of the base's distributions are (pip's)
    site = before[dist][4] if dist in before and len(before[dist]) > 4 else min(homes, key=lambda h: (-homes[h], h), default="")
    if not site:
        return []
    owners = {path: name for name, entry in before.items() if name not in free and name != dist for path in entry[3]}
    found = []
    for member in names:
        top, _, rest = member.partition("/")
        if member.endswith("/"):
            continue
        if top.endswith(".data"):
            kind, _, rest = rest.partition("/")
            if kind not in ("purelib", "platlib"):
                continue
            member = rest
        path = posixpath.join(site, member)
        if path in owners:
            found.append(f"{path}: {what} writes it, and the base's {owners[path]} owns it")
    return found


def wheel_overlap(wheel: Path, dist: str, before: dict[str, list[Any]], free: set[str]) -> list[str]:
    """Before anything is built: the files the fork's wheel would write that a base distribution other than the one it
    replaces owns (a framework fork that ships triton/ would overwrite triton-ascend's)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return names_overlap(names, f"the fork's wheel {wheel.name}", dist, before, free)


def _image_files(client: docker.APIClient, ref: str, path: str) -> dict[str, bytes]:
    """The regular files under ``path`` in ``ref``, read from a created (never started) container, removed after."""
    container = client.create_container(ref, ["true"], entrypoint=[])
    try:
        stream, _ = client.get_archive(container, path)
        data = b"".join(stream)
    except NotFound:
        return {}
    finally:
        remove_containers(client, [container["Id"]])
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name.split("/")[-1]: (archive.extractfile(m) or io.BytesIO()).read() for m in archive.getmembers() if m.isfile()}


def _section(name: str, text: str) -> tuple[bool, dict[str, tuple[str, str]]]:
    """One lock section as the image carries it: resolved or not, and each package's version and index name."""
    packages: dict[str, tuple[str, str]] = {}
    current = ""
    for line in text.splitlines():
        if line and line[0].isalnum():
            match = PACKAGE_LINE.match(line)
            if match is None:
                raise InputError(f"{name}: not a locked requirement: {line!r}")
            current = canonicalize_name(match.group(1))
            packages[current] = (match.group(2), "")
        elif current and line.strip().startswith("# index: "):
            packages[current] = (packages[current][0], line.strip().removeprefix("# index: "))
    return "# status: resolved" in text.splitlines(), packages


def image_base(client: docker.APIClient, team: LoadedTeam, arch: str, index_urls: dict[str, str]) -> TeamBase:
    """The base of a team file naming a published image: its lock sections, image.json and labels, read from the image
    itself; ``index_urls`` names the indexes its sections name (the matrix ascendkit was released with). Refused when
    it is not an ascendkit image, is for another arch, or its locks are unresolved."""
    ref = team.spec.base.image
    assert ref is not None
    try:
        inspect = client.inspect_image(ref)
    except ImageNotFound:
        raise Unavailable(f"base image {ref} is not on this engine: pull it first (docker pull {ref})") from None
    if DOCKER_ARCH.get(arch) != inspect.get("Architecture"):
        raise InputError(f"{team.path}: base image {ref} is for {inspect.get('Architecture')}, not {arch}")
    about = _image_files(client, ref, "/etc/ascendkit/image.json").get("image.json")
    sections = {n: t.decode() for n, t in _image_files(client, ref, "/etc/ascendkit/locks").items() if n.endswith(f"-{arch}.txt")}
    if about is None or not sections:
        raise InputError(f"{team.path}: base image {ref} is not an ascendkit image (no /etc/ascendkit/image.json or locks)")
    facts = json.loads(about)
    framework = str(facts.get("framework", ""))
    packages: dict[str, BasePackage] = {}
    used: set[str] = set()
    digest = hashlib.sha256()
    own = ""
    version = (inspect.get("Config", {}).get("Labels") or {}).get(f"io.ascendkit.version.{framework}", "")
    for name in sorted(sections):
        digest.update(f"{name}\n{sections[name]}\n".encode())
        resolved, found = _section(name, sections[name])
        if not resolved:
            raise BaseUnresolved(f"{ref}: its lock section {name} is unresolved: its packages are not known by hash")
        for key, (pinned, index) in found.items():
            packages.setdefault(key, BasePackage(key, pinned, ()))
            used.add(index)
            if name == f"{framework}-{arch}.txt" and (pinned == version or len(found) == 1):
                own = own or key
    unknown = sorted(used - set(index_urls) - {""})
    if unknown:
        raise InputError(f"{ref}: its locks name index(es) {', '.join(unknown)} this ascendkit's matrix does not know")
    ordered = tuple((n, u) for n, u in index_urls.items() if n in used or n == next(iter(index_urls)))
    skus = [str(s) for s in facts.get("skus", [])]
    return TeamBase(
        str(facts.get("stack", "")), team.spec.base.sku or (skus[0] if skus else ""), ref, arch, str(facts.get("python", "")),
        python_platform(arch), framework, own or framework, packages, ordered, digest.hexdigest(),
    )  # fmt: skip
