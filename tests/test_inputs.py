"""An image's inputs as one digest, and `build --push` finding the image those inputs publish: the digest
moves with every input (the Dockerfile the builder runs, a lock section, a build argument, the base,
the platform, the builder) and with nothing else; a registry that lacks the image, an index under the
tag or a signature by another key means a build, and so do --no-cache and --reverify."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from buildkit.image.buildplan import BuildPlan, plan_build
from buildkit.image.inputs import build_inputs, inputs_digest, inputs_tag
from buildkit.imageref import RegistryRef
from buildkit.matrix.load import load_matrix
from buildkit.ship import reuse
from buildkit.ship.layers.compressing import GZIP, ZSTD
from buildkit.ship.oci.registry import DOCKER_LIST, OCI_MANIFEST, Manifest
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.request import PushRequest, reuse_built
from tests.conftest import ROOT

TEST_MATRIX = ROOT / "tests/fixtures/test_matrix.yaml"
BASE = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def plan() -> BuildPlan:
    return plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", use_default_ca=False)


def digest(plan: BuildPlan, builder: str = "buildkit", base: str = BASE) -> str:
    return inputs_digest(build_inputs(plan, builder, base))


def test_the_same_inputs_give_the_same_digest_and_each_input_moves_it(plan: BuildPlan) -> None:
    first = digest(plan)
    assert digest(plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", use_default_ca=False)) == first, "planned again"
    assert digest(dataclasses.replace(plan, no_cache=True, reverify=True)) == first, "how it is built is not what it is built from"
    (path, text), *rest = plan.lock_files
    moved = {
        "a lock section": dataclasses.replace(plan, lock_files=((path, text + "# another pin\n"), *rest)),
        "a build argument": dataclasses.replace(plan, buildargs=(*plan.buildargs, ("PIP_INDEX_URL", "https://mirror.example.cn/simple"))),
        "the Dockerfile": dataclasses.replace(plan, dockerfile=plan.dockerfile + "\n# one more line\n"),
    }
    for what, changed in moved.items():
        assert digest(changed) != first, what
    assert digest(plan, base="sha256:" + "c" * 64) != first, "the base"
    assert digest(plan, builder="classic") != first, "the builder (and the classic render it runs)"
    arm = plan_build(load_matrix(TEST_MATRIX), "a3", arch="aarch64", use_default_ca=False)
    assert digest(arm) != first, "the platform"
    tag = inputs_tag(first)
    assert tag == f"inputs-{first[:48]}" and len(tag) <= 128


class FakeRegistry:
    def __init__(self, held: dict[str, Manifest]) -> None:
        self.held = held

    def get_manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.held.get(reference)


def image(digest_hex: str, media_type: str = OCI_MANIFEST) -> Manifest:
    return Manifest("sha256:" + digest_hex * 64, media_type, 10, b"{}")


def target(name: str, held: dict[str, Manifest]) -> Target:
    return Target(RegistryRef.parse(f"127.0.0.1:5999/{name}"), FakeRegistry(held))  # type: ignore[arg-type]


def test_the_image_is_found_only_where_every_registry_holds_every_compression(monkeypatch: pytest.MonkeyPatch) -> None:
    tag = "inputs-" + "a" * 48
    both = {tag: image("1"), f"{tag}-zstd": image("2")}
    gzip_only = ShipOptions()
    with_zstd = ShipOptions(compressions=(GZIP, ZSTD))
    found = reuse.find_built([target("one", both), target("two", both)], tag, with_zstd)
    assert found is not None and set(found) == {("127.0.0.1:5999/one", "gzip"), ("127.0.0.1:5999/one", "zstd"),
                                                ("127.0.0.1:5999/two", "gzip"), ("127.0.0.1:5999/two", "zstd")}  # fmt: skip
    assert reuse.find_built([target("one", both), target("two", {tag: image("1")})], tag, with_zstd) is None, "one lacks zstd"
    assert reuse.find_built([target("one", both), target("two", {})], tag, gzip_only) is None, "one lacks it"
    assert reuse.find_built([target("one", {tag: image("3", DOCKER_LIST)})], tag, gzip_only) is None, "an index is no image"
    asked: list[str] = []

    def signed_by(registry: Any, repository: str, digest: str, signer: Any) -> bool:
        asked.append(digest)
        return False

    monkeypatch.setattr(reuse, "signed_by", signed_by)
    signing = ShipOptions(signer=object())  # type: ignore[arg-type]
    assert reuse.find_built([target("one", both)], tag, signing) is None, "not signed by this key: built and signed"
    assert asked == [image("1").digest]


def test_no_cache_and_reverify_build_without_asking_anyone(plan: BuildPlan) -> None:
    class NoEngine:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine was asked ({name})")

    push = PushRequest((RegistryRef.parse("127.0.0.1:9/nowhere"),), ShipOptions())
    for asked in ({"no_cache": True}, {"reverify": True}):
        assert reuse_built(NoEngine(), load_matrix(TEST_MATRIX), dataclasses.replace(plan, **asked), push) is None  # type: ignore[arg-type]


def test_a_base_found_once_makes_the_inputs_tag_and_the_record_alike(plan: BuildPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """`build --push` works the base's digest out once (on the containerd store a loaded base is hashed whole):
    the inputs tag is made from it and the build record names it, never a second answer."""
    from buildkit.doctor.engine import engine_from
    from buildkit.image import build
    from buildkit.image.engine import EngineFacts
    from buildkit.image.sbom import BaseImage

    def again(*_: object) -> BaseImage:
        raise AssertionError("the base was worked out again")

    class Engine:  # a Docker 26 engine as /version and /info describe it, nothing else
        def version(self) -> dict[str, Any]:
            return {"Version": "26.1.5", "ApiVersion": "1.45", "Components": [{"Name": "Engine", "Version": "26.1.5"}]}

        def info(self) -> dict[str, Any]:
            return {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}

    monkeypatch.setattr(build, "base_of", again)
    monkeypatch.setattr(reuse, "choose_builder", lambda *_, **__: type("Builder", (), {"name": "buildkit"})())
    known = BaseImage(plan.base_image, BASE, False, 3)
    assert reuse.planned_inputs_tag(Engine(), plan, known) == inputs_tag(digest(plan))  # type: ignore[arg-type]
    facts = EngineFacts(**engine_from(Engine().version(), Engine().info()))
    assert build.base_for(Engine(), plan.base_image, facts, known) is known  # type: ignore[arg-type]
    other = BaseImage("elsewhere/cann:1", BASE, False, 3)  # found for another ref: not this build's base
    with pytest.raises(AssertionError, match="worked out again"):
        build.base_for(Engine(), plan.base_image, facts, other)  # type: ignore[arg-type]
