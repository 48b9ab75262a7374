"""What an upstream Ascend Dockerfile installs, read the way its shell would run it.

verl keeps the Dockerfiles of its Ascend images in ``docker/ascend/``; vllm-ascend keeps its own. They
are shell, not data: a pin is a ``pip install name==X``, a ``git clone --branch vX`` followed by
``pip install -e .``, a wheel named by an ``ARG``, or a line of a requirements file the clone carries.
:func:`read_dockerfile` walks the ``FROM`` and ``RUN`` instructions in order (later installs win, as they
do in the image), expands ``ARG``/``ENV`` values, follows ``cd`` between clones, and asks ``requirements``
for the files a ``pip install -r`` reads from a clone. It reads what an aarch64 build (the Ascend hosts')
runs: steps under ``if [ "$ARCH" = "x86_64" ]`` are set aside, named in :attr:`UpstreamImage.unmapped`.

Each pin keeps where it was read (file and line), so a comparison or a proposed stack can say why.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from buildkit.matrix.shellwords import commands, expand, logical_lines

PinKind = Literal["version", "spec", "branch", "ref", "commit", "unpinned"]

# Matrix components by the distribution pip installs them as.
COMPONENT_OF_DIST = {
    "torch": "torch",
    "torch-npu": "torch_npu",
    "torchvision": "torchvision",
    "triton-ascend": "triton_ascend",
    "vllm": "vllm",
    "vllm-ascend": "vllm_ascend",
    "sglang": "sglang",
    "transformers": "transformers",
    "mbridge": "mbridge",
    "verl": "verl",
}
# ... and by the repository a clone takes them from (the URL's last part, lower case, no .git).
COMPONENT_OF_REPO = {
    "vllm": "vllm",
    "vllm-ascend": "vllm_ascend",
    "sglang": "sglang",
    "transformers": "transformers",
    "mindspeed": "mindspeed",
    "megatron-lm": "megatron_lm",
    "verl": "verl",
    "sgl-kernel-npu": "sgl_kernel_npu",
}
# Projects whose install declares exactly their requirements file (vllm-ascend's setup.py reads requirements.txt),
# so ``pip install .`` without --no-deps installs it as ``pip install -r`` would.
DECLARED_BY = {"vllm-ascend": "requirements.txt"}
# The CANN base images' chip part (Ascend/cann-container-image) -> the chip ids of the matrix. A daily build's tag puts
# its build time after the release (vllm-ascend 0.30.0rc2: cann:9.2.0_20260930220649-a3-ubuntu22.04-py3.12).
CHIP_OF_CANN = {"910b": "a2", "a3": "a3", "950": "a5"}
_BASE = re.compile(
    r"^(?P<registry>\S+?)/cann:(?P<cann>[0-9]+\.[0-9]+\.[0-9a-z]+)(?:_(?P<daily>[0-9]{14}))?-(?P<chip>[0-9a-z]+)-"
    r"(?P<os>[a-z]+[0-9.]+)-py(?P<python>3\.[0-9]+)$"
)
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_RELEASE_ASSET = re.compile(r"^https?://[^/]+/[^/]+/(?P<repo>[^/]+)/releases/download/(?P<release>[^/]+)/(?P<file>[^/]+\.zip)$")


@dataclass(frozen=True)
class UpstreamPin:
    component: str
    value: str  # a version, a specifier, a git ref or commit; "" when unpinned
    kind: PinKind
    where: str  # "FILE:LINE", or the requirements file and line it came through

    def describe(self) -> str:
        if self.kind == "unpinned":
            return "unpinned"
        if self.kind == "commit":
            return f"commit {self.value[:12]}"
        if self.kind == "branch":
            return f"branch {self.value}"
        return self.value


@dataclass(frozen=True)
class BaseTag:
    registry: str
    cann: str  # as the matrix writes it: 8.3.RC1, 9.0.0
    cann_chip: str
    os: str
    python: str
    daily: str = ""  # a daily build's time stamp (YYYYMMDDhhmmss): a build before the release, not the release

    @property
    def release(self) -> str:
        """The CANN as the parity page shows it: the release, or the release's daily build."""
        return f"{self.cann} (daily build {self.daily})" if self.daily else self.cann

    @property
    def chip(self) -> str | None:
        return CHIP_OF_CANN.get(self.cann_chip)


