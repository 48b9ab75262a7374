"""How a node's containerd pulls images: the settings that decide pull time and disk before any
pre-pull engine runs, read from its config file (``/etc/containerd/config.toml`` and what it imports).

What is read, by config version (containerd's own structs: v1.7 ``pkg/cri/config/config.go``, v2.1
``internal/cri/config/config.go`` and ``plugins/transfer/plugin.go``; tests/test_pulls.py checks the keys
against them and reads configs ``containerd config default`` writes):

- version 2 (containerd 1.x): ``plugins."io.containerd.grpc.v1.cri"`` ``max_concurrent_downloads``, and
  under its ``containerd`` table ``snapshotter`` and ``discard_unpacked_layers``;
- version 3 (containerd 2.x): ``plugins."io.containerd.cri.v1.images"`` the same three. From 2.1 the CRI
  pulls through the transfer service, whose own ``plugins."io.containerd.transfer.v1.local"``
  ``max_concurrent_downloads`` then counts, unless the CRI config holds something the transfer service
  does not take (``discard_unpacked_layers = true``, registry ``mirrors``/``configs``/``auths``, a CRI
  ``max_concurrent_downloads`` other than 3, snapshot annotations on): then it falls back to the old
  pull, with only a line in containerd's log to say so.

Defaults where a key is absent: 3 downloads at once, overlayfs, unpacked layers kept.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import Check, Environment, version_numbers


def _toml() -> ModuleType | None:
    """tomllib (3.11+), else tomli where installed: doctor runs with the image's own Python."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:  # pragma: no cover - Python 3.10
        import tomli

        return tomli
    except ImportError:  # pragma: no cover
        return None


tomllib = _toml()

CONFIG = "/etc/containerd/config.toml"
DEFAULT_DOWNLOADS = 3
FAST_DOWNLOADS = 8  # measured against the default in benchmarks/results/coldnode.txt (docs/kubernetes.md)
LAZY = {"soci", "stargz", "nydus", "overlaybd"}  # snapshotters that pull on first read
TRANSFER_SINCE = (2, 1)  # the CRI's pulls go through the transfer service by default


@dataclass(frozen=True)
class PullSettings:
    version: str  # containerd's, "" when not known
    downloads: int  # what limits a pull's concurrent layer downloads
    where: str  # the key that sets it
    snapshotter: str
    discard_unpacked: bool
    transfer: bool | None  # pulls through the transfer service (2.1+); None before 2.1
    fallback: str = ""  # why a 2.1+ CRI falls back to the old pull

    def describe(self) -> dict[str, Any]:
        return {
            "containerd": self.version or None,
            "max_concurrent_downloads": self.downloads,
            "set_by": self.where,
            "snapshotter": self.snapshotter,
            "discard_unpacked_layers": self.discard_unpacked,
            "transfer_service": self.transfer,
            "fallback": self.fallback or None,
        }


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def read_config(path: Path, root: Path = Path("/")) -> dict[str, Any]:
    """The config as containerd reads it: the file, then each file its ``imports`` name (globs, absolute
    ones under ``root``: the node's filesystem as doctor sees it), merged in order."""
    assert tomllib is not None
    with path.open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)
    for pattern in config.get("imports") or []:
        base, relative = (root, pattern.lstrip("/")) if pattern.startswith("/") else (path.parent, pattern)
        for extra in sorted(base.glob(relative)):
            with extra.open("rb") as f:
                _merge(config, tomllib.load(f))
    return config


def pull_config(config: dict[str, Any]) -> dict[str, Any]:
    """What of the config decides pulls, and nothing else: a registry's auths and configs hold
    credentials, so of them only whether they are set is kept (the report is printed in pod logs)."""

    def keep(table: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: table[k] for k in keys if k in table and isinstance(table[k], (bool, int, str))}

    def registry(table: dict[str, Any]) -> dict[str, Any]:
        reg = table.get("registry") or {}
        return {k: True for k in ("mirrors", "configs", "auths") if reg.get(k)}

    plugins = config.get("plugins") or {}
    cri = plugins.get("io.containerd.grpc.v1.cri") or plugins.get("cri") or {}
    images = plugins.get("io.containerd.cri.v1.images") or {}
    kept: dict[str, Any] = {"version": int(config.get("version", 1)), "plugins": {}}
    if cri:
        entry = keep(cri, ("max_concurrent_downloads",))
        entry["containerd"] = keep(cri.get("containerd") or {}, ("snapshotter", "discard_unpacked_layers", "disable_snapshot_annotations"))
        entry["registry"] = registry(cri)
        kept["plugins"]["io.containerd.grpc.v1.cri"] = entry
    if images:
        entry = keep(images, ("max_concurrent_downloads", "snapshotter", "discard_unpacked_layers", "disable_snapshot_annotations",
                              "use_local_image_pull"))  # fmt: skip
        entry["registry"] = registry(images)
        kept["plugins"]["io.containerd.cri.v1.images"] = entry
    transfer = plugins.get("io.containerd.transfer.v1.local") or {}
    if transfer:
        kept["plugins"]["io.containerd.transfer.v1.local"] = keep(transfer, ("max_concurrent_downloads",))
    return kept


