"""What a build records of its base (buildkit.image.build.base_of), as each engine shows it: a
registry digest only where a registry gave it. Docker's graph-driver stores list a repository digest
only after a pull (or push); the containerd store lists one for every image, loaded ones included,
so there the registry is asked, and a base it does not serve at that digest is recorded by its
config digest as loaded. The engines' answers are shaped as tests/fixtures/engines says they are."""

from __future__ import annotations

from typing import Any

import pytest

from buildkit.image import build
from buildkit.image.archive import ImageIdentity
from buildkit.image.engine import CONTAINERD_STORE, GRAPH_DRIVER_STORE, EngineFacts

REF = "quay.io/ascend/cann:8.3.rc1-a3"
CONFIG = "sha256:" + "c" * 64
MANIFEST = "sha256:" + "a" * 64  # what the store calls the image, and lists as its repository digest


class Engine:
    def __init__(self, repo_digests: list[str], image_id: str) -> None:
        self.inspect = {"Id": image_id, "RepoDigests": repo_digests, "Os": "linux", "Architecture": "arm64"}

    def inspect_image(self, ref: str) -> dict[str, Any]:
        assert ref == REF
        return self.inspect


def _facts(store: str) -> EngineFacts:
    return EngineFacts("Docker Engine", "26.1.5", "1.45", store, "overlayfs" if store == CONTAINERD_STORE else "overlay2")


@pytest.fixture
def registry_says(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    said: dict[str, str | None] = {"digest": None}

    def ask(ref: str, timeout: int = 20) -> tuple[dict[str, Any] | None, str]:  # the engine's distribution answer, or why not
        assert ref == REF
        return (None, "connection refused") if said["digest"] is None else ({"Descriptor": {"digest": said["digest"]}}, "")

    monkeypatch.setattr(build, "_ask_registry", ask)
    monkeypatch.setattr(
        build,
        "identify",
        lambda client, ref, inspect=None, store=None: ImageIdentity(CONFIG, str(inspect["Id"]) if inspect else MANIFEST),
    )
    return said


def test_a_pulled_base_on_a_graph_driver_store_keeps_its_registry_digest(registry_says: dict[str, str | None]) -> None:
    engine = Engine([f"quay.io/ascend/cann@{MANIFEST}"], CONFIG)
    base = build.base_of(engine, REF, _facts(GRAPH_DRIVER_STORE))  # type: ignore[arg-type]
    assert (base.digest, base.from_registry) == (MANIFEST, True)


def test_a_loaded_base_on_a_graph_driver_store_is_its_config(registry_says: dict[str, str | None]) -> None:
    base = build.base_of(Engine([], CONFIG), REF, _facts(GRAPH_DRIVER_STORE))  # type: ignore[arg-type]
    assert (base.digest, base.from_registry) == (CONFIG, False)


def test_on_the_containerd_store_only_the_registry_s_word_makes_a_registry_digest(registry_says: dict[str, str | None]) -> None:
    engine = Engine([f"quay.io/ascend/cann@{MANIFEST}"], MANIFEST)  # the store lists its own manifest even for a loaded image
    loaded = build.base_of(engine, REF, _facts(CONTAINERD_STORE))  # type: ignore[arg-type]
    assert (loaded.digest, loaded.from_registry) == (CONFIG, False), "the registry cannot be asked: loaded, by config"
    registry_says["digest"] = "sha256:" + "e" * 64
    other = build.base_of(engine, REF, _facts(CONTAINERD_STORE))  # type: ignore[arg-type]
    assert (other.digest, other.from_registry) == (CONFIG, False), "the registry serves another image under the name"
    registry_says["digest"] = MANIFEST
    pulled = build.base_of(engine, REF, _facts(CONTAINERD_STORE))  # type: ignore[arg-type]
    assert (pulled.digest, pulled.from_registry) == (MANIFEST, True)
