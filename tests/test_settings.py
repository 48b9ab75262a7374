"""Mirror settings: flag over environment over config file; clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildkit.errors import InputError
from buildkit.settings import resolve_mirrors


def test_precedence_flag_env_config(tmp_path: Path) -> None:
    config = tmp_path / "ascendkit.toml"
    config.write_text(
        '[mirrors]\npip_index_url = "https://config.example.com/simple"\n'
        'base_registry = "quay.nju.edu.cn/ascend"\napt_mirror = "http://config.example.com"\n'
    )
    env = {"ASCENDKIT_PIP_INDEX_URL": "https://env.example.com/simple", "ASCENDKIT_APT_MIRROR": "http://env.example.com"}
    mirrors = resolve_mirrors({"apt_mirror": "http://flag.example.com"}, config=config, environ=env)
    assert mirrors.get("apt_mirror") == "http://flag.example.com" and mirrors.origin["apt_mirror"] == "flag"
    assert mirrors.get("pip_index_url") == "https://env.example.com/simple"
    assert mirrors.origin["pip_index_url"] == "env ASCENDKIT_PIP_INDEX_URL"
    assert mirrors.get("base_registry") == "quay.nju.edu.cn/ascend"
    assert mirrors.origin["base_registry"] == f"config {config}"
    assert mirrors.build_args() == {"PIP_INDEX_URL": "https://env.example.com/simple", "APT_MIRROR": "http://flag.example.com"}


def test_config_from_environment_and_default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp_path / "named.toml"
    named.write_text('[mirrors]\ngithub_url = "https://ghproxy.example.com/https://github.com"\n')
    assert (
        resolve_mirrors({}, environ={"ASCENDKIT_CONFIG": str(named)}).get("github_url") == "https://ghproxy.example.com/https://github.com"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ascendkit.toml").write_text('[mirrors]\ngitcode_url = "https://gitcode.example.com"\n')
    assert resolve_mirrors({}, environ={}).get("gitcode_url") == "https://gitcode.example.com"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mirrors]\npip_index = 'x'\n", "[mirrors] pip_index: unknown setting"),
        ("[mirror]\n", "unknown section(s) mirror"),
        ("[mirrors]\npip_index_url = 3\n", "expected a non-empty string"),
        ("[mirrors\n", "not valid TOML"),
        ("[mirrors]\npip_index_url = 'ftp://x'\n", "expected http(s) URL(s)"),
    ],
)
def test_bad_config(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        resolve_mirrors({}, config=config, environ={})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="config file not found"):
        resolve_mirrors({}, config=tmp_path / "nope.toml", environ={})
