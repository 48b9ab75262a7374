"""The typed shape of ``compat_matrix.yaml``: frozen pydantic models that reject unknown keys.

Structure only lives here (types, patterns, required fields). Cross-field compatibility rules are
in :mod:`buildkit.matrix.rules`, each written once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, StrictStr, Tag

from buildkit.arch import Arch
from buildkit.matrix.compat import CannDrivers, Compat, KnownIssue, OpenRlhfLine
from buildkit.matrix.fields import (
    ArgName,
    CannVersion,
    Frozen,
    HttpUrl,
    Identifier,
    ModuleName,
    OsName,
    PackageName,
    PackageVersion,
    PythonVersion,
    RelativePath,
    VersionSpecifier,
    tag_template,
)
from buildkit.matrix.sources import FrameworkSource, SourcePatch, UpstreamImages, WheelArchive

# re-exported: the matrix's models live here
__all__ = [
    "CannDrivers",
    "Compat",
    "FrameworkSource",
    "Frozen",
    "KnownIssue",
    "OpenRlhfLine",
    "SourcePatch",
    "UpstreamImages",
    "WheelArchive",
]


class PackageIndex(Frozen):
    """A pip index (PEP 503 simple API) and the build ARG that redirects it to a mirror."""

    url: HttpUrl
    arg: ArgName


class GitHost(Frozen):
    url: HttpUrl
    arg: ArgName


class GitRepo(Frozen):
    host: Identifier = Field(description="key of git_hosts")
    path: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._/-]+\.git$")]


class BaseImage(Frozen):
    """Where the official CANN base images live, their tag grammar, and known mirrors."""

    registry: Annotated[StrictStr, Field(pattern=r"^[a-z0-9.:-]+(/[a-z0-9._-]+)*$")]
    repository: Annotated[StrictStr, Field(pattern=r"^[a-z0-9._/-]+$")]
    tag: Annotated[StrictStr, AfterValidator(tag_template)]
    mirrors: dict[Identifier, Annotated[StrictStr, Field(pattern=r"^[a-z0-9.:-]+(/[a-z0-9._-]+)*$")]] = Field(default={})


class Chip(Frozen):
    """A chip family; one image per chip serves every SKU built on it."""

    name: StrictStr
    cann_chip: Annotated[StrictStr, Field(pattern=r"^[a-z0-9]+$", description="CANN image tag chip part")]
    soc_version: Annotated[StrictStr, Field(pattern=r"^ascend[0-9a-z_]+$", description="vllm-ascend SOC_VERSION")]
    soc_names: tuple[StrictStr, ...] = Field(min_length=1, description="SoC names torch_npu reports")
    soc_family: Annotated[StrictStr, Field(pattern=r"^Ascend[0-9A-Za-z]+$")] | None = Field(
        default=None,
        description="the prefix every SoC of the family has (Ascend950): doctor accepts an unlisted SoC that starts with it",
    )


# A domain-prefixed extended resource name (huawei.com/Ascend910): what requests/limits accept for devices.
EXTENDED_RESOURCE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class Sku(Frozen):
    """A hardware product customers buy; it runs the image of its chip."""

    product: StrictStr
    chip: Identifier = Field(description="key of chips")
    npus_per_node: StrictInt = Field(gt=0, le=64)
    host_arch: Arch = Field(description="CPU architecture of the SKU's hosts: the default --arch of build and k8s render")
    k8s_accelerator: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")] = Field(
        default="huawei-Ascend910", description="the value of the node label `accelerator` the Ascend device plugin sets on these nodes"
    )
    k8s_accelerator_type: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")]
    k8s_cpu_request: StrictInt = Field(gt=0, le=1024, description="CPU cores a training pod requests on one node")
    k8s_memory_gib_request: StrictInt = Field(gt=0, le=16384, description="memory (GiB) a training pod requests on one node")
    k8s_npu_resource: Annotated[StrictStr, Field(pattern=EXTENDED_RESOURCE, max_length=253)] = Field(
        description="the extended resource the cluster's device plugin advertises the NPUs as: the default of k8s render --npu-resource"
    )
    k8s_ring_controller: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-zA-Z0-9.-]*$")] = Field(
        description="MindCluster's job-kind label value (ring-controller.atlas) for Volcano jobs on these NPUs"
    )
    hccl_topo_file: Annotated[StrictStr, Field(pattern=r"^[a-z0-9_]+\.json$")] | None = Field(
        default=None,
        description="the product's HCCL topology file in the driver's topo/950/ (950: atlas_350_3.json): HCCL_TOPO_FILE_PATH",
    )


class PypiPin(Frozen):
    """An exact pin of a Python package, from an index named in ``indexes``."""

    version: PackageVersion
    package: PackageName | None = Field(default=None, description="distribution to install (default: the component's name, e.g. torch-npu)")
    index: Identifier = "pypi"
    index_by_arch: dict[Arch, Identifier] = Field(default={}, description="per-arch index override")
    build_from_source: StrictBool = Field(default=False, description="install from the sdist (--no-binary)")
    extensions: tuple[ModuleName, ...] = Field(
        default=(),
        description=(
            "compiled extension modules its build must produce (vllm-ascend's custom ops): verification fails, naming "
            "the component, when one is missing or its shared libraries resolve neither in the image nor to the driver"
        ),
    )
    project_file: RelativePath | None = Field(
        default=None,
        description=(
            "a file of the sdist that is its pyproject.toml for this build (SGLang's NPU project, pyproject_npu.toml): "
            "the lock reads the requirements from it and the image builds the sdist with it in place"
        ),
    )
    extras: tuple[Identifier, ...] = Field(default=(), description="extras of the project file installed with it (SGLang: srt_npu)")
    imports: tuple[Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")], ...] = Field(
        default=(),
        description="modules verification imports in the image (a tool's own): it fails, naming the component, when one does not",
    )

    def index_for(self, arch: Arch) -> str:
        return self.index_by_arch.get(arch, self.index)

    def dist(self, component: str) -> str:
        """The distribution this pin installs: its ``package``, else the component's name as pip spells it."""
        return self.package or component.replace("_", "-")