@dataclass
class UpstreamImage:
    name: str
    base: BaseTag | None = None
    pins: dict[str, UpstreamPin] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)  # steps and pins with no matrix component, each with its line
    archives: dict[str, str] = field(default_factory=dict)  # component -> the release archive it was downloaded as


Requirements = Callable[[str, str, str], "tuple[str, str] | None"]  # (repo, ref, file) -> (label, text)


def cann_of_tag(value: str) -> str:
    """A CANN version as the base tags write it (8.3.rc1) in the matrix's spelling (8.3.RC1)."""
    return re.sub(r"rc([0-9]+)$", r"RC\1", value)


def release_of_branch(ref: str) -> str | None:
    """The version a release branch or tag stands for: release/v0.8.0, releases/v0.23.0, v0.11.0rc1 -> the version."""
    m = re.match(r"^(?:releases?/)?v?([0-9]+(?:\.[0-9]+)+(?:(?:rc|\.post)[0-9]+)?)$", ref)
    return m.group(1) if m else None


@dataclass
class _Clone:
    repo: str
    ref: str  # "" for the default branch


class _Reader:
    def __init__(self, name: str, requirements: Requirements | None, default_ref: str, own_repo: str) -> None:
        self.image = UpstreamImage(name)
        self.requirements = requirements
        self.default_ref = default_ref  # what a clone of the Dockerfile's own repository without --branch gets
        self.own_repo = own_repo  # the repository the Dockerfile belongs to (verl), and COPY . brings in
        self.values: dict[str, str] = {}
        self.clones: dict[str, _Clone] = {}
        self.cwd = ""
        # per open if: True inside a branch an aarch64 build does not take (an x86_64 test), False inside its
        # counterpart, None where the test is not about the arch (both branches are read)
        self.branches: list[bool | None] = []
        self.line = 0

    def where(self) -> str:
        return f"{self.image.name}:{self.line}"

    def pin(self, component: str, value: str, kind: PinKind, where: str | None = None) -> None:
        current = self.image.pins.get(component)
        if kind in ("spec", "unpinned") and current is not None:
            return  # a range or a bare name does not move what an earlier step pinned
        self.image.pins[component] = UpstreamPin(component, value, kind, where or self.where())
        self.image.archives.pop(component, None)

    def instruction(self, lines: list[tuple[int, str]]) -> None:
        self.line = lines[0][0]
        keyword, _, rest = lines[0][1].partition(" ")
        keyword = keyword.upper()
        body = [(lines[0][0], rest), *lines[1:]]
        if keyword == "FROM":
            self.base(expand(rest.split()[0], self.values))
        elif keyword in ("ARG", "ENV"):
            for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S*)", " ".join(f for _, f in body)):
                self.values.setdefault(m.group(1), m.group(2).strip("\"'"))
        elif keyword in ("COPY", "ADD") and rest.split()[:1] == ["."] and len(rest.split()) == 2:
            directory = self.path(rest.split()[1])  # the build context: the Dockerfile's repository, at its ref
            self.clones[directory] = _Clone(self.own_repo, self.default_ref)
            self.cloned(directory)
        elif keyword == "RUN":
            self.cwd = ""
            self.branches = []
            for numbers, words in commands([(number, expand(fragment, self.values)) for number, fragment in body]):
                self.command(words, numbers)

    def base(self, ref: str) -> None:
        m = _BASE.match(ref)
        if m is None:
            self.image.unmapped.append(f"{self.where()}: base image {ref} is not an Ascend CANN image tag")
            return
        self.image.base = BaseTag(m["registry"], cann_of_tag(m["cann"]), m["chip"], m["os"], m["python"], m["daily"] or "")

    def command(self, words: list[str], numbers: list[int]) -> None:
        self.line = numbers[0]
        head = words[0]
        if head in ("if", "elif"):  # a branch an aarch64 build skips: one that tests for x86_64
            test = " ".join(words[1:])
            x86 = True if "x86_64" in test else False if "aarch64" in test else None
            if head == "if":
                self.branches.append(x86)
            elif self.branches:
                self.branches[-1] = x86
            return
        if head == "fi":
            if self.branches:
                self.branches.pop()
            return
        if head == "else" and self.branches and self.branches[-1] is not None:
            self.branches[-1] = not self.branches[-1]
        while words and (words[0] in ("then", "else", "do", "done") or ("=" in words[0] and len(words) > 1)):
            words, numbers = words[1:], numbers[1:]  # the command after a keyword or VAR=value assignments
        if not words:
            return
        head, self.line = words[0], numbers[0]
        installs = (head in ("pip", "pip3") and words[1:2] == ["install"]) or (head == "git" and words[1:2] == ["clone"])
        if any(b is True for b in self.branches):
            if installs:
                self.image.unmapped.append(f"{self.where()}: x86_64 only, not read: {' '.join(words)}")
            return
        if head == "cd" and len(words) > 1:
            self.cwd = self.path(words[1])
        elif head == "git" and len(words) > 1:
            self.git(words[1:])
        elif head in ("pip", "pip3") and words[1:2] == ["install"]:
            self.pip(words[2:])
        elif head in ("python", "python3") and words[1:4] == ["-m", "pip", "install"]:
            self.pip(words[4:])
        elif head in ("wget", "curl"):
            self.download(words[1:])

    def download(self, args: list[str]) -> None:
        """A release archive of a component's repository (sgl-kernel-npu's kernels): its release is the pin."""
        for arg in args:
            m = _RELEASE_ASSET.match(arg)
            if m is not None and (component := COMPONENT_OF_REPO.get(m["repo"].lower())) is not None:
                self.pin(component, m["release"], "ref")
                self.image.archives[component] = m["file"]

    def git(self, args: list[str]) -> None:
        if args[0] == "clone":
            ref, positional, i = "", [], 1
            while i < len(args):
                if args[i] in ("--branch", "-b"):
                    ref, i = args[i + 1], i + 2
                    continue
                if args[i] == "--depth":
                    i += 2
                    continue
                if not args[i].startswith("-"):
                    positional.append(args[i])
                i += 1
            if not positional:
                return
            repo = positional[0].rstrip("/").removesuffix(".git").rsplit("/", 1)[-1]
            directory = self.path(positional[1] if len(positional) > 1 else repo)
            self.clones[directory] = _Clone(repo.lower(), ref or (self.default_ref if repo.lower() == self.own_repo else ""))
            self.cloned(directory)
        elif args[0] == "checkout" and len(args) > 1 and self.cwd in self.clones:
            clone = self.clones[self.cwd]
            own = clone.repo == self.own_repo and args[-1] in ("main", "master")  # the repository's default branch, as of the Dockerfile
            clone.ref = self.default_ref if own else args[-1]
            self.cloned(self.cwd)

    def path(self, given: str) -> str:
        """A path as the build sees it, relative to / (a Dockerfile's working directory is / unless WORKDIR says)."""
        return posixpath.normpath(posixpath.join("/", self.cwd, given)).lstrip("/")

    def cloned(self, directory: str) -> None:
        clone = self.clones[directory]
        component = COMPONENT_OF_REPO.get(clone.repo)
        if component is None:
            self.image.unmapped.append(f"{self.where()}: git clone of {clone.repo} ({clone.ref or 'default branch'}): no matrix component")
            return
        self.image.pins.pop(component, None)
        self.pin(component, *_ref_pin(component, clone.ref))

    def pip(self, args: list[str]) -> None:
        deps = "--no-deps" not in args
        i = 0
        while i < len(args):
            arg = args[i]
            if arg in ("-r", "--requirement"):
                self.requirements_file(args[i + 1])
                i += 2
            elif arg in ("-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-f", "--find-links"):
                i += 2
            elif arg in ("-e", "--editable"):  # an editable install names a local path (or a VCS URL)
                self.package(args[i + 1], deps, editable=True)
                i += 2
            elif arg.startswith("-e") and len(arg) > 2:  # -e. is -e .
                self.package(arg[2:], deps, editable=True)
                i += 1
            elif arg.startswith("-"):
                i += 1
            else:
                self.package(arg, deps)
                i += 1

    def clone_at(self, directory: str) -> str | None:
        """The clone a local path installs from: the clone directory that holds it."""
        path = self.path(directory)
        for name in self.clones:
            if path == name or path.startswith(name + "/"):
                return name
        return None

    def package(self, arg: str, deps: bool = True, editable: bool = False) -> None:
        if arg.startswith("git+"):
            url, _, ref = arg[4:].partition("@")
            repo = url.removesuffix(".git").rsplit("/", 1)[-1].lower()
            component = COMPONENT_OF_REPO.get(repo)
            if component is None:
                self.image.unmapped.append(f"{self.where()}: {arg}: no matrix component")
            else:
                self.pin(component, *_ref_pin(component, ref))
            return
        directory = arg.split("[", 1)[0]
        if editable or directory.startswith((".", "/")) or ("/" in directory and "://" not in directory and not arg.endswith(".whl")):
            local = self.clone_at(directory)  # pip's rule: a path when editable, or when it looks like one
            clone = self.clones.get(local) if local is not None else None
            if clone is not None and (component := COMPONENT_OF_REPO.get(clone.repo)) is not None:
                self.image.pins.pop(component, None)
                self.pin(component, *_ref_pin(component, clone.ref))
                declared = DECLARED_BY.get(clone.repo)
                if deps and declared is not None:  # pip installs what the project declares with it
                    self.requirements_file(declared, local)
            return
        if arg.endswith(".whl"):
            m = re.match(r"^(?:.*/)?([A-Za-z0-9_.]+?)-([0-9][^-]*)-", arg)
            if m and (component := COMPONENT_OF_DIST.get(canonicalize_name(m.group(1)))) is not None:
                self.pin(component, m.group(2), "version")
            elif "*" not in arg:
                self.image.unmapped.append(f"{self.where()}: wheel {arg}: no matrix component")
            return
        self.requirement(arg, self.where())

    def requirement(self, text: str, where: str) -> None:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            return
        component = COMPONENT_OF_DIST.get(canonicalize_name(req.name))
        specs = list(req.specifier)
        if component is None:
            if specs and any(s.operator == "==" for s in specs):
                self.image.unmapped.append(f"{where}: {text}: no matrix component")
            return
        if len(specs) == 1 and specs[0].operator in ("==", "==="):
            self.pin(component, specs[0].version, "version", where)
        elif specs:
            self.pin(component, str(req.specifier), "spec", where)
        else:
            self.pin(component, "", "unpinned", where)

    def requirements_file(self, name: str, directory: str | None = None) -> None:
        clone = self.clones.get(self.cwd if directory is None else directory)
        label = f"{self.where()}: pip install -r {name}"
        if clone is None or self.requirements is None:
            self.image.unmapped.append(f"{label} outside a clone it can read")
            return
        found = self.requirements(clone.repo, clone.ref, name)
        if found is None:
            self.image.unmapped.append(f"{label} of {clone.repo} {clone.ref or 'default branch'}: not vendored, not read")
            return
        source, text = found
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                self.requirement(line, f"{source}:{number}")


def _ref_pin(component: str, ref: str) -> tuple[str, PinKind]:
    if component in ("mindspeed", "megatron_lm", "sgl_kernel_npu"):
        return (ref, "commit" if _COMMIT.match(ref) else "ref") if ref else ("", "unpinned")
    if not ref or ref in ("main", "master"):
        return "", "unpinned"
    if _COMMIT.match(ref):
        return ref, "commit"
    release = release_of_branch(ref)
    if release is None:
        return ref, "ref"
    return (release, "branch") if "/" in ref else (release, "version")


def read_dockerfile(
    name: str, text: str, requirements: Requirements | None = None, default_ref: str = "", own_repo: str = "verl"
) -> UpstreamImage:
    """What the Dockerfile ``name`` installs on aarch64. ``own_repo`` is the repository it belongs to (its build
    context); ``default_ref`` is that repository's branch the Dockerfile comes from, which a clone of it without
    ``--branch`` (or ``COPY .``) gets."""
    reader = _Reader(name, requirements, default_ref, own_repo)
    for lines in logical_lines(text):
        reader.instruction(lines)
    return reader.image
