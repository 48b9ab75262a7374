"""The pins of what is not a plain index release: a framework built from a git checkout, wheels from
a release archive, and lines patched out of installed distributions (see :mod:`model`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr

from buildkit.matrix.fields import COMMIT_ID, Frozen, Identifier, PackageName, PackageVersion, RelativePath

Sha256 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


class WheelArchive(Frozen):
    """Wheels published only inside a release archive on a git host (sgl-kernel-npu's zips), one
    archive per chip and arch: fetched through the host's ARG (a mirror), checked against its
    sha256, and its wheels installed in order. Without a sha256 for every archive the stack's locks
    stay unresolved and say why: nothing unverified is installed as if it were locked."""

    repo: Identifier = Field(description="key of repos: the archives are its release assets (<host>/<path>/releases/download/<release>/)")
    release: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    file: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9{}._-]+\.zip$")] = Field(
        description="the archive's file name, with {chip} (a name of `chips`) and {arch} (aarch64, x86_64)"
    )
    chips: dict[Identifier, Annotated[StrictStr, Field(pattern=r"^[a-z0-9]+$")]] = Field(
        min_length=1, description="chip id -> the chip's name in the archive's file name"
    )
    wheels: tuple[PackageName, ...] = Field(min_length=1, description="the distributions the archive holds, installed in this order")
    sha256: dict[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._-]+\.zip$")], Sha256] = Field(
        default={}, description="archive file name -> its sha256; one missing leaves the stack's locks unresolved"
    )
    source: StrictStr = Field(min_length=1, description="where the release, its file names and its wheels are documented")

    def filename(self, chip: str, arch: str) -> str:
        return self.file.format(chip=self.chips[chip], arch=arch)

    def release_path(self, repo_path: str) -> str:
        """Where the release's assets are on the git host, below its URL: <owner>/<name>/releases/download/<release>."""
        return f"{repo_path.removesuffix('.git')}/releases/download/{self.release}"


class FrameworkSource(Frozen):
    """An RL framework installed from a git checkout at one commit (its NPU port lives in a fork, not
    on PyPI): the checkout is built with ``install_env``, its requirements file is locked like every
    other layer, and the image is checked to hold exactly that commit and ``version``."""

    repo: Identifier = Field(description="key of repos")
    ref: Annotated[StrictStr, Field(pattern=COMMIT_ID)] = Field(description="the full commit id (40 hex digits): a source pin cannot move")
    version: PackageVersion = Field(description="the version the checkout installs as (its own version file): verified in the image")
    requirements: RelativePath = Field(description="the requirements file its setup.py installs with install_env (what the lock resolves)")
    install_env: dict[Annotated[StrictStr, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")], StrictStr] = Field(
        default={}, description="environment of the checkout's install, e.g. TARGET_DEVICE: NPU"
    )
    leaves_out: tuple[PackageName, ...] = Field(
        default=(), description="packages the NPU install drops (CUDA-only): the lock fails when anything pulls one in"
    )


class SourcePatch(Frozen):
    """One line of an installed distribution commented out after it is installed, in the open: the
    build fails when the line is not there exactly once, and verification checks it stayed out."""

    package: PackageName = Field(description="the installed distribution (a pin of the stack) whose file is changed")
    file: RelativePath = Field(description="the file, relative to the distribution's root in site-packages")
    comment_out: StrictStr = Field(min_length=1, description="the line as it stands in the file (surrounding whitespace ignored)")
    reason: StrictStr = Field(min_length=1, description="why, with its source: shown in the Dockerfile and the SBOM")


# What a stack is compared on with the upstream images it corresponds to (buildkit.matrix.parity).
ParityComponent = Literal[
    "cann",
    "python",
    "os",
    "chip",
    "torch",
    "torch_npu",
    "torchvision",
    "triton_ascend",
    "vllm",
    "vllm_ascend",
    "sglang",
    "transformers",
    "mindspeed",
    "megatron_lm",
    "mbridge",
    "verl",
]


class UpstreamImages(Frozen):
    """The upstream images a stack stands for (verl's Ascend images, or vllm-ascend's own, as their Dockerfiles build
    them), why the stack differs from them where it does, and which pins no primary source confirms: the parity
    page and its test hold every other component of the stack to what those Dockerfiles install."""

    images: tuple[RelativePath, ...] = Field(
        min_length=1,
        description="vendored Dockerfiles under upstream/ (upstream/SOURCES.json), e.g. verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0",
    )
    differences: dict[ParityComponent, StrictStr] = Field(
        default={},
        description="component -> why the stack differs from these images there (each difference needs one; a stale one is refused)",
    )
    unconfirmed: dict[ParityComponent, StrictStr] = Field(
        default={},
        description=(
            "component -> why its pin could not be confirmed from a primary source, and the evidence that was read: shown by "
            "`matrix show` and the parity page beside the pin (one naming a component the stack does not pin is refused)"
        ),
    )
