"""The resolved image plan: for one (stack, chip, OS, arch), everything later stages read.

Computed once from the matrix: the ordered install layers with their pins and lock sections, the
git checkouts, the base image, tags, labels and the versions verification expects. lock, render,
wheelhouse, build, verify, smoke and k8s take this value; none of them re-derives any of it.

Tag grammar (one place, so tags are consistent by construction):
    <repo>:verl<verl>-cann<cann>-torch_npu<torch_npu>-<chip>-<os>-py<python>   (full, immutable)
    <repo>:<stack>-<chip>[-<os>]                                            (stack alias)
    <repo>:latest-<chip>                                                    (default stack only)
"""

from __future__ import annotations

from dataclasses import dataclass

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, resolve_hw, resolve_stack
from buildkit.matrix.model import Arch, Chip, Matrix, PypiPin, Stack

LABEL_PREFIX = "io.ascendkit"
PRIMARY_INDEX = "pypi"  # read by pip from PIP_INDEX_URL; every other index is an extra one
BUILD_LAYER = "build"  # lock section of the source builds' build requirements
GIT_LAYER = "git"  # lock section of the PyPI pins installed with the git checkouts
VERL_LAYER = "verl"
LOCKS_DIR = "locks"  # relative to the matrix's directory, and to the build context
# Where things live in the image (the Dockerfile, its scripts and doctor agree on these).
ENTRYPOINT = "/usr/local/bin/ascendkit-entrypoint"
CONSTRAINTS_FILE = "/etc/ascendkit/constraints.txt"
IMAGE_LOCKS_DIR = "/etc/ascendkit/locks"


@dataclass(frozen=True)
class RenderTarget:
    """One Dockerfile: a stack, the chip it is built for, and the OS of the base image."""

    stack_id: str
    chip_id: str
    os_name: str

    @property
    def filename(self) -> str:
        return f"Dockerfile.{self.chip_id}-{self.os_name}"


@dataclass(frozen=True)
class Pin:
    dist: str  # distribution name as pip spells it
    version: str
    from_source: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class Layer:
    """One pip layer of the image: its lock section, the pins it installs, and how pip is called."""

    name: str  # the lock section this layer installs
    title: str
    pins: tuple[Pin, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables for the pip call only
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    soc_arg: bool = False  # declare the SOC_VERSION build ARG right before this layer
    launcher: str = ""  # command that runs pip (the entrypoint, when CANN's environment is needed)

    @property
    def no_binary(self) -> str:
        return ",".join(p.dist for p in self.pins if p.from_source)


@dataclass(frozen=True)
class GitCheckout:
    name: str
    url_arg: str
    path: str
    ref: str
    install: str  # "pip" or "pythonpath"

    @property
    def directory(self) -> str:
        base = self.path.rsplit("/", 1)[-1].removesuffix(".git")
        return f"/opt/{base}" if self.install == "pythonpath" else f"/tmp/{base}"


@dataclass(frozen=True)
class StackLayers:
    """A stack's pip layers in build order, least volatile first (verl last: a bump rebuilds one)."""

    head: tuple[Layer, ...]  # before the git checkouts
    git: Layer | None  # the PyPI pins that ride with the checkouts
    tail: tuple[Layer, ...]
    verl: Layer

    @property
    def all(self) -> tuple[Layer, ...]:
        return (*self.head, *((self.git,) if self.git else ()), *self.tail, self.verl)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.all)


def dist_name(component: str) -> str:
    return component.replace("_", "-")


def pin_of(stack: Stack, component: str) -> Pin:
    pin: PypiPin | None = stack.pins().get(component)
    assert pin is not None, component
    return Pin(pin.package or dist_name(component), pin.version, pin.build_from_source)


def expected_packages(stack: Stack) -> dict[str, str]:
    """Distribution name -> exact version for every PyPI-style pin (what verification checks)."""
    return {pin_of(stack, c).dist: pin_of(stack, c).version for c in stack.pins()}


