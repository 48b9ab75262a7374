"""A stack's pip layers, in build order, with their pins and lock sections: the one derivation of them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from buildkit.framework import title_of
from buildkit.matrix.model import TOOL_COMPONENTS, Installer, PypiPin, SourcePatch, Stack, WheelArchive

LABEL_PREFIX = "io.ascendkit"
# The epoch every image is built and published against: bytecode is hash-based when it is set, and
# publishing clamps every file time and config time later than it (buildkit/ship/layers/normalize.py). A
# fixed point, part of the template's inputs, never the clock: one value for every layer, stack and
# release, so a layer whose own inputs did not change keeps its digest when another layer's did (an
# epoch that moved with the lock or the matrix would re-date, and so re-ship, every layer above the
# base at each release). 2025-01-01T00:00:00Z.
SOURCE_DATE_EPOCH = 1735689600
EPOCH_LABEL = f"{LABEL_PREFIX}.source-date-epoch"
USER_LABEL = f"{LABEL_PREFIX}.user"  # "NAME UID:GID": the user the image runs as (smoke and k8s render read it)
PRIMARY_INDEX = "pypi"  # read by pip from PIP_INDEX_URL; every other index is an extra one
UV_LAYER = "uv"  # lock section of the installer itself, the first layer of every image
INSTALLER_ARG = "ASCENDKIT_INSTALLER"  # build ARG: uv (the default) or pip installs the locked layers
INSTALLERS = ("uv", "pip")
BUILD_LAYER = "build"  # lock section of the source builds' build requirements
GIT_LAYER = "git"  # lock section of the PyPI pins installed with the git checkouts
TOOLS_LAYER = "ascend-tools"
DOCKERFILES_DIR = "dockerfiles"  # every rendered Dockerfile, relative to the matrix's directory
LOCKS_DIR = "locks"  # relative to the matrix's directory, and to the build context
# Where things live in the image (the Dockerfile, its scripts and doctor agree on these).
ENTRYPOINT = "/usr/local/bin/ascendkit-entrypoint"
WORKSPACE = "/workspace"  # the image's WORKDIR, owned by its user: jobs write their outputs here
CONSTRAINTS_FILE = "/etc/ascendkit/constraints.txt"
IMAGE_LOCKS_DIR = "/etc/ascendkit/locks"


@dataclass(frozen=True)
class Pin:
    dist: str  # distribution name as pip spells it
    version: str
    from_source: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class FrameworkCheckout:
    """The framework's git checkout, built in its layer: its section of the lock holds what its
    requirements file needs beyond the earlier layers; the checkout itself installs with no deps."""

    name: str  # its distribution name, and the name the image records the commit under
    repo: str  # key of the matrix's repos (the plan turns it into the host ARG and path)
    commit: str
    version: str
    requirements: str
    install_env: tuple[tuple[str, str], ...]

    @property
    def env_prefix(self) -> str:
        """``TARGET_DEVICE=NPU `` before the command that builds the checkout."""
        return "".join(f"{name}={value} " for name, value in self.install_env)


@dataclass(frozen=True)
class ProjectBuild:
    """A pin built from its sdist with another of the sdist's files as its pyproject.toml (SGLang's
    NPU project): the lock resolved that file's requirements, so the build installs with no deps."""

    dist: str
    version: str
    project_file: str
    extras: tuple[str, ...]


@dataclass(frozen=True)
class ArchiveFetch:
    """Wheels from a release archive on a git host (sgl-kernel-npu): its URL per arch, through the
    host's ARG, and the sha256 each archive must have ("" where none is known)."""

    url_arg: str
    base_path: str  # <repo path>/releases/download/<release>
    files: tuple[tuple[str, str, str], ...]  # (arch, file name, sha256 or "")
    wheels: tuple[str, ...]


@dataclass(frozen=True)
class Layer:
    """One pip layer of the image: its lock section, the pins it installs, and how pip is called."""

    name: str  # the lock section this layer installs
    title: str
    pins: tuple[Pin, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables for the pip call only
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    soc_arg: str = ""  # declare the SOC_VERSION build ARG right before this layer, with this comment
    launcher: str = ""  # command that runs pip (the entrypoint, when CANN's environment is needed)
    patches: tuple[SourcePatch, ...] = ()  # applied right after this layer installs their packages
    source: FrameworkCheckout | None = None  # the framework built from a git checkout in this layer
    project: ProjectBuild | None = None  # its one pin built from the sdist with another project file
    archive: ArchiveFetch | None = None  # wheels from a release archive, after the section installs

    @property
    def no_binary(self) -> str:
        return ",".join(p.dist for p in self.pins if p.from_source)


@dataclass(frozen=True)
class StackLayers:
    """A stack's pip layers in build order, least volatile first (verl last: a bump rebuilds one)."""

    head: tuple[Layer, ...]  # before the git checkouts
    git: Layer | None  # the PyPI pins that ride with the checkouts
    tail: tuple[Layer, ...]
    framework: Layer  # verl from PyPI, or OpenRLHF from its checkout: the most volatile, last

    @property
    def all(self) -> tuple[Layer, ...]:
        return (*self.head, *((self.git,) if self.git else ()), *self.tail, self.framework)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.all)


