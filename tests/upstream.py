"""Upstream code to test against: verl's own wheel from PyPI, its Hydra config and its reward code.

Each stack's verl is fetched once (no dependencies, checked against the index's sha256) into
``$ASCENDKIT_CACHE`` (default ``~/.cache/ascendkit``) and unpacked beside it, so reruns read it
offline. verl's package initialisers import torch, which these hosts cannot install for x86_64
(PyPI's x86 torch is the CUDA build); :func:`verl_module` imports one verl module from the wheel
without running them, which is enough for the pure-Python parts tested here (config, rewards).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import tarfile
import threading
import types
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from buildkit.lock.index import IndexClient, download
from buildkit.settings import default_ca_bundle

PYPI = "https://pypi.org/simple"
# verl's packages whose __init__ imports torch (verl: DataProto; verl.utils: the tokenizer helpers).
BARE_PACKAGES = ("verl", "verl.utils")
CACHE_ROOT = Path(os.environ.get("ASCENDKIT_CACHE", Path.home() / ".cache" / "ascendkit"))  # kept between runs
CACHE = CACHE_ROOT / "upstream"


def verl_wheel(version: str) -> Path:
    """The unpacked verl ``version`` wheel (its directory holds the ``verl`` package)."""
    unpacked = CACHE / f"verl-{version}"
    if (unpacked / ".complete").exists():
        return unpacked
    client = IndexClient(ca_bundle=default_ca_bundle())
    wheels = [f for f in client.project(PYPI, "verl").files if str(f.version) == version and f.kind == "wheel" and not f.yanked]
    assert wheels, f"PyPI has no verl {version} wheel"
    wheel = wheels[0]
    assert wheel.sha256, f"PyPI gave no sha256 for {wheel.filename}"
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / wheel.filename
    if not path.exists():
        download(client.session, wheel.url, path, frozenset({wheel.sha256}))
    with zipfile.ZipFile(path) as archive:
        archive.extractall(unpacked)
    (unpacked / ".complete").write_text(wheel.sha256 + "\n")
    return unpacked


def sdist_member(project: str, version: str, member: str) -> str:
    """One file of ``project``'s ``version`` sdist from PyPI (its path below the sdist's top directory),
    the sdist fetched once, checked against the index's sha256, and kept in the cache."""
    client = IndexClient(ca_bundle=default_ca_bundle())
    sdists = [f for f in client.project(PYPI, project).files if str(f.version) == version and f.kind == "sdist" and not f.yanked]
    assert sdists, f"PyPI has no {project} {version} sdist"
    sdist = sdists[0]
    assert sdist.sha256, f"PyPI gave no sha256 for {sdist.filename}"
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / sdist.filename
    if not path.exists():
        download(client.session, sdist.url, path, frozenset({sdist.sha256}))
    with tarfile.open(path, "r:*") as archive:
        for entry in archive:
            if entry.isfile() and entry.name.split("/", 1)[-1] == member and (handle := archive.extractfile(entry)) is not None:
                return handle.read().decode("utf-8", errors="replace")
    raise AssertionError(f"{sdist.filename} has no {member}")


_HYDRA = threading.Lock()


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

    with _HYDRA:  # Hydra's global state admits one composition at a time
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir(version)), version_base=None):
            return compose(config_name=config_name, overrides=overrides)


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
