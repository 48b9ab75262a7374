"""Image references as the distribution spec spells them: ``NAME[:TAG][@sha256:DIGEST]``.

Building (the base image, the local repository), running (the image a smoke job takes), rendering
Kubernetes jobs and shipping all read references; the grammar is here, below all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildkit.errors import InputError

# NAME[:TAG][@sha256:DIGEST] as the distribution spec's reference grammar has it.
IMAGE_REFERENCE = re.compile(
    r"^(?P<name>(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)

_REGISTRY_REF = re.compile(r"^(?P<host>[a-zA-Z0-9.-]+(:\d+)?)/(?P<repo>[a-z0-9]+([._/-][a-z0-9]+)*)$")


@dataclass(frozen=True)
class RegistryRef:
    """``HOST[:PORT]/REPO`` as given to ``--registry``."""

    host: str
    repository: str

    @classmethod
    def parse(cls, text: str, option: str = "--registry") -> RegistryRef:
        match = _REGISTRY_REF.match(text.strip())
        if not match or ("." not in match["host"] and ":" not in match["host"] and match["host"] != "localhost"):
            raise InputError(f"{option} {text!r}: expected HOST[:PORT]/REPO, e.g. 127.0.0.1:5000/ascendkit or registry.example.com/ml/verl")
        return cls(match["host"], match["repo"])

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"


def split_ref(ref: str) -> tuple[str, str, str]:
    """``NAME[:TAG][@DIGEST]`` -> (name, tag, digest), "" for what is absent (a registry port is not a tag)."""
    name, _, digest = ref.partition("@")
    head, _, last = name.rpartition("/")
    repo_part, _, tag = last.partition(":")
    return (f"{head}/{repo_part}" if head else repo_part), tag, digest


def registry_of(ref: str) -> tuple[str, str] | None:
    """(host, repository) when ``ref`` names a registry (its first part has a '.', a port or is
    localhost, as Docker reads references); None for a name on the local engine (``ascendkit/verl:x``)."""
    name, _, _ = split_ref(ref)
    host, _, repository = name.partition("/")
    if repository and ("." in host or ":" in host or host == "localhost"):
        return host, repository
    return None