def dist_name(component: str) -> str:
    return component.replace("_", "-")


def pin_of(stack: Stack, component: str) -> Pin:
    pin: PypiPin | None = stack.pins().get(component)
    assert pin is not None, component
    return Pin(pin.dist(component), pin.version, pin.build_from_source)


def expected_packages(stack: Stack) -> dict[str, str]:
    """Distribution name -> exact version for every pin, the framework's checkout included (what verification checks)."""
    expected = {pin_of(stack, c).dist: pin_of(stack, c).version for c in stack.pins()}
    if (source := stack.framework_source) is not None:
        expected[stack.framework] = source.version
    return expected


def _patched(stack: Stack, layer: Layer) -> Layer:
    """``layer`` with the stack's patches of the distributions it installs."""
    dists = {_canonical(p.dist) for p in layer.pins}
    patches = tuple(patch for patch in stack.patches if _canonical(patch.package) in dists)
    return replace(layer, patches=patches) if patches else layer


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def framework_layer(stack: Stack) -> Layer:
    """The framework's own layer, named for it: its index release, or its checkout built with its install environment."""
    name, title = stack.framework, title_of(stack.framework)
    source = stack.framework_source
    if source is None:
        return Layer(name, f"{title} (the most volatile layer: bumping {title} rebuilds only this)", (pin_of(stack, name),))
    checkout = FrameworkCheckout(
        name, source.repo, source.ref, source.version, source.requirements, tuple(sorted(source.install_env.items()))
    )
    text = (
        f"{title} {source.version} from its Ascend source at {source.ref[:12]}, built with "
        + " ".join(f"{k}={v}" for k, v in checkout.install_env)
        + f"\n#    (the most volatile layer); what its {source.requirements} needs beyond the layers above comes from the lock"
    )
    return Layer(name, text, source=checkout)


