"""``remove_containers``: each container tried until the engine no longer has it, within a bound, and one that stays
named on stderr (an overlay2 engine can answer that a layer is busy for a moment after a container exits; a removal
already under way answers 409 until it is done)."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest
import requests

from buildkit.image import engine
from buildkit.image.engine import REMOVE_TRIES, remove_containers


class Engine:
    """Answers as the engine would: ``busy`` failed removals first, then the container is gone."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls, self.gone = busy, 0, False

    def remove_container(self, cid: str, force: bool = False) -> None:
        self.calls += 1
        if self.gone:
            raise docker.errors.NotFound(f"No such container: {cid}")
        if self.calls <= self.busy:
            response = requests.Response()
            response.status_code = 500
            raise docker.errors.APIError("unable to remove filesystem: device or resource busy", response=response)
        self.gone = True

    def inspect_container(self, cid: str) -> dict[str, Any]:
        if self.gone:
            raise docker.errors.NotFound(f"No such container: {cid}")
        return {"Id": cid}


@pytest.fixture
def one_engine(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("buildkit.image.engine.time.sleep", slept.append)
    return slept


def test_a_container_the_engine_is_still_tearing_down_is_removed_on_a_later_try(
    monkeypatch: pytest.MonkeyPatch, one_engine: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = Engine(busy=3)
    monkeypatch.setattr(engine, "connect", lambda timeout: fake)  # the fresh connection of each later try
    remove_containers(fake, ["c" * 64])  # type: ignore[arg-type]
    assert fake.gone and fake.calls == 4 and one_engine == [0.5, 1.0, 2.0], "growing pauses, then gone"
    assert capsys.readouterr().err == ""


def test_a_container_that_stays_is_named_after_a_bounded_number_of_tries(
    monkeypatch: pytest.MonkeyPatch, one_engine: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = Engine(busy=10**6)
    monkeypatch.setattr(engine, "connect", lambda timeout: fake)
    remove_containers(fake, ["d" * 64])  # type: ignore[arg-type]
    assert fake.calls == REMOVE_TRIES and sum(one_engine) == 15.5, "bounded: 0.5 + 1 + 2 + 4 + 8 s"
    assert f"could not remove container {'d' * 12}: remove it with `docker rm -f {'d' * 12}`" in capsys.readouterr().err


def test_a_container_already_gone_costs_one_call(monkeypatch: pytest.MonkeyPatch, one_engine: list[float]) -> None:
    fake = Engine(busy=0)
    fake.gone = True
    remove_containers(fake, ["e" * 64])  # type: ignore[arg-type]
    assert fake.calls == 1 and one_engine == []