def stack_layers(stack: Stack) -> StackLayers:
    """The one derivation of a stack's install layers (what lock splits by and render lays out)."""
    head = [
        Layer(
            "torch",
            "torch, torch_npu and torchvision (pinned together: a loose torchvision replaces torch)",
            (pin_of(stack, "torch"), pin_of(stack, "torchvision"), pin_of(stack, "torch_npu")),
        )
    ]
    after_vllm: tuple[str, ...] = ()
    if stack.triton_ascend is not None:
        triton = pin_of(stack, "triton_ascend")
        head.append(
            Layer(
                "triton-ascend",
                "triton-ascend (the CUDA triton shares its import name and must go first)",
                (triton,),
                before=(f"python3 -m pip uninstall -y triton {triton.dist}",),
            )
        )
        # If vllm's requirements dragged the CUDA triton back in, it overwrote triton-ascend's files.
        after_vllm = (
            "if python3 -m pip show triton >/dev/null 2>&1; then "
            "python3 -m pip uninstall -y triton; "
            f"python3 -m pip install --no-cache-dir --no-deps --force-reinstall {triton.requirement}; fi",
        )
    if any(pin.build_from_source for pin in stack.pins().values()):
        head.append(
            Layer(
                BUILD_LAYER,
                "what the source builds below need (their build-system requires, from the lock), so\n"
                "#    they build without isolation against the torch installed above",
            )
        )
    head.append(
        Layer(
            "vllm",
            "vllm from source with no device target: vllm-ascend supplies the NPU platform",
            (pin_of(stack, "vllm"),),
            env=(("VLLM_TARGET_DEVICE", "empty"),),
            after=after_vllm,
        )
    )
    head.append(
        Layer(
            "vllm-ascend",
            "vllm-ascend with its custom kernels compiled against CANN for ${SOC_VERSION}",
            (pin_of(stack, "vllm_ascend"),),
            env=(("COMPILE_CUSTOM_KERNELS", "1"), ("SOC_VERSION", '"${SOC_VERSION}"')),
            # Through the entrypoint: the same sourcing of set_env.sh (with the ATB ABI) as at run time.
            launcher=ENTRYPOINT,
            soc_arg=True,
        )
    )
    git = None
    tail = []
    if stack.git_pins():
        mbridge = (pin_of(stack, "mbridge"),) if stack.mbridge is not None else ()  # mbridge rides with MindSpeed
        git = Layer(GIT_LAYER, "git checkouts", mbridge)
    elif stack.mbridge is not None:
        tail.append(Layer("mbridge", "mbridge", (pin_of(stack, "mbridge"),)))
    tail.append(Layer("transformers", "transformers", (pin_of(stack, "transformers"),)))
    verl = Layer(VERL_LAYER, "verl (the most volatile layer: bumping verl rebuilds only this)", (pin_of(stack, "verl"),))
    return StackLayers(tuple(head), git, tuple(tail), verl)


def lock_path(stack_id: str, arch: str) -> str:
    """A lock's path relative to the matrix's directory."""
    return f"{LOCKS_DIR}/{stack_id}-{arch}.txt"


def section_path(stack_id: str, layer: str, arch: str) -> str:
    """One layer's part of a lock, relative to the matrix's directory (and the build context).

    Each pip layer COPYs only its own section right before it runs, so a lock change rebuilds the
    layers whose packages changed and those after them, nothing earlier (bumping verl: one layer)."""
    return f"{LOCKS_DIR}/{stack_id}/{layer}-{arch}.txt"


def base_image_tag(matrix: Matrix, stack: Stack, chip_id: str, os_name: str) -> str:
    """The official CANN image tag for a stack, chip and OS (the grammar lives in the matrix)."""
    return matrix.base_image.tag.format(cann=stack.cann.lower(), chip=matrix.chips[chip_id].cann_chip, os=os_name, python=stack.python)


def base_image_ref(matrix: Matrix, stack: Stack, chip_id: str, os_name: str, registry: str | None = None) -> str:
    base = matrix.base_image
    return f"{registry or base.registry}/{base.repository}:{base_image_tag(matrix, stack, chip_id, os_name)}"


def full_tag(stack: Stack, chip_id: str, os_name: str) -> str:
    return f"verl{stack.verl.version}-cann{stack.cann.lower()}-torch_npu{stack.torch_npu.version}-{chip_id}-{os_name}-py{stack.python}"


def arch_tag(tag: str, arch: str) -> str:
    """What ``ascendkit build`` tags locally: every tag above, per architecture."""
    return f"{tag}-{arch}"