def stack_layers(stack: Stack, installer: Installer) -> StackLayers:
    """The one derivation of a stack's install layers (what lock splits by and render lays out)."""
    head = [
        Layer(
            UV_LAYER,
            "uv, which installs every locked layer below; pip installs uv itself (and stays for users)",
            (Pin("uv", installer.uv),),
            env=((INSTALLER_ARG, "pip"),),
        ),
        Layer(
            "torch",
            "torch, torch_npu and torchvision (pinned together: a loose torchvision replaces torch)",
            (pin_of(stack, "torch"), pin_of(stack, "torchvision"), pin_of(stack, "torch_npu")),
        ),
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
    if stack.sglang is not None:
        head += _sglang_layers(stack)
    else:
        head += _vllm_layers(stack, after_vllm)
    git = None
    tail = []
    if stack.git_pins():
        mbridge = (pin_of(stack, "mbridge"),) if stack.mbridge is not None else ()  # mbridge rides with MindSpeed
        git = Layer(GIT_LAYER, "git checkouts", mbridge)
    elif stack.mbridge is not None:
        tail.append(Layer("mbridge", "mbridge", (pin_of(stack, "mbridge"),)))
    tail.append(Layer("transformers", "transformers", (pin_of(stack, "transformers"),)))
    if stack.deepspeed is not None:
        tail.append(
            Layer(
                "deepspeed",
                "DeepSpeed from its sdist, against the torch above (its ops are built when first used)",
                (pin_of(stack, "deepspeed"),),
                env=(("DS_BUILD_OPS", "0"),),
            )
        )
    if stack.ring_attn_ascend is not None:
        tail.append(
            Layer("ring-attn-ascend", "ring-attn-ascend: Ring Attention on the NPU's fused attention", (pin_of(stack, "ring_attn_ascend"),))
        )
    if stack.transfer_queue is not None:
        tail.append(
            Layer("transfer-queue", "TransferQueue: verl's data plane between its trainer and rollout", (pin_of(stack, "transfer_queue"),))
        )
    if stack.cachetools is not None:
        tail.append(
            Layer("cachetools", "cachetools: imported by verl's rollout server, undeclared by verl 0.8", (pin_of(stack, "cachetools"),))
        )
    pinned = stack.pins()
    tools = tuple(pin_of(stack, c) for c in TOOL_COMPONENTS if c in pinned)
    if tools:
        tail.append(
            Layer(
                TOOLS_LAYER,
                "Ascend's accuracy and profiling tools: " + ", ".join(p.dist for p in tools) + " (ascend_tools: false leaves them out)",
                tools,
            )
        )
    return StackLayers(
        tuple(_patched(stack, layer) for layer in head),
        git if git is None else _patched(stack, git),
        tuple(_patched(stack, layer) for layer in tail),
        _patched(stack, framework_layer(stack)),
    )


def _vllm_layers(stack: Stack, after_vllm: tuple[str, ...]) -> list[Layer]:
    return [
        Layer(
            "vllm",
            "vllm from source with no device target: vllm-ascend supplies the NPU platform",
            (pin_of(stack, "vllm"),),
            env=(("VLLM_TARGET_DEVICE", "empty"),),
            after=after_vllm,
        ),
        Layer(
            "vllm-ascend",
            "vllm-ascend with its custom kernels compiled against CANN for ${SOC_VERSION}",
            (pin_of(stack, "vllm_ascend"),),
            env=(("COMPILE_CUSTOM_KERNELS", "1"), ("SOC_VERSION", '"${SOC_VERSION}"')),
            # Through the entrypoint: the same sourcing of set_env.sh (with the ATB ABI) as at run time.
            launcher=ENTRYPOINT,
            soc_arg="vllm-ascend compiles its kernels for one SoC; override for another member of the chip family.",
        ),
    ]


SGLANG_LAYER = "sglang"
SGL_KERNEL_LAYER = "sgl-kernel-npu"


def _sglang_layers(stack: Stack) -> list[Layer]:
    """SGLang from its sdist with the NPU project file in place, then sgl-kernel-npu's wheels (the
    archive of the chip is chosen where the plan knows the chip: :func:`archive_fetch`)."""
    pin = stack.sglang
    assert pin is not None and stack.sgl_kernel_npu is not None, "rule one-rollout"
    sglang = pin_of(stack, "sglang")
    extras = f"[{','.join(pin.extras)}]" if pin.extras else ""
    project = ProjectBuild(sglang.dist, sglang.version, pin.project_file, pin.extras) if pin.project_file else None
    title = f"SGLang {sglang.version} from its sdist" + (f", built as {pin.project_file}{extras} says (the NPU build)" if project else "")
    archive = stack.sgl_kernel_npu
    return [
        Layer(SGLANG_LAYER, title, (sglang,), project=project),
        Layer(
            SGL_KERNEL_LAYER,
            f"sgl-kernel-npu {archive.release}: {', '.join(archive.wheels)}, from the release archive built for this chip",
            soc_arg="the kernels of the archive are built for the chip; the label records the SoC asked for.",
        ),
    ]


def with_archive(layers: StackLayers, fetch: ArchiveFetch) -> StackLayers:
    """``layers`` with the archive layer's download for one chip filled in."""
    head = tuple(replace(layer, archive=fetch) if layer.name == SGL_KERNEL_LAYER else layer for layer in layers.head)
    return replace(layers, head=head)


def archive_fetch(stack: Stack, chip: str, host_arg: str, repo_path: str) -> ArchiveFetch:
    """The archive layer's download for one chip: each arch's file and its known sha256."""
    archive: WheelArchive | None = stack.sgl_kernel_npu
    assert archive is not None
    files = []
    for arch in stack.arches:
        name = archive.filename(chip, arch)
        files.append((arch, name, archive.sha256.get(name, "")))
    return ArchiveFetch(host_arg, archive.release_path(repo_path), tuple(files), archive.wheels)


def lock_path(stack_id: str, arch: str) -> str:
    """A lock's path relative to the matrix's directory."""
    return f"{LOCKS_DIR}/{stack_id}-{arch}.txt"


def section_path(stack_id: str, layer: str, arch: str) -> str:
    """One layer's part of a lock, relative to the matrix's directory (and the build context).

    Each pip layer COPYs only its own section right before it runs, so a lock change rebuilds the
    layers whose packages changed and those after them, nothing earlier (bumping verl: one layer)."""
    return f"{LOCKS_DIR}/{stack_id}/{layer}-{arch}.txt"