def settings(config: dict[str, Any], version: str) -> PullSettings:
    plugins = config.get("plugins") or {}
    # version 3: every key in the images plugin; version 2: the CRI plugin, snapshotter and discard in its containerd table
    name = "io.containerd.cri.v1.images" if int(config.get("version", 1)) >= 3 else "io.containerd.grpc.v1.cri"
    top = plugins.get(name) or (plugins.get("cri") if name.endswith("grpc.v1.cri") else None) or {}
    table = top if name.endswith("images") else top.get("containerd") or {}
    cri_downloads = int(top.get("max_concurrent_downloads", DEFAULT_DOWNLOADS))
    snapshotter = table.get("snapshotter") or "overlayfs"
    discard = bool(table.get("discard_unpacked_layers", False))
    registry = top.get("registry") or {}
    annotations_on = table.get("disable_snapshot_annotations", True) is False
    key = f'plugins."{name}".max_concurrent_downloads'
    numbers = version_numbers(version)[:2] if version else ()
    if len(numbers) < 2 or tuple(numbers) < TRANSFER_SINCE:
        return PullSettings(version, cri_downloads, key, snapshotter, discard, None)
    reasons = [
        (discard, "discard_unpacked_layers = true"),
        (any(registry.get(k) for k in ("mirrors", "configs", "auths")), "registry mirrors/configs/auths in the CRI config"),
        (cri_downloads != DEFAULT_DOWNLOADS, f"max_concurrent_downloads = {cri_downloads} in the CRI config"),
        (annotations_on, "snapshot annotations on (disable_snapshot_annotations = false)"),
        (bool((plugins.get("io.containerd.cri.v1.images") or {}).get("use_local_image_pull")), "use_local_image_pull = true"),
    ]
    fallback = next((why for present, why in reasons if present), "")
    if fallback:
        return PullSettings(version, cri_downloads, key, snapshotter, discard, False, fallback)
    transfer = plugins.get("io.containerd.transfer.v1.local") or {}
    downloads = int(transfer.get("max_concurrent_downloads", DEFAULT_DOWNLOADS))
    return PullSettings(
        version, downloads, 'plugins."io.containerd.transfer.v1.local".max_concurrent_downloads', snapshotter, discard, True
    )


def containerd_version(runtimes: list[str]) -> str:
    """containerd's version among the node's runtimes (``containerd://1.7.24``), "" if none."""
    for runtime in runtimes:
        name, _, version = runtime.partition("://")
        if name == "containerd" and re.match(r"\d+\.\d+", version):
            return version
    return ""


def read_pull_config(where: Environment) -> tuple[dict[str, Any] | None, str]:
    """The node's :func:`pull_config`, or None and why not ("" when there is no config file)."""
    path = where.path(CONFIG)
    if not path.is_file():
        return None, ""
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        return None, f"{CONFIG}: no TOML reader in this Python (3.10 without tomli)"
    try:
        return pull_config(read_config(path, where.root)), ""
    except (OSError, ValueError, TypeError) as exc:  # TOMLDecodeError is a ValueError
        return None, f"{CONFIG}: cannot read it ({exc})"


def judge_pulls(config: dict[str, Any], version: str) -> Check:
    """The settings, warned where they cost time on 20 GB images."""
    return judge_settings(settings(config, version))


def judge_settings(found: PullSettings) -> Check:
    """:func:`judge_pulls` of settings already read."""
    said = (
        f"containerd {found.version or '(version unknown)'}: {found.downloads} layer download(s) at once ({found.where}), "
        f"snapshotter {found.snapshotter}, unpacked layers {'discarded' if found.discard_unpacked else 'kept'}"
        + (", pulls through the transfer service" if found.transfer else "")
    )
    problems = []
    if found.downloads <= DEFAULT_DOWNLOADS:
        problems.append(
            f"{found.downloads} downloads at once: from a registry that caps each connection, {FAST_DOWNLOADS} took 0.88-0.91x "
            f"the time to a 6 GB image's first import (docs/kubernetes.md); set {found.where} = {FAST_DOWNLOADS}"
        )
    if found.fallback:
        problems.append(f"containerd {found.version} falls back from the transfer service to the old pull because of {found.fallback}")
    if found.snapshotter in LAZY:
        problems.append(f"{found.snapshotter} pulls lazily: the first import reads the framework over the network (time the first step)")
    elif found.snapshotter not in ("overlayfs", "overlay"):
        problems.append(f"snapshotter {found.snapshotter}: overlayfs unpacks and starts large images fastest")
    if problems:
        return Check("containerd pulls", "warn", said + "; " + "; ".join(problems))
    return Check("containerd pulls", "ok", said)


def check_pulls(where: Environment, runtimes: list[str]) -> tuple[list[Check], dict[str, Any] | None]:
    """The node's containerd pull settings judged (``runtimes`` gives its version where known), and
    what of its config decided them (for the report: `k8s preflight` judges it again with the version
    Kubernetes reports)."""
    version = containerd_version(runtimes)
    config, problem = read_pull_config(where)
    if config is None:
        if problem:
            return [Check("containerd pulls", "warn", problem)], None
        if version:
            return [Check("containerd pulls", "skip", f"containerd {version}: no {CONFIG} readable here (its defaults apply)")], None
        return [], None
    return [judge_pulls(config, version)], config