def alias_tags(stack_id: str, stack: Stack, chip_id: str, os_name: str) -> list[str]:
    """Moving aliases for a built image; the first OS of a stack also gets the short forms."""
    tags = [f"{stack_id}-{chip_id}-{os_name}"]
    if os_name == stack.os[0]:
        tags.append(f"{stack_id}-{chip_id}")
        if stack.default:
            tags.append(f"latest-{chip_id}")
    return tags


def stack_skus_on_chip(loaded: LoadedMatrix, stack: Stack, chip_id: str) -> list[str]:
    return [s for s in stack.skus if loaded.matrix.skus[s].chip == chip_id]


def _labels(target: RenderTarget, stack: Stack, chip: Chip, skus: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Image labels; ${BASE_IMAGE} and ${SOC_VERSION} are filled by the build's arguments."""
    labels: list[tuple[str, str]] = [
        ("org.opencontainers.image.title", f"ascendkit verl {target.stack_id} {target.chip_id}"),
        (
            "org.opencontainers.image.description",
            f"verl {stack.verl.version} for {chip.name}: CANN {stack.cann}, torch_npu {stack.torch_npu.version}, "
            f"vllm-ascend {stack.vllm_ascend.version}, Python {stack.python}",
        ),
        ("org.opencontainers.image.vendor", "ascendkit"),
        ("org.opencontainers.image.version", full_tag(stack, target.chip_id, target.os_name)),
        ("org.opencontainers.image.base.name", "${BASE_IMAGE}"),
        (f"{LABEL_PREFIX}.stack", target.stack_id),
        (f"{LABEL_PREFIX}.chip", target.chip_id),
        (f"{LABEL_PREFIX}.skus", ",".join(skus)),
        (f"{LABEL_PREFIX}.os", target.os_name),
        (f"{LABEL_PREFIX}.arches", ",".join(stack.arches)),
        (f"{LABEL_PREFIX}.soc-version", "${SOC_VERSION}"),
        (f"{LABEL_PREFIX}.atb-cxx-abi", str(stack.atb_cxx_abi)),
        (f"{LABEL_PREFIX}.version.cann", stack.cann),
        (f"{LABEL_PREFIX}.version.python", stack.python),
    ]
    for component, pin in stack.pins().items():
        labels.append((f"{LABEL_PREFIX}.version.{dist_name(component)}", pin.version))
    for component, git in stack.git_pins().items():
        labels.append((f"{LABEL_PREFIX}.version.{dist_name(component)}", git.ref))
    return tuple(labels)


@dataclass(frozen=True)
class ImagePlan:
    """Everything about one image that follows from the matrix alone (no engine, no network).

    The Dockerfile is the same for every arch of a (stack, chip, OS); the arch picks the lock
    whose hashes are enforced and the tags."""

    target: RenderTarget
    arch: Arch
    stack: Stack
    chip: Chip
    skus: tuple[str, ...]  # the stack's SKUs on this chip
    base_registry: str  # of the official CANN base, from the matrix
    base_repository: str
    base_image_tag: str
    base_mirrors: tuple[str, ...]  # mirror repositories of the CANN base, as the matrix lists them
    layers: StackLayers
    git_checkouts: tuple[GitCheckout, ...]
    labels: tuple[tuple[str, str], ...]
    expected_packages: tuple[tuple[str, str], ...]
    full_tag: str
    alias_tags: tuple[str, ...]

    @property
    def stack_id(self) -> str:
        return self.target.stack_id

    @property
    def chip_id(self) -> str:
        return self.target.chip_id

    @property
    def os_name(self) -> str:
        return self.target.os_name

    @property
    def base_image(self) -> str:
        """The official CANN base this image is built on."""
        return self.base_image_at(None)

    def base_image_at(self, registry: str | None) -> str:
        """The CANN base as ``registry`` (a mirror of the official one) serves it."""
        return f"{registry or self.base_registry}/{self.base_repository}:{self.base_image_tag}"

    @property
    def tags(self) -> tuple[str, ...]:
        """What ``ascendkit build`` tags this arch's image with."""
        return tuple(arch_tag(name, self.arch) for name in (self.full_tag, *self.alias_tags))

    @property
    def lock_path(self) -> str:
        return lock_path(self.stack_id, self.arch)

    def lock_sections(self, arch: str | None = None) -> tuple[tuple[str, str], ...]:
        """(layer, section path) in build order, for ``arch`` (default: this plan's)."""
        return tuple((name, section_path(self.stack_id, name, arch or self.arch)) for name in self.layers.names)

    def labels_for(self, base_image: str) -> tuple[tuple[str, str], ...]:
        """The labels as the image carries them when built on ``base_image``."""
        substitutions = {"${BASE_IMAGE}": base_image, "${SOC_VERSION}": self.chip.soc_version}
        return tuple((k, substitutions.get(v, v)) for k, v in self.labels)


def plan_target(loaded: LoadedMatrix, hw: str, stack_name: str | None, os_name: str | None) -> RenderTarget:
    """Check that ``--hw``/``--stack``/``--os`` name a Dockerfile the matrix supports."""
    stack_id, stack = resolve_stack(loaded, stack_name)
    target = resolve_hw(loaded, hw)
    if target.sku_id is not None and target.sku_id not in stack.skus:
        raise InputError(f"stack {stack_id!r} does not support SKU {target.sku_id!r}; it supports: {', '.join(stack.skus)}")
    if not stack_skus_on_chip(loaded, stack, target.chip_id):
        raise InputError(f"stack {stack_id!r} has no SKU on chip {target.chip_id!r}; it supports: {', '.join(stack.skus)}")
    chosen_os = os_name or stack.os[0]
    if chosen_os not in stack.os:
        raise InputError(f"stack {stack_id!r} is not built on --os {chosen_os!r}; choose one of: {', '.join(stack.os)}")
    return RenderTarget(stack_id, target.chip_id, chosen_os)


def hosts_arch(loaded: LoadedMatrix, hw: str) -> Arch:
    """The CPU architecture of the hosts ``--hw`` names (the default --arch: images run there)."""
    arches = sorted({sku.host_arch for sku in resolve_hw(loaded, hw).skus(loaded).values()})
    if len(arches) != 1:
        raise InputError(f"the SKUs of --hw {hw} run on {' and '.join(arches) or 'no'} hosts; give --arch")
    return arches[0]


def all_targets(loaded: LoadedMatrix) -> list[RenderTarget]:
    targets = []
    for stack_id, stack in loaded.matrix.stacks.items():
        chips = sorted({loaded.matrix.skus[s].chip for s in stack.skus})
        targets += [RenderTarget(stack_id, chip, os_name) for chip in chips for os_name in stack.os]
    return targets


def plan_image(loaded: LoadedMatrix, target: RenderTarget, arch: str | None = None) -> ImagePlan:
    """The plan of one image; ``arch`` must be one of the stack's (default: its first)."""
    matrix = loaded.matrix
    stack = matrix.stacks[target.stack_id]
    chosen = arch or stack.arches[0]
    if chosen not in stack.arches:
        raise InputError(f"stack {target.stack_id!r} is not built for --arch {chosen!r}; choose one of: {', '.join(stack.arches)}")
    chip = matrix.chips[target.chip_id]
    skus = tuple(stack_skus_on_chip(loaded, stack, target.chip_id))
    checkouts = tuple(
        GitCheckout(
            dist_name(component), matrix.git_hosts[matrix.repos[git.repo].host].arg, matrix.repos[git.repo].path, git.ref, git.install
        )
        for component, git in stack.git_pins().items()
    )
    return ImagePlan(
        target=target,
        arch=chosen,  # narrowed to Arch by the membership check above
        stack=stack,
        chip=chip,
        skus=skus,
        base_registry=matrix.base_image.registry,
        base_repository=matrix.base_image.repository,
        base_image_tag=base_image_tag(matrix, stack, target.chip_id, target.os_name),
        base_mirrors=tuple(f"{m}/{matrix.base_image.repository}" for m in matrix.base_image.mirrors.values()),
        layers=stack_layers(stack),
        git_checkouts=checkouts,
        labels=_labels(target, stack, chip, skus),
        expected_packages=tuple(sorted(expected_packages(stack).items())),
        full_tag=full_tag(stack, target.chip_id, target.os_name),
        alias_tags=tuple(alias_tags(target.stack_id, stack, target.chip_id, target.os_name)),
    )
