"""Where every network input of a build comes from: mirrors, indexes, the CA bundle.

Each setting is taken from, in order: the command-line flag, the environment variable
(``ASCENDKIT_<NAME>``), the config file, the matrix's default. The config file is the first of
``--config FILE``, ``$ASCENDKIT_CONFIG``, ``./ascendkit.toml``, ``~/.config/ascendkit/config.toml``
that exists; its settings live under ``[mirrors]``.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from buildkit.errors import InputError
from buildkit.fsio import read_input_bytes, read_input_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# setting -> the Dockerfile build ARG it sets (None: used by ascendkit itself, not an ARG)
SETTINGS: dict[str, str | None] = {
    "pip_index_url": "PIP_INDEX_URL",
    "pip_extra_index_url": "PIP_EXTRA_INDEX_URL",
    "pytorch_index_url": "PYTORCH_INDEX_URL",
    "ascend_index_url": "ASCEND_INDEX_URL",
    "apt_mirror": "APT_MIRROR",
    "github_url": "GITHUB_URL",
    "gitcode_url": "GITCODE_URL",
    "base_registry": None,
    "ca_bundle": None,
}
URL_SETTINGS = ("pip_index_url", "pip_extra_index_url", "pytorch_index_url", "ascend_index_url", "apt_mirror", "github_url", "gitcode_url")


def env_name(setting: str) -> str:
    return f"ASCENDKIT_{setting.upper()}"


def default_config_paths() -> list[Path]:
    return [Path("ascendkit.toml"), Path.home() / ".config" / "ascendkit" / "config.toml"]


@dataclass(frozen=True)
class Mirrors:
    values: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # setting -> "flag", "env ASCENDKIT_X" or "config FILE"

    def get(self, setting: str) -> str | None:
        return self.values.get(setting)

    def build_args(self) -> dict[str, str]:
        """ARG name -> value for every URL setting that is set (credentials still inside)."""
        return {arg: self.values[name] for name, arg in SETTINGS.items() if arg and name in self.values}


def _read_config(path: Path) -> dict[str, str]:
    try:
        data = tomllib.loads(read_input_text(path, "config file"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    unknown_sections = sorted(set(data) - {"mirrors"})
    if unknown_sections:
        raise InputError(f"{path}: unknown section(s) {', '.join(unknown_sections)}; settings go under [mirrors]")
    section = data.get("mirrors", {})
    result = {}
    for key, value in section.items():
        if key not in SETTINGS:
            raise InputError(f"{path}: [mirrors] {key}: unknown setting; known: {', '.join(SETTINGS)}")
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: [mirrors] {key}: expected a non-empty string")
        result[key] = value
    return result


def resolve_mirrors(flags: Mapping[str, str | None], *, config: Path | None = None, environ: Mapping[str, str] | None = None) -> Mirrors:
    env = os.environ if environ is None else environ
    config_path = config or (Path(env["ASCENDKIT_CONFIG"]) if env.get("ASCENDKIT_CONFIG") else None)
    if config_path is None:
        config_path = next((p for p in default_config_paths() if p.is_file()), None)
    elif not config_path.exists() and not config_path.is_symlink():
        raise InputError(f"{config_path}: config file not found")
    from_file = _read_config(config_path) if config_path else {}
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name in SETTINGS:
        flag = flags.get(name)
        if flag:
            values[name], origin[name] = flag, "flag"
        elif env.get(env_name(name)):
            values[name], origin[name] = env[env_name(name)], f"env {env_name(name)}"
        elif name in from_file:
            values[name], origin[name] = from_file[name], f"config {config_path}"
    for name in URL_SETTINGS:
        value = values.get(name)
        if value and not all(part.startswith(("http://", "https://")) for part in value.split()):
            raise InputError(f"{name} {value!r} (from {origin[name]}): expected http(s) URL(s)")
    return Mirrors(values, origin)


def split_credentials(url: str) -> tuple[str, str | None]:
    """``https://user:tok@host/simple`` -> (``https://host/simple``, the original URL) ."""
    parts = urllib.parse.urlsplit(url)
    if not parts.username and not parts.password:
        return url, None
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), url


def env_whole_number(name: str, default: int, low: int, high: int) -> int:
    """``$NAME`` as a whole number from ``low`` to ``high`` (``default`` when unset); InputError (exit 2) naming it otherwise."""
    text = os.environ.get(name, str(default))
    if not text.isdigit() or not low <= int(text) <= high:
        raise InputError(f"{name}={text!r}: give a whole number from {low} to {high}")
    return int(text)


def default_ca_bundle() -> Path | None:
    """The host's bundle when the environment names one (what a TLS-intercepting proxy needs)."""
    for name in ("PIP_CERT", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


def read_ca_bundle(path: Path) -> bytes:
    """A ``--ca-bundle``: a readable regular file with at least one PEM certificate (checked before
    any index, registry or engine is asked, by every command that takes the option)."""
    data = read_input_bytes(path, "CA bundle (--ca-bundle)")
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise InputError(f"--ca-bundle {path}: not a PEM certificate bundle (no BEGIN CERTIFICATE line)")
    return data


def checked_ca_bundle(path: Path | None) -> Path | None:
    """The bundle to use for index requests: ``path`` once checked, else the host's (PIP_CERT, SSL_CERT_FILE)."""
    if path is None:
        return default_ca_bundle()
    read_ca_bundle(path)
    return path
