"""Upstream code to test against: verl's own wheels and vllm-ascend's sdists, as PyPI serves them.

The unit tests read a vendored copy (``tests/fixtures/upstream/pypi/<project>-<version>/``): the
files of each artifact the tests read (verl's Hydra configs, entry points and reward code; the
sdists' setup.py and the files the matrix patches), each with its sha256 in ``SOURCE.json`` beside
the artifact's own sha256 from the index. So the unit job needs no network. The ``network`` test
``test_the_vendored_upstream_is_pypis_own`` downloads every artifact again (checked against the
index's sha256) and holds the vendored files to it byte for byte; after a pin moves,

    python -m tests.harness.upstream vendor

fetches what the matrix now needs and rewrites the store (then commit it). verl's package
initialisers import torch, which these hosts cannot install for x86_64 (PyPI's x86 torch is the
CUDA build); :func:`verl_importable` imports verl modules without running them, which is enough for
the pure-Python parts tested here (config, rewards).
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import sys
import tarfile
import threading
import types
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from buildkit.lock.index import DistFile

PYPI = "https://pypi.org/simple"
# verl's packages whose __init__ imports torch (verl: DataProto; verl.utils: the tokenizer helpers).
BARE_PACKAGES = ("verl", "verl.utils")
STORE = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "pypi"
CACHE_ROOT = Path(os.environ.get("ASCENDKIT_CACHE", Path.home() / ".cache" / "ascendkit"))  # kept between runs
CACHE = CACHE_ROOT / "upstream"
# What the tests read of each kind of artifact (paths inside the wheel, or below the sdist's top directory).
WHEEL_MEMBERS = {
    "verl": (
        "verl/trainer/*.py",
        "verl/trainer/config/*",
        "verl/trainer/config/*/*",
        "verl/trainer/config/*/*/*",
        "verl/utils/reward_score/*.py",
        "verl/utils/reward_score/*/*.py",
        "verl/workers/reward_manager/naive.py",
        "verl/utils/dataset/rl_dataset.py",
        "verl/utils/import_utils.py",
        # rollout replay: where a run dumps its rollouts and where a replaying run looks for them
        "verl/utils/rollout_skip*.py",  # absent before 0.6 (no replay)
        "verl/utils/skip/*.py",
        "verl/utils/debug/metrics*.py",
    ),
}
SDIST_MEMBERS = {"vllm-ascend": ("setup.py",)}


def _canon(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def vendored(project: str, version: str) -> Path:
    """The vendored files of ``project`` ``version`` (a directory laid out as the artifact is)."""
    where = STORE / f"{_canon(project)}-{version}"
    assert (where / "SOURCE.json").is_file(), (
        f"{project} {version} is not vendored in {where.relative_to(STORE.parents[2])}: "
        "run `python -m tests.harness.upstream vendor` (it needs PyPI) and commit what it writes"
    )
    return where


def verl_wheel(version: str) -> Path:
    """The vendored files of the verl ``version`` wheel (the directory holds the ``verl`` package)."""
    return vendored("verl", version)


def sdist_member(project: str, version: str, member: str) -> str:
    """One file of ``project``'s ``version`` sdist (its path below the sdist's top directory)."""
    path = vendored(project, version) / member
    assert path.is_file(), f"{project} {version}: {member} is not vendored; add it to what `python -m tests.harness.upstream vendor` takes"
    return path.read_text(encoding="utf-8", errors="replace")


# ---- the store, and how it is made from PyPI ---------------------------------------------------------


def needed() -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    """(project, version) -> (artifact kind, member patterns) for everything the tests read: every verl
    of the shipped matrix (and the 0.6.1 whose reward OpenRLHF's is held to), every sdist whose
    extension or patched file the matrix names."""
    from buildkit.matrix.load import load_matrix
    from buildkit.resources import DEFAULT_MATRIX

    matrix = load_matrix(Path(__file__).resolve().parents[2] / DEFAULT_MATRIX).matrix
    wanted: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {("verl", "0.6.1"): ("wheel", WHEEL_MEMBERS["verl"])}

    def take(project: str, version: str, member: str) -> None:
        _, taken = wanted.get((project, version), ("sdist", ()))
        wanted[(project, version)] = ("sdist", tuple(dict.fromkeys([*taken, member])))

    for stack in matrix.stacks.values():
        if stack.framework == "verl":
            wanted[("verl", stack.framework_version)] = ("wheel", WHEEL_MEMBERS["verl"])
        pins = {_canon(pin.package or component): pin for component, pin in stack.pins().items()}
        for project, pin in pins.items():
            for member in SDIST_MEMBERS.get(project, ()) if pin.extensions else ():
                take(project, pin.version, member)
        for patch in stack.patches:
            take(_canon(patch.package), pins[_canon(patch.package)].version, patch.file)
    return dict(sorted(wanted.items()))


def fetch(project: str, version: str, kind: str) -> tuple[Path, DistFile]:
    """The artifact from PyPI (no dependencies), checked against the index's sha256 and kept in the
    cache: its path and the index's entry for it (URL, sha256)."""
    from buildkit.lock.index import IndexClient, download
    from buildkit.settings import default_ca_bundle

    client = IndexClient(ca_bundle=default_ca_bundle())
    files = [f for f in client.project(PYPI, project).files if str(f.version) == version and f.kind == kind and not f.yanked]
    assert files, f"PyPI has no {project} {version} {kind}"
    artifact = files[0]
    assert artifact.sha256, f"PyPI gave no sha256 for {artifact.filename}"
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / artifact.filename
    if not path.exists():
        download(client.session, artifact.url, path, frozenset({artifact.sha256}))
    return path, artifact


def _matches(name: str, pattern: str) -> bool:
    """A path against a pattern, segment by segment (``*`` stays inside one directory)."""
    parts, wanted = name.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, wanted, strict=True))


