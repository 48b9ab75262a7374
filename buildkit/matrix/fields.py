"""The scalar types of ``compat_matrix.yaml``: arches, versions, specifiers, names and paths, each a
constrained string whose error says what a valid one looks like (the models in :mod:`model` use them).
The arches are :mod:`buildkit.arch`'s."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

# debian12 has no official CANN image; it is the OS of the stand-in base used where CANN cannot be pulled.
OsName = Literal["ubuntu22.04", "openeuler24.03", "debian12"]


def _pep440_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a PEP 440 version (e.g. 2.7.1, 2.8.0.post2)") from None
    if value != value.strip():
        raise ValueError("surrounding whitespace is not allowed")
    return value


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"{value!r} is not a PEP 440 specifier (e.g. '<2.0.0', '>=0.8,!=0.9.0')") from None
    return value


PackageVersion = Annotated[StrictStr, AfterValidator(_pep440_version)]
VersionSpecifier = Annotated[StrictStr, AfterValidator(_specifier)]
Identifier = Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
ArgName = Annotated[StrictStr, Field(pattern=r"^[A-Z][A-Z0-9_]*$")]
HttpUrl = Annotated[StrictStr, Field(pattern=r"^https?://[^\s]+$")]
CannVersion = Annotated[StrictStr, Field(pattern=r"^\d+\.\d+\.(\d+|RC\d+)$")]
PythonVersion = Annotated[StrictStr, Field(pattern=r"^3\.\d+$")]
PackageName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ModuleName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")]  # package.module


_TAG_FIELDS = ("cann", "chip", "os", "python")


def tag_template(value: str) -> str:
    names = set(re.findall(r"{([^{}]*)}", value))
    unknown = names - set(_TAG_FIELDS)
    if unknown:
        raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; allowed: {list(_TAG_FIELDS)}")
    missing = set(_TAG_FIELDS) - names
    if missing:
        raise ValueError(f"the tag must contain {sorted('{' + m + '}' for m in missing)}")
    return value


COMMIT_ID = r"^[0-9a-f]{40}$"


def _relative_path(value: str) -> str:
    if value.startswith("/") or ".." in value.split("/") or "" in value.split("/"):
        raise ValueError(f"{value!r} must be a relative path inside the repository or distribution (no leading /, no .., no //)")
    return value


# A path inside a repository or a distribution: what a patch or a requirements file names.
RelativePath = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._/-]+$"), AfterValidator(_relative_path)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
