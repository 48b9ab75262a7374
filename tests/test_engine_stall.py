"""An engine that stalls as a build ends. BuildKit before v0.14 (Docker 26's) gives itself 20 s to
record a finished build in its history and fails the build when that runs out, after the image was
exported (moby/buildkit#4327): CI's busy machine met it. tests/harness/stall.py brings it about on the
real engine (stopped for 21 s once the export is reported complete); `ascendkit build` builds again,
from the cache the failed build filled, and tags the very image the first build made."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, TEST_MATRIX, DockerEnv, own_repo
from tests.harness.services import STATE

pytestmark = pytest.mark.docker


@pytest.fixture
def stalling(docker_env: DockerEnv, tmp_path: Path) -> Iterator[tuple[DockerEnv, Path]]:
    """``docker_env`` with the stalling buildx in front of the real one; the file holding how many
    stalls are left (none until the test says)."""
    name = docker_env.env.get("ASCENDKIT_ENGINE_NAME", "docker")
    pid = int((STATE / f"{name}.pid").read_text())
    script, count = tmp_path / "docker-buildx", tmp_path / "stalls"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m tests.harness.stall "$@"\n')
    script.chmod(0o755)
    count.write_text("0")
    env = {
        **docker_env.env,
        "ASCENDKIT_BUILDX": str(script),
        "ASCENDKIT_STALL_BUILDX": docker_env.env["ASCENDKIT_BUILDX"],
        "ASCENDKIT_STALL_PID": str(pid),
        "ASCENDKIT_STALL_COUNT": str(count),
    }
    try:
        yield dataclasses.replace(docker_env, env=env), count
    finally:
        os.kill(pid, signal.SIGCONT)  # whatever stopped the test, the engine runs on


def test_a_build_failed_on_recording_its_history_is_built_again_from_cache(stalling: tuple[DockerEnv, Path], tmp_path: Path) -> None:
    env, count = stalling
    repo = own_repo("stalled")
    build = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", env.standin, "--repo", repo]
    # The image BuildKit's cache holds for these inputs now, whatever other tests built into it before this one
    # (a local image ID carries its build's times: only the cache makes two builds one image).
    unstalled = env.ascendkit(*build, "--json", "-q", cwd=tmp_path)
    assert unstalled.returncode == 0, unstalled.stderr[-3000:]
    cached = json.loads(unstalled.stdout)["image_id"]
    note = "BuildKit built the image, then failed on recording it in its history: built again from cache (2 of 3)"
    for _ in range(3):  # the stall starts a few ms after BuildKit's clock: should the recording beat it, stall again
        count.write_text("1")
        proc = env.ascendkit(*build, "--json", "-q", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert count.read_text() == "0", "the engine was stalled"
        if note in proc.stderr:
            break
    assert note in proc.stderr, "the retry is shown as it happens"
    result = json.loads(proc.stdout)
    assert note in result["notes"]
    assert result["image_id"] == cached, "the same inputs, the same image"
    for ref in result["tags"]:
        assert env.client.inspect_image(ref)["Id"] == result["engine_id"], ref
