"""The plan of one image: its target, base, tags, labels and layers, computed once from the matrix."""

from __future__ import annotations

from dataclasses import dataclass

from buildkit.arch import Arch
from buildkit.errors import InputError
from buildkit.framework import title_of
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import Chip, ImageUser, Matrix, Stack
from buildkit.plan.layers import (
    DOCKERFILES_DIR,
    EPOCH_LABEL,
    LABEL_PREFIX,
    SOURCE_DATE_EPOCH,
    USER_LABEL,
    StackLayers,
    archive_fetch,
    dist_name,
    expected_packages,
    lock_path,
    section_path,
    stack_layers,
    with_archive,
)


@dataclass(frozen=True)
class RenderTarget:
    """One Dockerfile: a stack, the chip it is built for, and the OS of the base image."""

    stack_id: str
    chip_id: str
    os_name: str

    @property
    def filename(self) -> str:
        return f"Dockerfile.{self.chip_id}-{self.os_name}"

    @property
    def path(self) -> str:
        """Where `render --all` writes it, relative to the matrix's directory."""
        return f"{DOCKERFILES_DIR}/{self.stack_id}/{self.filename}"


@dataclass(frozen=True)
class GitCheckout:
    name: str
    url_arg: str
    path: str
    ref: str
    install: str  # "pip" or "pythonpath"
    host_url: str = ""  # the official host the matrix names (a build may use a mirror of it)

    @property
    def url(self) -> str:
        return f"{self.host_url.rstrip('/')}/{self.path}"

    @property
    def directory(self) -> str:
        base = self.path.rsplit("/", 1)[-1].removesuffix(".git")
        return f"/opt/{base}" if self.install == "pythonpath" else f"/tmp/{base}"


def base_image_tag(matrix: Matrix, stack: Stack, chip_id: str, os_name: str) -> str:
    """The official CANN image tag for a stack, chip and OS (the grammar lives in the matrix)."""
    return matrix.base_image.tag.format(cann=stack.cann.lower(), chip=matrix.chips[chip_id].cann_chip, os=os_name, python=stack.python)


def base_image_ref(matrix: Matrix, stack: Stack, chip_id: str, os_name: str, registry: str | None = None) -> str:
    base = matrix.base_image
    return f"{registry or base.registry}/{base.repository}:{base_image_tag(matrix, stack, chip_id, os_name)}"


def full_tag(stack: Stack, chip_id: str, os_name: str) -> str:
    """Named for the framework the image carries first: verl0.6.1-..., openrlhf0.7.5-..."""
    rollout = f"-sglang{stack.sglang.version}" if stack.sglang is not None else ""  # vLLM, the usual engine, goes unnamed
    return (
        f"{stack.framework}{stack.framework_version}{rollout}-cann{stack.cann.lower()}-torch_npu{stack.torch_npu.version}"
        f"-{chip_id}-{os_name}-py{stack.python}"
    )


def framework_title(stack: Stack) -> str:
    """``verl 0.6.1``, ``OpenRLHF 0.7.5 (source 06ac74cf1ea8)``: what people call the image's framework."""
    name = f"{title_of(stack.framework)} {stack.framework_version}"
    source = stack.framework_source
    return name if source is None else f"{name} (source {source.ref[:12]})"


# The tag grammar, owned here; ship/ asks it and never rebuilds a tag with string methods:
#   <name>                  the multi-arch index (name: the full tag or an alias)
#   <name>-<arch>           one architecture's image, as `ascendkit build` tags it locally
#   <tag>-<compression>     the same image with layers in another compression (<name>-zstd, <name>-<arch>-zstd)
DEFAULT_COMPRESSION = "gzip"  # the compression whose tags carry no suffix


def arch_tag(tag: str, arch: str) -> str:
    """What ``ascendkit build`` tags locally: every tag above, per architecture."""
    return f"{tag}-{arch}"


def index_tag(per_arch: str, arch: str) -> str:
    """The multi-arch index's name for a per-arch tag: :func:`arch_tag` undone."""
    return per_arch.removesuffix(f"-{arch}")


def variant_tag(tag: str, compression: str) -> str:
    """The tag of ``compression``'s variant of an image or index: ``tag`` itself for gzip, else ``tag-zstd``."""
    return tag if compression == DEFAULT_COMPRESSION else f"{tag}-{compression}"


def tag_of(ref: str) -> str:
    """The tag of a local ``NAME:TAG`` reference (a build manifest lists its tags so)."""
    return ref.rsplit(":", 1)[1]


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