class GitPin(Frozen):
    """A component installed from a git repository at a tag, branch or commit."""

    repo: Identifier = Field(description="key of repos")
    ref: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
    install: Literal["pip", "pythonpath"] = Field(
        default="pip", description="pip-install the checkout, or keep it under /opt on PYTHONPATH"
    )


class ImageUser(Frozen):
    """The non-root user every image runs as: numbered like the Ascend driver's own user, so the
    driver files and device nodes a host gives that user are the container's too."""

    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")] = Field(
        default="HwHiAiUser", description="user and group name in the image's passwd and group files"
    )
    uid: StrictInt = Field(default=1000, gt=0, lt=65535, description="its uid (not 0: the image runs as it)")
    gid: StrictInt = Field(default=1000, gt=0, lt=65535, description="its primary group's gid")
    device_gid: StrictInt = Field(
        default=1000,
        gt=0,
        lt=65535,
        description="the group that owns the hosts' /dev/davinci* (k8s pods get it as a supplemental group; smoke reads it from the nodes)",
    )

    @property
    def home(self) -> str:
        return f"/home/{self.name}"


class Installer(Frozen):
    """What installs the locked Python packages of every image."""

    uv: PackageVersion = Field(
        description=(
            "the uv release every locked pip layer installs with; it comes from PyPI by hash as the first "
            "section of each lock, installed by pip (which stays in the image for users)"
        )
    )


def stanza_kind(value: Any) -> str:
    """A framework's stanza is a checkout when it names a repo or ref, else an index pin."""
    if isinstance(value, FrameworkSource) or (isinstance(value, dict) and ("repo" in value or "ref" in value)):
        return "checkout"
    return "index"


# The stanza of a stack's framework, under the framework's name (buildkit/frameworks/<name>/): an
# index release (verl: {version: ...}) or a git checkout (openrlhf: {repo, ref, version, requirements}).
FrameworkStanza = Annotated[Annotated[PypiPin, Tag("index")] | Annotated[FrameworkSource, Tag("checkout")], Discriminator(stanza_kind)]
STANZA_TAGS = ("index", "checkout")  # where a stanza's validation errors say which form they checked


