"""Registry credentials as Docker keeps them, resolved by docker-py's own auth code.

Docker looks, for one registry host, at ``credHelpers[host]`` of ``$DOCKER_CONFIG/config.json``
(``~/.docker/config.json``), then at ``credsStore``, each a ``docker-credential-<name>`` program
on PATH (Docker Desktop's, ECR's, GCR's, ACR's, a company's own); then at ``auths[host]``, written
by ``docker login`` where no store is set. :func:`credentials_for` asks ``docker.auth`` (docker-py,
the engine client ascendkit builds with) for exactly that, so whatever ``docker push`` would send,
ascendkit sends. An identity token (a helper's ``<token>`` user, or ``identitytoken`` in ``auths``)
is a refresh token for the registry's token service, not a password.

Secrets stay in memory: the dataclass does not print them, and messages name only where the
credentials came from.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import docker.auth
import docker.errors

from buildkit.errors import InputError

# Docker Hub's names: docker-py resolves them as the public index (its credentials are stored
# under https://index.docker.io/v1/).
DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def config_file() -> Path:
    """Where Docker (and docker-py) read the client configuration: ``$DOCKER_CONFIG/config.json``."""
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


@dataclass(frozen=True)
class Credentials:
    """What to send one registry, and where it came from (``source``, for messages)."""

    source: str
    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)

    @property
    def basic(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.username and not self.identity_token else None


def login_hint(host: str) -> str:
    """The command that gives ascendkit credentials for ``host``, and where it reads them."""
    return f"log in with `docker login {host}` (ascendkit reads Docker's credHelpers, credsStore and auths in {config_file()})"


def credentials_for(host: str) -> Credentials | None:
    """The credentials Docker would use for ``host``, None when it has none. A credential helper
    that is missing or fails is an InputError naming it (Docker's own push fails the same way)."""
    registry = None if host in DOCKER_HUB else host
    path = config_file()
    if not path.is_file():  # Docker reads this one file (docker-py alone would fall back to ~/.docker)
        return None
    try:
        config = docker.auth.load_config(str(path))
    except (docker.errors.DockerException, ValueError) as exc:
        raise InputError(f"{config_file()}: cannot read Docker's credentials ({exc})") from None
    store = config.get_credential_store(registry) if (config.creds_store or config.cred_helpers) else None
    try:
        with warnings.catch_warnings():  # docker-py warns of a missing helper, then fails: the failure says it
            warnings.simplefilter("ignore")
            found = config.resolve_authconfig(registry)
    except docker.errors.DockerException as exc:
        raise InputError(
            f"registry {host}: the credential helper docker-credential-{store} named in {config_file()} failed: "
            f"{' '.join(str(exc).split())[:200]}"
        ) from None
    if not found:
        return None
    from_store = "ServerAddress" in found  # docker-py's answer from a helper; an auths entry has lower-case keys
    source = f"docker-credential-{store}" if from_store else f"auths in {config_file()}"
    username = str(found.get("Username") or found.get("username") or "")
    password = str(found.get("Password") or found.get("password") or "")
    token = str(found.get("IdentityToken") or found.get("identitytoken") or "")
    if not (username and password) and not token:
        return None
    return Credentials(source, username, password, token)