def members(artifact: Path, patterns: tuple[str, ...]) -> dict[str, bytes]:
    """The files of a wheel or sdist whose path matches a pattern (for an sdist, below its top directory)."""
    found: dict[str, bytes] = {}
    if artifact.suffix == ".whl":
        with zipfile.ZipFile(artifact) as archive:
            for name in archive.namelist():
                if not name.endswith("/") and any(_matches(name, p) for p in patterns):
                    found[name] = archive.read(name)
    else:
        with tarfile.open(artifact, "r:*") as archive:
            for entry in archive:
                inside = entry.name.split("/", 1)[-1]
                if entry.isfile() and inside in patterns and (handle := archive.extractfile(entry)) is not None:
                    found[inside] = handle.read()
    missing = [p for p in patterns if not any(c in p for c in "*?[") and p not in found]  # a file named exactly must be there
    assert not missing, f"{artifact.name} has no {missing}"
    return dict(sorted(found.items()))


def source_of(project: str, version: str, kind: str, patterns: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """What the store holds for one artifact, fresh from PyPI: its SOURCE.json and its files."""
    path, artifact = fetch(project, version, kind)
    files = members(path, patterns)
    source = {
        "project": project,
        "version": version,
        "artifact": path.name,
        "sha256": artifact.sha256,
        "index": PYPI,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    return source, files


def vendor() -> list[str]:
    """Rewrite the store with what :func:`needed` names, fresh from PyPI; returns what it wrote."""
    wanted = needed()
    written = []
    for (project, version), (kind, patterns) in wanted.items():
        source, files = source_of(project, version, kind, patterns)
        where = STORE / f"{project}-{version}"
        shutil.rmtree(where, ignore_errors=True)
        for name, data in files.items():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            (where / name).write_bytes(data)
        (where / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        written.append(f"{project}-{version}: {len(files)} files of {source['artifact']}")
    for stale in sorted(p for p in STORE.iterdir() if p.is_dir() and tuple(p.name.rsplit("-", 1)) not in wanted):
        shutil.rmtree(stale)
        written.append(f"{stale.name}: removed (nothing needs it)")
    return written


_HYDRA = threading.Lock()
# What Hydra composed, by (verl, config, overrides): the unit suite asked 198 times for 72 compositions, each
# reading and merging dozens of verl's YAML files again (0.3-0.4 s). Every caller gets a copy of its own.
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def config_dir(version: str) -> Path:
    return verl_wheel(version) / "verl" / "trainer" / "config"


def compose_ppo_trainer(version: str, overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config composed by Hydra with ``overrides``, as ``main_ppo`` composes it:
    the config is in struct mode, so a key verl does not define is an error."""
    return compose_config(version, "ppo_trainer", overrides)


def compose_config(version: str, config_name: str, overrides: list[str]) -> Any:
    """One of verl's trainer configs (``ppo_trainer``, ``sft_trainer``, ``sft_trainer_engine``),
    composed by Hydra with ``overrides`` as its entry point's ``@hydra.main`` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    key = (version, config_name, tuple(overrides))
    with _HYDRA:  # Hydra's global state admits one composition at a time
        if key not in _COMPOSED:  # a composition that fails is not kept: it fails again, as the first time
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=str(config_dir(version)), version_base=None):
                _COMPOSED[key] = compose(config_name=config_name, overrides=overrides)
        return copy.deepcopy(_COMPOSED[key])


def hydra_config_name(version: str, module: str) -> str:
    """The config an entry point's ``@hydra.main`` names, read from that verl's own source."""
    import re

    source = (verl_wheel(version) / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8")
    found = re.findall(r"@hydra\.main\([^)]*config_name=[\"']([\w]+)[\"']", source)
    assert len(found) == 1, f"verl {version} {module}: expected one @hydra.main, found {found}"
    return str(found[0])


@contextmanager
def verl_importable(version: str) -> Iterator[None]:
    """``verl.*`` modules of that wheel importable, without running the package ``__init__``s that
    import torch (:data:`BARE_PACKAGES`); undone on exit, so another version can be imported next."""
    root = verl_wheel(version)
    saved = {name: mod for name, mod in sys.modules.items() if name == "verl" or name.startswith("verl.")}
    for name in saved:
        del sys.modules[name]
    finder = _NoInitFinder(root)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class _NoInitFinder(importlib.abc.MetaPathFinder):
    """Finds ``verl`` modules in the unpacked wheel; :data:`BARE_PACKAGES` become bare namespaces."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "verl" and not fullname.startswith("verl."):
            return None
        where = self.root.joinpath(*fullname.split("."))
        if where.is_dir() and fullname in BARE_PACKAGES:
            spec = importlib.machinery.ModuleSpec(fullname, _Bare(), is_package=True)
            spec.submodule_search_locations = [str(where)]
            return spec
        if (where / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(fullname, where / "__init__.py", submodule_search_locations=[str(where)])
        file = where.with_suffix(".py")
        if file.is_file():
            return importlib.util.spec_from_file_location(fullname, file)
        return None


class _Bare(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if __name__ == "__main__":
    if sys.argv[1:] != ["vendor"]:
        sys.exit("usage: python -m tests.harness.upstream vendor")
    for line in vendor():
        print(line)