class Stack(Frozen):
    """One release line: every pin of one image, for each OS, arch and SKU it supports. Besides its
    fields, a stack names its framework: one key, the framework's name, holding its stanza (rule
    one-framework checks the name is a plug-in's and the stanza its form)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    __pydantic_extra__: dict[str, FrameworkStanza] = Field(init=False)

    description: StrictStr
    default: StrictBool = False
    cann: CannVersion
    python: PythonVersion
    os: tuple[OsName, ...] = Field(min_length=1)
    arches: tuple[Arch, ...] = Field(min_length=1)
    skus: tuple[Identifier, ...] = Field(min_length=1)
    atb_cxx_abi: Literal[0, 1]
    # The components, each once: a PypiPin or GitPin field is a component, in install order (pins()
    # and git_pins() read them from here, and so do the rules and the lock).
    torch: PypiPin
    torch_npu: PypiPin
    torchvision: PypiPin
    triton_ascend: PypiPin | None = None
    # The rollout engine: vLLM with vllm-ascend, or SGLang with sgl-kernel-npu (rule one-rollout).
    vllm: PypiPin | None = None
    vllm_ascend: PypiPin | None = None
    sglang: PypiPin | None = None
    sgl_kernel_npu: WheelArchive | None = None
    mbridge: PypiPin | None = None
    transformers: PypiPin
    mindspeed: GitPin | None = None
    megatron_lm: GitPin | None = None
    deepspeed: PypiPin | None = None
    ring_attn_ascend: PypiPin | None = None
    # TransferQueue (Ascend/TransferQueue on PyPI): verl 0.9's default trainer (trainer.use_v1) imports it when its
    # task runner starts; verl's wheel declares it only in its verl-core extra.
    transfer_queue: PypiPin | None = None
    # cachetools: verl 0.8's rollout server (verl/workers/rollout/llm_server.py) imports it when the trainer starts; verl's
    # wheel declares it from 0.9 on, vLLM brings it along, SGLang does not (verl's SGLang images install it by hand).
    cachetools: PypiPin | None = None
    # Ascend's accuracy and profiling tools, in one layer after transformers; `ascend_tools: false`
    # leaves them out of the stack's images (their pins stay, for the record).
    msprobe: PypiPin | None = None
    msprof_analyze: PypiPin | None = None
    ais_bench: PypiPin | None = None
    patches: tuple[SourcePatch, ...] = Field(default=(), description="lines commented out of installed distributions, each with its reason")
    constraints: dict[PackageName, VersionSpecifier] = Field(default={})
    constraints_by_arch: dict[Arch, dict[PackageName, VersionSpecifier]] = Field(default={})
    overrides: dict[PackageName, VersionSpecifier] = Field(
        default={},
        description=(
            "requirements that replace what any dependency declares for that package when the lock is resolved "
            "(the layered install lets a later pin win; say why next to each one)"
        ),
    )
    env: dict[Annotated[StrictStr, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")], StrictStr] = Field(default={})
    ascend_tools: StrictBool = Field(default=True, description="false leaves the tools (msprobe, msprof_analyze, ais_bench) out")
    upstream: UpstreamImages | None = Field(
        default=None, description="the upstream images (verl's Ascend Dockerfiles) the stack corresponds to"
    )

    def pins(self) -> dict[str, PypiPin]:
        """The PyPI-style pins by component name, in install order, absent ones left out (and the
        tools, when ``ascend_tools`` is off)."""
        pins = {
            name: pin
            for name in PYPI_COMPONENTS
            if isinstance(pin := getattr(self, name), PypiPin) and (self.ascend_tools or name not in TOOL_COMPONENTS)
        }
        # a framework from the index installs last, in its own layer
        pins.update((name, stanza) for name, stanza in self.frameworks.items() if isinstance(stanza, PypiPin))
        return pins

    @property
    def frameworks(self) -> dict[str, FrameworkSource | PypiPin]:
        """The framework stanzas the stack names, by name (a loaded stack has exactly one)."""
        return dict(self.__pydantic_extra__ or {})

    @property
    def framework(self) -> str:
        """The framework the image is for, by its plug-in's name (names its tags, labels and smoke jobs)."""
        assert len(self.frameworks) == 1, "a loaded stack carries one framework (rule one-framework)"
        return next(iter(self.frameworks))

    @property
    def framework_pin(self) -> PypiPin | None:
        """The framework's index release, when it comes from the index."""
        stanza = next(iter(self.frameworks.values()), None)
        return stanza if isinstance(stanza, PypiPin) else None

    @property
    def framework_source(self) -> FrameworkSource | None:
        """The framework's git checkout, when it is built from one."""
        stanza = next(iter(self.frameworks.values()), None)
        return stanza if isinstance(stanza, FrameworkSource) else None

    @property
    def rollout(self) -> str:
        """``vllm`` or ``sglang``: the engine verl's rollout (and its smoke job) uses in this image."""
        return "sglang" if self.sglang is not None else "vllm"

    @property
    def rollout_title(self) -> str:
        """``vllm-ascend 0.13.0`` or ``SGLang 0.5.10``: the engine as people name it, with its release."""
        if self.sglang is not None:
            return f"SGLang {self.sglang.version}"
        return f"vllm-ascend {self.vllm_ascend.version}" if self.vllm_ascend is not None else "no rollout engine"

    @property
    def rollout_pins(self) -> str:
        """The rollout engine's pins as the tables and overview pages show them."""
        if self.sglang is not None and self.sgl_kernel_npu is not None:
            return f"SGLang {self.sglang.version}, sgl-kernel-npu {self.sgl_kernel_npu.release}"
        if self.vllm is not None and self.vllm_ascend is not None:
            return f"vLLM {self.vllm.version}, vllm-ascend {self.vllm_ascend.version}"
        return "none"

    @property
    def framework_version(self) -> str:
        return self.frameworks[self.framework].version

    def git_pins(self) -> dict[str, GitPin]:
        """The pins built from a git checkout, by component name."""
        return {name: pin for name in GIT_COMPONENTS if isinstance(pin := getattr(self, name), GitPin)}


