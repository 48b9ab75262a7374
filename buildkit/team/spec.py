"""A team's image file (``ascendkit-team.yaml``): what a team adds on top of a reference image.

It lives in the team's own repository and names the base (a stack and SKU of the matrix), the team's
packages (requirement lines and requirement files), its framework fork at a full commit, its files and
environment, and the base packages it means to move (``replace``, each with its reason). It is read as the
matrix is: every problem with its file, line and field, all at once (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import AfterValidator, Field, StrictStr, ValidationError, model_validator

from buildkit.arch import Arch
from buildkit.errors import AscendkitError, Finding, Location
from buildkit.matrix.fields import Frozen, Identifier, PackageName
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.yamlsource import SourceMap, YamlSourceError, format_path, load_yaml
from buildkit.violation import PathKey

TEAM_FILE = "ascendkit-team.yaml"
MAX_TEAM_FILE = 256 * 1024
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class TeamFileError(AscendkitError):
    """The team file failed to parse or validate; every finding, not only the first (exit 2)."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = sorted(findings, key=lambda f: (f.location, f.field, f.message))
        super().__init__(f"{len(self.findings)} error(s) in the team file")

    def format(self) -> str:
        return "\n".join([*(f.format() for f in self.findings), str(self)])

    def __str__(self) -> str:  # the CLI prints str(error): the findings, then the count
        return "\n".join([*(f.format() for f in self.findings), self.args[0]])


def _requirement(value: str) -> str:
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a requirement line ({str(exc).splitlines()[0]})") from None
    if requirement.url:
        raise ValueError(
            f"{value!r} is a direct reference: a git or URL source cannot be hash-locked here; a framework fork goes under `framework:`"
        )
    return value


def _commit(value: str) -> str:
    if not COMMIT.match(value):
        raise ValueError(
            f"{value!r} is not a full commit: a branch or tag moves under the lock; give the 40-hex commit (`git rev-parse {value}`)"
        )
    return value


