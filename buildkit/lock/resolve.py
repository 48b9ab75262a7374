"""One uv resolution per (stack, arch), for the target's platform, split by the image's layers."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement

from buildkit.errors import InputError
from buildkit.lock.gitsource import CheckoutRequirements
from buildkit.lock.index import IndexClient, IndexUnreachable, ProjectMissing, installable, target_tags
from buildkit.lock.inputs import UV_TIMEOUT_S, LockFailed, LockInputs, canon
from buildkit.lock.lockfile import PACKAGE_LINE, LockedPackage, Resolution
from buildkit.lock.sdist import SourceMetadata, public_url
from buildkit.plan import BUILD_LAYER
from buildkit.settings import split_credentials


def pip_requirements(text: str) -> str:
    """A lock's package lines only (what uv reads back as preferences)."""
    return "".join(line + "\n" for line in text.splitlines() if line and not line.startswith("#"))


def parse_uv_output(text: str) -> list[LockedPackage]:
    """Packages of ``uv pip compile --generate-hashes --emit-index-annotation`` output."""
    packages: list[LockedPackage] = []
    in_via = False
    for line in text.splitlines():
        stripped = line.strip().rstrip("\\").strip()
        if not stripped:
            continue
        if not line[0].isspace():
            match = PACKAGE_LINE.match(stripped)
            if match:
                packages.append(LockedPackage(match.group(1), match.group(2)))
            in_via = False
            continue
        if not packages:
            continue
        current = packages[-1]
        if stripped.startswith("--hash="):
            current.hashes.append(stripped.removeprefix("--hash="))
            in_via = False
        elif stripped == "# via":
            in_via = True
        elif stripped.startswith("# via "):
            current.via.append(stripped.removeprefix("# via ").strip())
            in_via = False
        elif stripped.startswith("# from "):
            current.source = stripped.removeprefix("# from ").strip()
            in_via = False
        elif in_via and stripped.startswith("#   "):
            current.via.append(stripped.removeprefix("#").strip())
    return packages


def assign_layers(packages: list[LockedPackage], layer_files: dict[str, str]) -> dict[str, list[LockedPackage]]:
    """Split a resolution by layer: each package goes to the first layer whose roots need it.

    ``layer_files`` maps each layer to the input file its roots came from (what ``# via -r FILE``
    names); dependency edges come from the other ``# via`` entries.
    """
    by_key = {p.key: p for p in packages}
    children: dict[str, set[str]] = {key: set() for key in by_key}
    roots: dict[str, set[str]] = {layer: set() for layer in layer_files}
    file_layer = {name: layer for layer, name in layer_files.items()}
    for package in packages:
        for parent in package.via:
            if parent.startswith("-r "):
                layer = file_layer.get(PurePosixPath(parent[3:].strip()).name)
                if layer is not None:
                    roots[layer].add(package.key)
            elif not parent.startswith("-"):
                parent_key = canon(re.sub(r"\[.*$", "", parent.split()[0]))
                if parent_key in children:
                    children[parent_key].add(package.key)
    placed: dict[str, str] = {}
    for layer in layer_files:
        queue = sorted(roots[layer])
        while queue:
            key = queue.pop()
            if key in placed:
                continue
            placed[key] = layer
            queue += sorted(children[key] - placed.keys())
    orphans = sorted(set(by_key) - placed.keys())
    if orphans:
        raise LockFailed(f"the resolution has packages no layer asks for: {', '.join(orphans)}")
    return {layer: sorted((p for p in packages if placed[p.key] == layer), key=lambda p: p.key) for layer in layer_files}


