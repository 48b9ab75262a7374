"""``ascendkit team build``: the team's layers built on its base by digest, then checked: every distribution of the
base (name, version, RECORD, direct_url) is as it was, unless the team file's ``replace`` names it. Only an image
that passes is tagged; one that fails is removed, with its containers.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound, NotFound
from packaging.utils import canonicalize_name

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import BuildFailed, ExitCode, InputError, Unavailable, VerifyFailed
from buildkit.image.engine import remove_containers
from buildkit.image.render import SECRETS_ARG
from buildkit.image.secrets import BuildSecrets, SecretServer
from buildkit.lock.inputs import python_platform
from buildkit.lock.lockfile import PACKAGE_LINE
from buildkit.lock.sdist import public_url
from buildkit.reach import engine_said
from buildkit.team.dockerfile import TeamBuildInputs, classic, files_digest, labels, render_team_dockerfile, write_team_context
from buildkit.team.fork import WHEELS_DIR, read_wheel
from buildkit.team.resolve import FORK_LAYER, BasePackage, BaseUnresolved, TeamBase, free_of, lock_file, lock_sections, lock_state
from buildkit.team.spec import LoadedTeam

# Every installed distribution: its version, a digest of its RECORD and of every file RECORD lists as it is on disk
# (a file another package or a COPY wrote over changes it), and its direct_url.json (PEP 610: where it came from).
# Standard library only: it runs in the image.
DISTRIBUTIONS = """
import hashlib, json, importlib.metadata as md, re
out = {}
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
    files = hashlib.sha256((dist.read_text("RECORD") or "").encode())
    for path in sorted(str(f) for f in dist.files or ()):
        try:
            digest = hashlib.sha256()
            with open(dist.locate_file(path), "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            files.update(f"{path}\\0{digest.hexdigest()}\\n".encode())
        except OSError:
            files.update(f"{path}\\0missing\\n".encode())
    out[name] = [dist.version, files.hexdigest(), dist.read_text("direct_url.json") or ""]
print(json.dumps(out, sort_keys=True))
"""


@dataclass(frozen=True)
class TeamBuilt:
    image_id: str
    refs: tuple[str, ...]
    base_ref: str
    added: tuple[str, ...]
    kept: int
    dockerfile: str


def distributions(client: docker.APIClient, image: str) -> dict[str, list[str]]:
    """What ``image`` has installed, read in a container of it (removed however it ends)."""
    container = client.create_container(image, ["python3", "-c", DISTRIBUTIONS], entrypoint=[], user="0:0", network_disabled=True)
    try:
        client.start(container)
        status = client.wait(container, timeout=300)["StatusCode"]
        logs = client.logs(container, stdout=True, stderr=True).decode(errors="replace")
        if status != 0:
            raise VerifyFailed(f"{image}: listing its distributions failed (exit {status}): {logs[-500:]}")
        found: dict[str, list[str]] = json.loads(logs.strip().splitlines()[-1])
        return found
    finally:
        remove_containers(client, [container["Id"]])


def moved(before: dict[str, list[str]], after: dict[str, list[str]], free: set[str]) -> list[str]:
    """Each base distribution the team image does not hold as the base did (gone, or another version, files or
    origin), except those the team file's ``replace`` names."""
    problems = []
    for name, (version, record, origin) in sorted(before.items()):
        if name in free:
            continue
        if name not in after:
            problems.append(f"{name} {version}: gone")
            continue
        now_version, now_record, now_origin = after[name]
        if now_version != version:
            problems.append(f"{name}: {version} in the base, {now_version} in the team image")
        elif now_record != record:
            problems.append(f"{name} {version}: its files differ from the base's (RECORD, or a file it lists rewritten)")
        elif now_origin != origin:
            problems.append(f"{name} {version}: installed from elsewhere (direct_url.json)")
    return problems


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


def _base_ref(client: docker.APIClient, base: TeamBase, team: LoadedTeam, ref: str) -> tuple[str, str, dict[str, Any]]:
    """The base by digest, its user and its inspect; refused when its labels name another stack or SKU."""
    try:
        inspect: dict[str, Any] = client.inspect_image(ref)
    except ImageNotFound:
        raise Unavailable(f"base image {ref} is not on this engine: pull it first (or build it: ascendkit build --hw {base.sku})") from None
    labels_ = inspect.get("Config", {}).get("Labels") or {}
    stack, skus = labels_.get("io.ascendkit.stack"), (labels_.get("io.ascendkit.skus") or "").split(",")
    if stack != base.stack_id or base.sku not in skus:
        what = f"stack {stack} for {', '.join(skus)}" if stack else "not an ascendkit image (no io.ascendkit.stack label)"
        raise InputError(f"{team.path}: base is stack {base.stack_id} for {base.sku}, but {ref} is {what}")
    digests = [d for d in inspect.get("RepoDigests") or [] if "@sha256:" in d]
    by_digest = sorted(digests)[0] if digests else inspect["Id"]
    return by_digest, inspect.get("Config", {}).get("User") or "", inspect


def _build(client: docker.APIClient, context: Path, tag: str, secrets: BuildSecrets) -> str:
    """The classic builder through docker-py. A CA bundle (a TLS-intercepting proxy's) and index credentials reach the
    RUN steps as the reference builds give them: served on a loopback URL in ftp_proxy, which no layer, config or
    history keeps."""
    containers: list[str] = []
    image_id, error, tail = "", "", list[str]()
    with ExitStack() as stack:
        buildargs, network_mode = {}, None
        if secrets:
            server = stack.enter_context(SecretServer(secrets))
            buildargs, network_mode = {SECRETS_ARG: server.url}, "host"
        try:
            stream = client.build(
                path=str(context), dockerfile="Dockerfile", tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                buildargs=buildargs, network_mode=network_mode,
            )  # fmt: skip
            image_id, error = _follow(stream, containers, tail)
        except (DockerException, requests.exceptions.RequestException) as exc:
            error = error or f"lost the engine: {engine_said(exc)}"
    if error or not image_id:
        remove_containers(client, containers)
        raise BuildFailed("the team image's build failed: " + (error or "the engine reported no image") + "\n" + "\n".join(tail[-15:]))
    return image_id


def _follow(stream: Any, containers: list[str], tail: list[str]) -> tuple[str, str]:
    """The build's events: its image ID or its error; the containers it ran and the last lines it printed, kept."""
    image_id, error = "", ""
    for event in stream:
        if "error" in event:
            error = str(event["error"]).strip()
        text = str(event.get("stream", ""))
        tail.extend(line for line in text.splitlines() if line.strip())
        del tail[:-30]
        if text.startswith(" ---> Running in "):
            containers.append(text.split()[-1])
        if "aux" in event and "ID" in event["aux"]:
            image_id = event["aux"]["ID"]
    return image_id, error


def team_inputs(team: LoadedTeam, base: TeamBase, base_of: tuple[str, str], index_args: tuple[tuple[str, str], ...]) -> TeamBuildInputs:
    """What the render needs: the lock's sections and, with a fork, its wheel checked against the lock's hash."""
    path = lock_file(team, base.arch)
    text = path.read_text(encoding="utf-8")
    sections = lock_sections(text)
    pin = source = ""
    if team.spec.framework is not None:
        wheels = sorted((team.root / WHEELS_DIR).glob("*.whl"))
        if len(wheels) != 1:
            raise InputError(f"{team.root / WHEELS_DIR}: the fork's wheel is not there (one .whl): run `ascendkit team lock` again")
        wheel = read_wheel(wheels[0])
        if f"--hash=sha256:{wheel.sha256}" not in sections.get(FORK_LAYER, ""):
            raise InputError(f"{wheels[0]}: not the wheel {path.name} locked (its sha256 differs): run `ascendkit team lock` again")
        pin, source = wheel.pin, f"{team.spec.framework.git}@{team.spec.framework.commit}"
    layers = tuple(layer for layer in sections if any(line[:1].isalnum() for line in sections[layer].splitlines()))
    extra = tuple(arg for arg, _ in index_args[1:])
    return TeamBuildInputs(*base_of, index_args, extra, hashlib.sha256(text.encode()).hexdigest(), layers, pin, source, files_digest(team))


def build_team(
    client: docker.APIClient, team: LoadedTeam, base: TeamBase, base_image: str, urls: dict[str, str], ca_bundle: bytes = b""
) -> TeamBuilt:
    """Build, check and tag the team image; refused before building when the lock is not fresh."""
    state = lock_state(team, base)
    if state != "fresh":
        error = InputError(f"{lock_file(team, base.arch)} is {state}: run `ascendkit team lock --arch {base.arch}` first")
        error.exit_code = ExitCode.CHECK_FAILED
        raise error
    try:
        base_ref, user, _ = _base_ref(client, base, team, base_image)
        args = [
            ("PIP_INDEX_URL", urls.get(name, url)) if i == 0 else (f"ASCENDKIT_TEAM_INDEX_{i}", urls.get(name, url))
            for i, (name, url) in enumerate(base.indexes)
        ]
        index_args = tuple((arg, public_url(url)) for arg, url in args)  # credentials never in an ARG (docker history)
        secret_env = tuple((arg, url) for arg, url in args if public_url(url) != url)
        inputs = team_inputs(team, base, (base_ref, user), index_args)
        dockerfile = render_team_dockerfile(team, base, inputs)
        version = dict(labels(team, base, inputs))["org.opencontainers.image.version"]
        ref = f"{team.spec.name}:{version}"
        before = distributions(client, base_ref)
        with tempfile.TemporaryDirectory(prefix="ascendkit-team-") as tmp:
            write_team_context(team, base, classic(dockerfile), Path(tmp))
            image_id = _build(client, Path(tmp), f"{team.spec.name}:unverified-{version}", BuildSecrets(ca_bundle, secret_env))
        try:
            after = distributions(client, image_id)
            problems = moved(before, after, free_of(team, base))
            if problems:
                raise VerifyFailed("the team image moved its base; nothing was tagged:\n  " + "\n  ".join(problems))
        except BaseException:
            client.remove_image(f"{team.spec.name}:unverified-{version}")  # the only tag: the image goes with it
            raise
        client.tag(image_id, team.spec.name, version)
        client.remove_image(f"{team.spec.name}:unverified-{version}", noprune=True)
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"the engine failed: {engine_said(exc)}") from None
    added = tuple(sorted(f"{name}=={after[name][0]}" for name in after if name not in before))
    return TeamBuilt(image_id, (ref,), base_ref, added, len(before), dockerfile)
