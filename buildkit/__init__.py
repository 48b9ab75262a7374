"""ascendkit: build, verify and ship verl-on-Ascend container images from one compatibility matrix.

``import buildkit`` is cheap: the library API (:mod:`buildkit.api`: plan, render, lock, build,
verify, publish, smoke, compare_logs) loads on first use, so the CLI's start-up does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = ("build", "compare_logs", "load", "lock", "plan", "publish", "render", "smoke", "verify")
__all__ = ["__version__", *_API]

if TYPE_CHECKING:
    from buildkit.api import build, compare_logs, load, lock, plan, publish, render, smoke, verify  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _API:
        from buildkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'buildkit' has no attribute {name!r}")
