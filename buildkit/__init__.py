"""ascendkit: build, verify and ship verl-on-Ascend container images from one compatibility matrix.

``import buildkit`` is cheap: the library API (:mod:`buildkit.api`: plan_image, render, relock,
build, build_and_push, verify, publish, smoke, k8s_render, compare) loads on first use, so the CLI's start-up does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from buildkit.version import __version__

_API = ("build", "build_and_push", "compare", "k8s_render", "load", "plan_image", "publish", "relock", "render", "smoke", "verify")
__all__ = ["__version__", *_API]

if TYPE_CHECKING:
    from buildkit.api import build as build
    from buildkit.api import build_and_push as build_and_push
    from buildkit.api import compare as compare
    from buildkit.api import k8s_render as k8s_render
    from buildkit.api import load as load
    from buildkit.api import plan_image as plan_image
    from buildkit.api import publish as publish
    from buildkit.api import relock as relock
    from buildkit.api import render as render
    from buildkit.api import smoke as smoke
    from buildkit.api import verify as verify


def __getattr__(name: str) -> Any:
    if name in _API:
        from buildkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'buildkit' has no attribute {name!r}")