def _components(kind: type[BaseModel]) -> tuple[str, ...]:
    """The Stack fields that hold a pin of ``kind`` (alone or optional), in declaration order."""
    return tuple(name for name, field in Stack.model_fields.items() if kind in (field.annotation, *get_args(field.annotation)))


PYPI_COMPONENTS = _components(PypiPin)
TOOL_COMPONENTS = ("msprobe", "msprof_analyze", "ais_bench")  # Ascend's tools: one layer, one switch
GIT_COMPONENTS = _components(GitPin)


RunnerLabels = tuple[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")], ...]


class Ci(Frozen):
    """Where the generated CI workflow (.github/workflows/images.yml) runs its jobs."""

    build_runners: dict[Arch, Annotated[RunnerLabels, Field(min_length=1)]] = Field(
        default={"x86_64": ("ubuntu-24.04",), "aarch64": ("ubuntu-24.04-arm",)},
        description="runs-on labels of the build jobs, per arch: a native runner of that arch (no emulation)",
    )
    smoke_runners: dict[Identifier, Annotated[RunnerLabels, Field(min_length=1)]] = Field(
        default={},
        description="runs-on labels of the smoke job per SKU; default [self-hosted, linux, ARM64 or X64, ascend-<sku>]",
    )
    python: PythonVersion = Field(default="3.11", description="the Python the workflow runs ascendkit with")


class Matrix(Frozen):
    """The whole compatibility matrix."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        title="ascendkit compatibility matrix",
        json_schema_extra={"$comment": "generated by `ascendkit matrix schema`"},
    )

    schema_version: Literal[1]
    indexes: dict[Identifier, PackageIndex]
    git_hosts: dict[Identifier, GitHost] = Field(default={})
    repos: dict[Identifier, GitRepo] = Field(default={})
    base_image: BaseImage
    chips: dict[Identifier, Chip] = Field(min_length=1)
    skus: dict[Identifier, Sku] = Field(min_length=1)
    compat: Compat
    installer: Installer
    image_user: ImageUser = ImageUser()
    stacks: dict[Identifier, Stack] = Field(min_length=1)
    ci: Ci = Ci()

    def stack_chips(self, stack: Stack) -> list[str]:
        """The chips of the stack's SKUs (one image each), sorted; SKUs the matrix does not define are skipped."""
        return sorted({self.skus[s].chip for s in stack.skus if s in self.skus})
