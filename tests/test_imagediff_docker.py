"""What was added to a published image, on the real engine and registry: a copy made the way images are most
often changed after the fact (a plain `docker build` of one RUN on top of the published image, pushed by the
engine) is named by `ascendkit diff` layer by layer (the added layer with its step, the file it writes and the
file it removes), and `ascendkit rebuild` of the copy (no provenance) says which published image it extends."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from typing import Any

import pytest

from tests.conftest import TEST_MATRIX, DockerEnv
from tests.test_imagediff import planted_layer_cases

pytestmark = pytest.mark.docker

STEP = "echo planted > /etc/ascendkit-added && rm -f /etc/debian_version"


def _context(base: str) -> io.BytesIO:
    dockerfile = f"FROM {base}\nUSER root\nRUN {STEP}\n".encode()  # the reference runs as its own user
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    out.seek(0)
    return out


def test_a_layer_added_on_top_by_the_engine_is_named_and_rebuild_says_what_the_copy_extends(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Any
) -> None:
    registry = docker_env.registry
    original = f"{registry}/{built['repo']}@{built['pushed'][0]['digest']}"
    copy_tag = f"hand-{uuid.uuid4().hex[:8]}"
    copy = f"{registry}/{built['repo']}:{copy_tag}"
    client = docker_env.client
    log = list(client.build(fileobj=_context(original), custom_context=True, tag=copy, rm=True, forcerm=True, pull=True, decode=True))
    assert not [e for e in log if "error" in e], log[-3:]
    try:
        pushed = list(client.push(f"{registry}/{built['repo']}", tag=copy_tag, stream=True, decode=True))
        assert not [e for e in pushed if "error" in e], pushed[-3:]

        shown = docker_env.ascendkit("diff", original, copy, "--json", cwd=tmp_path)
        assert shown.returncode == 1, shown.stderr
        report = json.loads(shown.stdout)
        added = [d for d in report["differences"] if d["side"] == "B"]
        top = len([d for d in report["differences"] if d["layer"] == -1 and d["what"] == "layer count"])
        assert top == 1 and added, report["differences"][:5]
        layer = added[0]["layer"]
        assert all(d["layer"] == layer for d in added), "one layer was added"
        assert STEP in added[0]["created_by"], added[0]
        named = {(d["path"], d["what"]) for d in added}
        assert ("etc/ascendkit-added", "added in B") in named, named
        assert ("etc/debian_version", "removed (whiteout) in B") in named, named
        changed = [d for d in report["differences"] if not d["normalization"] and d["layer"] > 0 and not d["side"]]
        assert changed == [], f"the layers below it are the published ones: {changed[:5]}"

        text = docker_env.ascendkit("diff", original, copy, cwd=tmp_path).stdout
        assert f"layer {layer} of B: etc/ascendkit-added: added in B" in " ".join(text.split())

        refused = docker_env.ascendkit(
            "rebuild", copy, "--to", f"{registry}/scratch-{copy_tag}", "--matrix", str(TEST_MATRIX), cwd=tmp_path
        )
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2, refused.stderr
        assert "no SLSA provenance" in said and built["pushed"][0]["digest"] in said, said
        assert f"layers are {registry}/{built['repo']}:" in said and "1 layer(s) were added on top" in said, said
        assert f"ascendkit diff {original}" in said, said
    finally:
        client.remove_image(copy, force=True)


def test_each_planted_layer_case_is_named_through_the_real_registry(docker_env: DockerEnv) -> None:
    """The cases a hand-made image can hold (a layer on top, a whiteout, a file changed inside a layer, a layer
    inserted below the top, one dropped, times only), pushed to and read back from the real registry."""
    planted_layer_cases(docker_env.registry)