def _toml_array(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def uv_binary() -> str:
    """The uv executable installed with ascendkit (the PyPI wheel ships it)."""
    candidate = Path(sys.executable).with_name("uv")
    if candidate.is_file():
        return str(candidate)
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise InputError("uv is not installed; `pip install uv` (it is a dependency of ascendkit)") from None
    return str(find_uv_bin())


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    """``uv X.Y.Z``, without the build triple (the lock must not depend on the host)."""
    done = subprocess.run([uv_binary(), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.split("(")[0].strip() or "uv (unknown version)"


def resolve(
    inputs: LockInputs,
    sources: list[SourceMetadata],
    index_urls: dict[str, str],
    *,
    ca_bundle: Path | None = None,
    previous: str | None = None,
    client: IndexClient | None = None,
    checkouts: tuple[CheckoutRequirements, ...] = (),
    exclude_newer: str | None = None,
) -> Resolution:
    """Run uv for one target and split the result by layer. ``index_urls`` maps each index name to
    the URL to use (a mirror, maybe with credentials); ``previous`` is the current lock's text,
    whose versions uv keeps where they still fit (``ascendkit lock --upgrade`` passes None);
    ``checkouts`` are the requirements of the layers built from a git checkout (their roots);
    ``exclude_newer`` (a date or an RFC 3339 time) resolves as the indexes stood then (uv's
    ``--exclude-newer``: files uploaded later are not candidates), so a re-lock reproduces."""
    pinned = inputs.pinned
    layer_requirements = {layer: list(pins) for layer, pins in inputs.layers}
    for checkout in checkouts:
        layer_requirements.setdefault(checkout.spec.layer, []).extend(checkout.requires)
    build: list[str] = []
    for meta in sources:
        for requirement in meta.build_requires:
            name = canon(Requirement(requirement).name)
            if name not in pinned and requirement not in build:
                build.append(requirement)  # a pinned package builds against its pin (no isolation)
    with tempfile.TemporaryDirectory(prefix="ascendkit-lock-") as tmp:
        work = Path(tmp)
        layer_files = {}
        for number, layer in enumerate(inputs.order, start=1):
            requirements = build if layer == BUILD_LAYER else layer_requirements.get(layer, [])
            if not requirements:
                continue  # the build layer, when every build requirement is a pin of the stack
            filename = f"{number:02d}-{layer}.in"
            (work / filename).write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
            layer_files[layer] = filename
        (work / "constraints.txt").write_text("".join(f"{c}\n" for c in inputs.constraints), encoding="utf-8")
        (work / "overrides.txt").write_text("".join(f"{o}\n" for o in inputs.overrides), encoding="utf-8")
        config = "".join(
            f'[[dependency-metadata]]\nname = "{m.dist}"\nversion = "{m.version}"\nrequires-dist = {_toml_array(m.requires)}\n\n'
            for m in sources
        )
        (work / "uv.toml").write_text(config, encoding="utf-8")
        out = work / "lock.txt"
        if previous:
            out.write_text(pip_requirements(previous), encoding="utf-8")
        primary, *extras = [name for name, _ in inputs.indexes]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env["UV_INDEX_URL"] = index_urls[primary]
        env["UV_EXTRA_INDEX_URL"] = " ".join(index_urls[name] for name in extras)
        if ca_bundle is not None:
            env["SSL_CERT_FILE"] = str(ca_bundle)
        command = [
            uv_binary(),
            "pip",
            "compile",
            "--quiet",
            "--config-file",
            "uv.toml",
            *layer_files.values(),
            "--constraint",
            "constraints.txt",
            "--override",
            "overrides.txt",
            "--python-platform",
            inputs.platform,
            "--python-version",
            inputs.python,
            "--generate-hashes",
            "--emit-index-annotation",
            "--annotation-style",
            "split",
            "--no-header",
            "--output-file",
            out.name,
        ]
        for dist, _ in inputs.source_builds:
            command += ["--no-binary", dist]
        if exclude_newer:
            command += ["--exclude-newer", exclude_newer]
        try:
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=UV_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise LockFailed(f"{inputs.target.name}: uv did not finish in {UV_TIMEOUT_S} s") from None
        if done.returncode != 0:
            message = _redact(done.stderr.strip() or done.stdout.strip(), index_urls.values())
            raise LockFailed(
                f"{inputs.target.name}: the pins do not resolve together for {inputs.platform}, Python {inputs.python}:\n{message}"
            )
        packages = parse_uv_output(out.read_text(encoding="utf-8"))
    used = [(name, public_url(index_urls[name]).rstrip("/")) for name, _ in inputs.indexes]
    assigned = {canon(dist): name for dist, name in inputs.assigned}
    for package in packages:
        url = public_url(package.source).rstrip("/")
        candidates = [name for name, u in used if u == url]
        if assigned.get(package.key) in candidates:
            package.source = assigned[package.key]
        elif candidates:
            package.source = candidates[0]
        else:
            package.source = url  # not an index of this target: _check reports it for a pin
    labels = {f"-r {name}": f"pins of layer {layer}" for layer, name in layer_files.items()}
    for checkout in checkouts:  # its roots are its requirements file, not pins of the matrix
        labels[f"-r {layer_files[checkout.spec.layer]}"] = f"{checkout.spec.file} of {checkout.spec.layer}"
    _check(inputs, packages, labels)
    sdists = {canon(m.dist): f"sha256:{m.sha256}" for m in sources}
    for package in packages:
        if package.key in sdists:
            if sdists[package.key] not in package.hashes:
                raise LockFailed(f"{inputs.target.name}: uv's hashes for {package.name}=={package.version} lack its sdist's")
            package.hashes = [sdists[package.key]]  # built from source: only the sdist may be installed
    if client is not None:
        _keep_target_files(client, packages, index_urls, inputs)
    layers = assign_layers(packages, layer_files)
    for package in packages:
        package.via = [labels.get(v, v) for v in package.via]
    return Resolution(layers, tuple(sources), uv_version(), checkouts)


def _keep_target_files(client: IndexClient, packages: list[LockedPackage], index_urls: dict[str, str], inputs: LockInputs) -> None:
    """Keep only the hashes of files the target can install: its wheels, or the sdist when no wheel
    fits (uv lists every file of the version, for every platform)."""
    tags = target_tags(inputs.target.arch, inputs.python)

    def keep(package: LockedPackage) -> None:
        if len(package.hashes) <= 1 or package.source not in index_urls:
            return
        try:
            project = client.project(index_urls[package.source], package.name)
        except (IndexUnreachable, ProjectMissing):
            return  # keep uv's list: every hash in it is a real file of this version
        files = [f for f in project.files if str(f.version) == package.version and f.sha256 and installable(f, tags, inputs.python)]
        wheels = {f"sha256:{f.sha256}" for f in files if f.kind == "wheel"}
        chosen = wheels or {f"sha256:{f.sha256}" for f in files}
        narrowed = [h for h in package.hashes if h in chosen]
        if narrowed:
            package.hashes = narrowed

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(keep, packages))


def _redact(text: str, urls: object) -> str:
    for url in urls:  # type: ignore[attr-defined]
        public, full = split_credentials(str(url))
        if full:
            text = text.replace(full, public)
    return text


def _check(inputs: LockInputs, packages: list[LockedPackage], labels: dict[str, str] | None = None) -> None:
    """Rules the resolution must keep: pins unchanged, pins from their assigned index, no CUDA triton,
    nothing the framework's NPU install leaves out. ``labels`` name uv's ``-r FILE`` parents."""
    found = {p.key: p for p in packages}

    def via(name: str) -> str:
        return ", ".join((labels or {}).get(v, v) for v in found[name].via)

    problems = []
    for dist, version in inputs.pinned.items():
        package = found.get(dist)
        if package is None or package.version != version:
            problems.append(f"{dist}=={version} resolved as {package.version if package else 'nothing'}")
    for dist, index in inputs.assigned:
        package = found.get(canon(dist))
        if package is not None and package.source != index:
            problems.append(f"{dist} came from {package.source or 'an unknown index'}, but the matrix assigns it to {index}")
    for name in inputs.leaves_out:
        if name in found:
            problems.append(
                f"{name}=={found[name].version} (pulled in by {via(name)}) is one of the packages the "
                "framework's NPU install leaves out (CUDA-only): pin or constrain what pulls it in"
            )
    if inputs.triton_ascend and "triton" in found:
        problems.append(
            f"triton=={found['triton'].version} (the CUDA build, pulled in by {via('triton')}) "
            "would overwrite triton-ascend's files: pin or constrain what pulls it in"
        )
    if problems:
        raise LockFailed(f"{inputs.target.name}: " + "; ".join(problems))