def _labels(target: RenderTarget, stack: Stack, chip: Chip, skus: tuple[str, ...], user: ImageUser) -> tuple[tuple[str, str], ...]:
    """Image labels; ${BASE_IMAGE} and ${SOC_VERSION} are filled by the build's arguments."""
    labels: list[tuple[str, str]] = [
        ("org.opencontainers.image.title", f"ascendkit {stack.framework} {target.stack_id} {target.chip_id}"),
        (
            "org.opencontainers.image.description",
            f"{framework_title(stack)} for {chip.name}: CANN {stack.cann}, torch_npu {stack.torch_npu.version}, "
            f"{stack.rollout_title}, Python {stack.python}",
        ),
        ("org.opencontainers.image.vendor", "ascendkit"),
        ("org.opencontainers.image.version", full_tag(stack, target.chip_id, target.os_name)),
        ("org.opencontainers.image.base.name", "${BASE_IMAGE}"),
        (f"{LABEL_PREFIX}.stack", target.stack_id),
        (f"{LABEL_PREFIX}.framework", stack.framework),
        (f"{LABEL_PREFIX}.rollout", stack.rollout),  # the engine smoke and k8s render configure verl's rollout for
        (f"{LABEL_PREFIX}.chip", target.chip_id),
        (f"{LABEL_PREFIX}.skus", ",".join(skus)),
        (f"{LABEL_PREFIX}.os", target.os_name),
        (f"{LABEL_PREFIX}.arches", ",".join(stack.arches)),
        (f"{LABEL_PREFIX}.soc-version", "${SOC_VERSION}"),
        (f"{LABEL_PREFIX}.atb-cxx-abi", str(stack.atb_cxx_abi)),
        (USER_LABEL, f"{user.name} {user.uid}:{user.gid}"),  # its USER uid:gid, with the name
        (f"{LABEL_PREFIX}.device-gid", str(user.device_gid)),  # the device group it was built for (a record)
        (EPOCH_LABEL, str(SOURCE_DATE_EPOCH)),  # what publishing clamps times to (buildkit/ship/layers/normalize.py)
        (f"{LABEL_PREFIX}.version.cann", stack.cann),
        (f"{LABEL_PREFIX}.version.python", stack.python),
    ]
    for component, pin in stack.pins().items():
        labels.append((f"{LABEL_PREFIX}.version.{dist_name(component)}", pin.version))
    for component, git in stack.git_pins().items():
        labels.append((f"{LABEL_PREFIX}.version.{dist_name(component)}", git.ref))
    if (source := stack.framework_source) is not None:  # a framework from the index is among the pins
        labels.append((f"{LABEL_PREFIX}.version.{stack.framework}", source.version))
        labels.append((f"{LABEL_PREFIX}.commit.{stack.framework}", source.ref))
    return tuple(labels)


@dataclass(frozen=True)
class SourceChecks:
    """The framework's commit, what its NPU install leaves out, the patched lines: verification's expectations."""

    commits: tuple[tuple[str, str], ...]  # (checkout, commit)
    leaves_out: tuple[tuple[str, tuple[str, ...]], ...]  # (checkout, packages its requirements must not name)
    patches: tuple[tuple[str, str, str], ...]  # (distribution, file, line commented out)


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
    source_checkout: GitCheckout | None  # the framework's own checkout (OpenRLHF's), built in its layer
    labels: tuple[tuple[str, str], ...]
    expected_packages: tuple[tuple[str, str], ...]
    full_tag: str
    alias_tags: tuple[str, ...]
    user: ImageUser  # the non-root user it runs as

    @property
    def stack_id(self) -> str:
        return self.target.stack_id

    @property
    def framework(self) -> str:
        return self.stack.framework

    @property
    def expected_sources(self) -> SourceChecks:
        """What verification checks of what was built from source or changed after install."""
        source = self.stack.framework_source
        return SourceChecks(
            commits=((self.source_checkout.name, self.source_checkout.ref),) if self.source_checkout else (),
            leaves_out=((self.framework, source.leaves_out),) if source is not None and source.leaves_out else (),
            patches=tuple((p.package, p.file, p.comment_out) for p in self.stack.patches),
        )

    @property
    def checkouts(self) -> tuple[GitCheckout, ...]:
        """Every git checkout the image records in its revisions file, the framework's last."""
        return (*self.git_checkouts, *((self.source_checkout,) if self.source_checkout else ()))

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


def _checkout(matrix: Matrix, name: str, repo_id: str, ref: str, install: str) -> GitCheckout:
    repo = matrix.repos[repo_id]
    host = matrix.git_hosts[repo.host]
    return GitCheckout(name, host.arg, repo.path, ref, install, host.url)


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
        _checkout(matrix, dist_name(component), git.repo, git.ref, git.install) for component, git in stack.git_pins().items()
    )
    source = stack.framework_source
    layers = stack_layers(stack, matrix.installer)
    if stack.sgl_kernel_npu is not None:
        repo = matrix.repos[stack.sgl_kernel_npu.repo]
        layers = with_archive(layers, archive_fetch(stack, target.chip_id, matrix.git_hosts[repo.host].arg, repo.path))
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
        layers=layers,
        git_checkouts=checkouts,
        source_checkout=None if source is None else _checkout(matrix, stack.framework, source.repo, source.ref, "pip"),
        labels=_labels(target, stack, chip, skus, matrix.image_user),
        expected_packages=tuple(sorted(expected_packages(stack).items())),
        full_tag=full_tag(stack, target.chip_id, target.os_name),
        alias_tags=tuple(alias_tags(target.stack_id, stack, target.chip_id, target.os_name)),
        user=matrix.image_user,
    )