def _relative(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or not value.strip():
        raise ValueError(f"{value!r} must be a path inside the team's repository (relative, no '..')")
    return value


def _absolute(value: str) -> str:
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be an absolute path in the image (no '..')")
    if path.parts[1:2] in (("etc",), ("usr",), ("opt",)) and len(path.parts) < 3:
        raise ValueError(f"{value!r} would replace a system directory; name a directory of the team's (e.g. /opt/team)")
    return value


RequirementLine = Annotated[StrictStr, AfterValidator(_requirement)]
Commit = Annotated[StrictStr, AfterValidator(_commit)]
RepoPath = Annotated[StrictStr, AfterValidator(_relative)]
ImagePath = Annotated[StrictStr, AfterValidator(_absolute)]
EnvName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
GitUrl = Annotated[StrictStr, Field(pattern=r"^(https?|ssh|git|file)://\S+$")]
ImageRef = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")]
ImageName = Annotated[StrictStr, Field(pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")]


class BaseSpec(Frozen):
    """The reference the team builds on: a stack of the matrix for one SKU, or a published ascendkit image (its locks and
    labels say what it is; no matrix needed)."""

    stack: Identifier | None = None
    sku: Identifier | None = None
    image: ImageRef | None = None

    @model_validator(mode="after")
    def _one_form(self) -> BaseSpec:
        if self.image is not None and self.stack is not None:
            raise ValueError("give stack: and sku: (a stack of the matrix) or image: (a published ascendkit image), not both")
        if self.image is None and (self.stack is None or self.sku is None):
            raise ValueError("give stack: and sku: (a stack of the matrix for one SKU), or image: (a published ascendkit image)")
        return self


class TeamFramework(Frozen):
    """The team's framework fork, built from git at a full commit, replacing the image's framework."""

    git: GitUrl
    commit: Commit
    replaces: Identifier = Field(
        description="the framework of the base it replaces (verl, openrlhf): said, so a fork never lands by surprise"
    )
    subdirectory: RepoPath | None = None


class TeamFiles(Frozen):
    src: RepoPath
    dest: ImagePath


class TeamSpec(Frozen):
    schema_version: Literal[1]
    name: ImageName = Field(description="the team image's repository name, e.g. acme/verl-math")
    base: BaseSpec
    packages: tuple[RequirementLine, ...] = ()
    requirements: tuple[RepoPath, ...] = Field(default=(), description="requirement files of the team's repository")
    framework: TeamFramework | None = None
    files: tuple[TeamFiles, ...] = ()
    env: dict[EnvName, StrictStr] = Field(default={})
    replace: dict[PackageName, StrictStr] = Field(
        default={}, description="base packages the team means to move, each with its reason: carried into the build record"
    )
    arches: tuple[Arch, ...] = Field(
        default=(),
        description="the arches the team's image is built for (one build and lock each), published under one multi-arch index; "
        "unset: each build is an image of its own arch",
    )


@dataclass(frozen=True)
class TeamRequirement:
    """One requirement of the team, with where it was written (the file's line, or the team file's field)."""

    line: str
    where: str

    @property
    def requirement(self) -> Requirement:
        return Requirement(self.line)

    @property
    def key(self) -> str:
        return canonicalize_name(self.requirement.name)


@dataclass(frozen=True)
class LoadedTeam:
    spec: TeamSpec
    path: Path
    source: SourceMap
    text: str
    requirements: tuple[TeamRequirement, ...]
    requirement_texts: tuple[tuple[str, str], ...]  # (relative path, text) of each requirements file: the lock's inputs

    @property
    def root(self) -> Path:
        return self.path.resolve().parent


def _finding(source: SourceMap, loc: PathKey, message: str, hint: str = "") -> Finding:
    return Finding(source.locate(loc), format_path(loc) or "<document>", message, hint=hint)


def _pydantic_findings(exc: ValidationError, source: SourceMap) -> list[Finding]:
    findings = []
    for err in exc.errors():
        loc: PathKey = tuple(part for part in err["loc"] if part != "[key]")
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed(loc[:-1]))
            findings.append(Finding(source.locate(loc, prefer_key=True), format_path(loc), f"unknown key {loc[-1]!r}", hint=allowed))
            continue
        if err["type"] == "missing":
            message = "required field is missing"
        elif err["type"] == "string_pattern_mismatch":
            message = f"{err.get('input')!r} is not valid here"
        findings.append(_finding(source, loc, message))
    return findings


def _allowed(loc: PathKey) -> list[str]:
    model: Any = TeamSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        inner = [t for t in getattr(field.annotation, "__args__", (field.annotation,)) if isinstance(t, type)]
        model = next((t for t in (field.annotation, *inner) if isinstance(t, type) and issubclass(t, Frozen)), None)
        if model is None:
            return []
    return list(model.model_fields)


def _read_requirements(root: Path, relative: str, where: PathKey, source: SourceMap) -> tuple[list[TeamRequirement], str, list[Finding]]:
    path = root / relative
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return [], "", [_finding(source, where, f"cannot read {relative}: {exc.strerror or exc}")]
    found, problems = [], []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        at = Location(path, number, 1)
        if line.startswith("-"):
            problems.append(Finding(at, relative, f"{line!r}: options in a requirements file are not taken (indexes come from the base)"))
            continue
        try:
            _requirement(line)
        except ValueError as exc:
            problems.append(Finding(at, relative, str(exc)))
            continue
        found.append(TeamRequirement(line, f"{relative}:{number}"))
    return found, text, problems


def load_team(path: Path, loaded: LoadedMatrix | None = None) -> LoadedTeam:
    """Read and validate the team file; with the matrix, also that its base exists there."""
    try:
        if path.stat().st_size > MAX_TEAM_FILE:
            raise TeamFileError([Finding(Location(path), "<document>", f"refused: over {MAX_TEAM_FILE} bytes")])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TeamFileError([Finding(Location(path), "<document>", f"no such file: write {TEAM_FILE} (docs/team-images.md)")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TeamFileError([Finding(Location(path), "<document>", f"cannot read: {exc}")]) from None
    try:
        data, source, findings = load_yaml(text, path)
    except YamlSourceError as exc:
        raise TeamFileError(exc.findings) from None
    try:
        spec = TeamSpec.model_validate(data)
    except ValidationError as exc:
        raise TeamFileError(findings + _pydantic_findings(exc, source)) from None
    root = path.resolve().parent
    requirements = [TeamRequirement(line, f"{path.name}:{source.locate(('packages', i)).line}") for i, line in enumerate(spec.packages)]
    texts = []
    for index, relative in enumerate(spec.requirements):
        found, req_text, problems = _read_requirements(root, relative, ("requirements", index), source)
        requirements += found
        findings += problems
        texts.append((relative, req_text))
    for index, copy in enumerate(spec.files):
        if not (root / copy.src).exists():
            findings.append(_finding(source, ("files", index, "src"), f"{copy.src} does not exist in {root}"))
    seen: dict[str, str] = {}
    for requirement in requirements:
        if requirement.key in seen:
            findings.append(
                Finding(Location(path), "packages", f"{requirement.key} is required twice ({seen[requirement.key]}, {requirement.where})")
            )
        seen.setdefault(requirement.key, requirement.where)
    if len(set(spec.arches)) != len(spec.arches):
        findings.append(_finding(source, ("arches",), f"an arch is named twice: {', '.join(spec.arches)}"))
    if loaded is not None:
        findings += _check_base(spec, source, loaded)
    if findings:
        raise TeamFileError(findings)
    return LoadedTeam(spec, path, source, text, tuple(requirements), tuple(texts))


def _check_base(spec: TeamSpec, source: SourceMap, loaded: LoadedMatrix) -> list[Finding]:
    stacks, skus = loaded.matrix.stacks, loaded.matrix.skus
    base = spec.base
    if base.stack is None or base.sku is None:  # a published image: what it is comes from the image itself
        return []
    if base.stack not in stacks:
        return [_finding(source, ("base", "stack"), f"unknown stack {base.stack!r}", hint=", ".join(stacks))]
    stack = stacks[base.stack]
    findings = [
        _finding(source, ("arches", i), f"stack {base.stack} is not built for {arch}", hint=", ".join(stack.arches))
        for i, arch in enumerate(spec.arches)
        if arch not in stack.arches
    ]
    if base.sku not in stack.skus:
        known = "unknown SKU" if base.sku not in skus else f"stack {base.stack} is not built for SKU"
        findings.append(_finding(source, ("base", "sku"), f"{known} {base.sku!r}", hint=", ".join(stack.skus)))
    if spec.framework is not None and spec.framework.replaces != stack.framework:
        findings.append(
            _finding(
                source,
                ("framework", "replaces"),
                f"the base's framework is {stack.framework}, not {spec.framework.replaces}",
                hint=stack.framework,
            )
        )
    return findings
