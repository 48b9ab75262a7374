"""A repository's description on the registries that keep one: the overview page ``render --all``
writes (``docs/repositories/<framework>.md``) set as the text people see next to the tags.

Distribution has no such API; three registry products do, each its own way, and ascendkit speaks
the three as their documentation gives them:

    quay      PUT  /api/v1/repository/<namespace>/<repo>        {"description": ...}   Bearer <OAuth token>
    harbor    PUT  /api/v2.0/projects/<project>/repositories/<rest, %2F-escaped twice>  {"description": ...}
                                                                                     basic <user>:<password>
    dockerhub POST https://hub.docker.com/v2/users/login -> token;
              PATCH https://hub.docker.com/v2/repositories/<namespace>/<repo>/   {"full_description": ...}

Which one a host is: quay.io and Docker Hub by name, Harbor by its ``/api/v2.0/systeminfo``; any
other registry has nothing to set (``--if-supported`` makes that a note, not an error). Credentials
come from the environment only (never an argument, never printed): ASCENDKIT_REGISTRY_TOKEN (quay),
ASCENDKIT_REGISTRY_USERNAME and ASCENDKIT_REGISTRY_PASSWORD (Harbor, Docker Hub). Answers 429, 5xx
and dropped connections are tried again, a bounded number of times, as every registry call is.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import requests

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.imageref import RegistryRef
from buildkit.retry import RetryPolicy
from buildkit.ship.oci.session import default_retries, host_url

Flavor = Literal["quay", "harbor", "dockerhub"]
FLAVORS: tuple[Flavor, ...] = ("quay", "harbor", "dockerhub")
DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")
DOCKER_HUB_API = "https://hub.docker.com"
TOKEN_ENV = "ASCENDKIT_REGISTRY_TOKEN"
USERNAME_ENV = "ASCENDKIT_REGISTRY_USERNAME"
PASSWORD_ENV = "ASCENDKIT_REGISTRY_PASSWORD"


class NoDescriptionApi(Unavailable):
    """The registry keeps no description ascendkit can set (or not with the credentials given)."""


@dataclass(frozen=True)
class Described:
    repository: str
    flavor: Flavor
    url: str  # the API endpoint that took the text (credentials never in it)
    characters: int


def detect(session: requests.Session, ref: RegistryRef, timeout: float = 15.0) -> Flavor | None:
    """Which description API the registry speaks, if any."""
    host = ref.host.lower()
    if host == "quay.io" or host.endswith(".quay.io"):
        return "quay"
    if host in DOCKER_HUB_HOSTS:
        return "dockerhub"
    try:
        answer = session.get(f"{host_url(ref.host)}/api/v2.0/systeminfo", timeout=timeout)
    except requests.RequestException as exc:
        raise Unavailable(f"{ref.host} could not be reached: {exc.__class__.__name__}") from None
    if answer.status_code == 200 and "harbor_version" in answer.text:
        return "harbor"
    return None


def _call(session: requests.Session, method: str, url: str, sleep: Callable[[float], None], **kwargs: Any) -> requests.Response:
    """One API call, tried again as every registry call is (the one retry policy: a lost connection,
    408, 429 and 5xx; Retry-After honoured, capped), as many times as $ASCENDKIT_REGISTRY_RETRIES allows."""
    policy = RetryPolicy(default_retries(), sleep=sleep)

    def failure(what: BaseException | requests.Response) -> str:
        return f"HTTP {what.status_code}" if isinstance(what, requests.Response) else what.__class__.__name__

    try:
        done = policy.call(lambda: session.request(method, url, timeout=60, **kwargs), failure)
    except requests.RequestException as exc:  # not a lost connection: not retried
        raise Unavailable(f"{url} could not be reached: {exc.__class__.__name__}") from None
    if done.response is None:
        raise Unavailable(f"{url} could not be reached after {done.tries} attempts: {done.last}")
    return done.response


def _need(name: str, flavor: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise NoDescriptionApi(f"a {flavor} repository's description needs ${name}")
    return value


def describe(
    repository: str,
    text: str,
    *,
    flavor: Flavor | None = None,
    session: requests.Session | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Described:
    """Set ``repository``'s description to ``text`` (Markdown). Raises NoDescriptionApi when the
    registry keeps none ascendkit can set, PublishFailed when it refuses the text or the credentials."""
    ref = RegistryRef.parse(repository, "REPOSITORY")
    session = session or requests.Session()
    chosen = flavor or detect(session, ref)
    if chosen is None:
        raise NoDescriptionApi(f"{ref.host} keeps no repository description ascendkit can set (quay.io, Harbor and Docker Hub do)")
    body: dict[str, str]
    if chosen == "quay":
        url = f"{host_url(ref.host)}/api/v1/repository/{ref.repository}"
        headers = {"Authorization": f"Bearer {_need(TOKEN_ENV, chosen)}"}
        answer = _call(session, "PUT", url, sleep, json={"description": text}, headers=headers)
    elif chosen == "harbor":
        project, _, rest = ref.repository.partition("/")
        if not rest:
            raise InputError(f"REPOSITORY {repository!r}: a Harbor repository is PROJECT/NAME")
        # Harbor's API takes a repository name with slashes escaped twice (%252F)
        name = urllib.parse.quote(urllib.parse.quote(rest, safe=""), safe="")
        url = f"{host_url(ref.host)}/api/v2.0/projects/{project}/repositories/{name}"
        auth = (_need(USERNAME_ENV, chosen), _need(PASSWORD_ENV, chosen))
        answer = _call(session, "PUT", url, sleep, json={"description": text}, auth=auth)
    else:
        namespace = ref.repository if "/" in ref.repository else f"library/{ref.repository}"
        login = _call(
            session,
            "POST",
            f"{DOCKER_HUB_API}/v2/users/login",
            sleep,
            json={"username": _need(USERNAME_ENV, chosen), "password": _need(PASSWORD_ENV, chosen)},
        )
        if login.status_code != 200 or "token" not in login.text:
            raise PublishFailed(f"Docker Hub refused the login of ${USERNAME_ENV} (HTTP {login.status_code})")
        url = f"{DOCKER_HUB_API}/v2/repositories/{namespace}/"
        body = {"full_description": text}
        answer = _call(session, "PATCH", url, sleep, json=body, headers={"Authorization": f"JWT {login.json()['token']}"})
    if answer.status_code in (401, 403):
        raise PublishFailed(f"{url}: HTTP {answer.status_code}: the credentials may not change this repository's description")
    if answer.status_code == 404:
        raise PublishFailed(f"{url}: HTTP 404: no such repository; publish an image to it first")
    if answer.status_code >= 300:
        raise PublishFailed(f"{url}: HTTP {answer.status_code}: {answer.text[:200]}")
    return Described(ref.name, chosen, url, len(text))
