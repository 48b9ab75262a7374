"""Planning one image build: matrix + options -> :class:`BuildPlan` (pure; what ``build --dry-run``
prints), and every check that can refuse it before the engine is contacted (names, locks, outputs).
:mod:`buildkit.image.build` runs a plan."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildkit.arch import DOCKER_ARCH, Arch, normalize_arch
from buildkit.doctor.base import Check
from buildkit.errors import InputError
from buildkit.fsio import check_output_dir
from buildkit.image.buildx import BUILDERS, refuse_classic_cache
from buildkit.image.render import build_context, render_context
from buildkit.image.secrets import BuildSecrets
from buildkit.image.verify import Expected
from buildkit.imageref import IMAGE_REFERENCE
from buildkit.lock.inputs import LockTarget, lock_inputs
from buildkit.lock.lockfile import LockFile, lock_problem, read_lock, section_texts
from buildkit.lock.wheelhouse import current_lock, missing_from
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import INSTALLER_ARG, INSTALLERS, ImagePlan, hosts_arch, plan_image, plan_target
from buildkit.resources import default_repository
from buildkit.settings import Mirrors, default_ca_bundle, read_ca_bundle, split_credentials


def host_arch() -> str:
    return normalize_arch(platform.machine())


@dataclass(frozen=True)
class BuildPlan:
    """One build: the image plan plus what this machine and its settings add (base, mirrors, secrets)."""

    image: ImagePlan
    dockerfile: str
    base_image: str  # the plan's, or where --base-image / --base-registry point
    buildargs: tuple[tuple[str, str], ...]  # never holds a secret: these land in `docker history`
    repository: str
    expected: Expected
    no_cache: bool = False
    manifest_dir: Path = Path("manifests")
    secrets: BuildSecrets = field(default_factory=BuildSecrets, repr=False)
    lock_files: tuple[tuple[str, str], ...] = ()  # (path in the build context, text): every lock section
    lock_status: str = "resolved"  # of this arch's lock: "resolved" (hashes enforced) or "unresolved"
    warnings: tuple[str, ...] = ()
    reverify: bool = False  # verify even an image whose passed verification is on record
    matrix_root: Path | None = None  # the directory of the matrix and its locks: the source provenance names
    classic_dockerfile: str = ""  # the same steps without BuildKit's mounts, for the classic builder
    served_dockerfile: str = ""  # BuildKit's without its secret mounts (Builder.serves_secrets)
    builder: str = "auto"  # BUILDERS: BuildKit where the engine and buildx give it, else classic
    cache_repo: str | None = None  # a registry cache (BuildKit): REPO, tagged per stack, chip, OS and arch
    cache_export: bool = True  # False: import the registry cache only (a build without push rights)

    def dockerfile_for(self, builder: str, *, served: bool = False) -> str:
        """The render ``builder`` builds: with ``served``, BuildKit's whose secrets ascendkit serves."""
        if builder != "buildkit":
            return self.classic_dockerfile or self.dockerfile
        return self.served_dockerfile if served and self.served_dockerfile else self.dockerfile

    @property
    def cache_ref(self) -> str:
        """Where the registry cache of this image's stack, chip, OS and arch is kept ("" without one)."""
        if not self.cache_repo:
            return ""
        return f"{self.cache_repo}:buildcache-{self.stack_id}-{self.chip_id}-{self.os_name}-{self.arch}"

    @property
    def stack_id(self) -> str:
        return self.image.stack_id

    @property
    def chip_id(self) -> str:
        return self.image.chip_id

    @property
    def os_name(self) -> str:
        return self.image.os_name

    @property
    def arch(self) -> Arch:
        return self.image.arch

    @property
    def tags(self) -> tuple[str, ...]:
        return self.image.tags

    @property
    def base_mirrors(self) -> tuple[str, ...]:
        return self.image.base_mirrors

    @property
    def platform(self) -> str:
        return f"linux/{DOCKER_ARCH[self.arch]}"

    @property
    def refs(self) -> list[str]:
        return [f"{self.repository}:{t}" for t in self.tags]

    @property
    def manifest_name(self) -> str:
        return self.tags[0]

    def describe(self) -> dict[str, Any]:
        """The plan as JSON-able data, with secrets reduced to what kind they are."""
        return {
            "stack": self.stack_id,
            "chip": self.chip_id,
            "os": self.os_name,
            "arch": self.arch,
            "platform": self.platform,
            "base_image": self.base_image,
            "buildargs": dict(self.buildargs),
            "tags": self.refs,
            "no_cache": self.no_cache,
            "builder": self.builder,
            "cache": self.cache_ref or None,
            "cache_export": bool(self.cache_ref) and self.cache_export,
            "ca_bundle": bool(self.secrets.ca_bundle),
            "secret_env": [name for name, _ in self.secrets.env],
            "lock": self.image.lock_path,
            "lock_status": self.lock_status,
            "offline": str(self.secrets.wheelhouse) if self.secrets.wheelhouse else None,
            "warnings": list(self.warnings),
            "manifest": str(self.manifest_dir / f"{self.manifest_name}.json"),
        }


@dataclass(frozen=True)
class BuildResult:
    image_id: str  # the config digest: what the image is on every engine
    refs: list[str]
    arch: str
    duration_s: float
    steps_total: int
    steps_cached: int
    checks: list[Check]
    manifest_json: Path
    manifest_md: Path
    sbom: Path
    verification: str = "ran"  # or "reused": the image ID and the expectations match a passed verification
    engine_id: str = ""  # what the engine calls it (the containerd store: a manifest digest); "" when the config digest
    builder: str = "classic"  # "buildkit" or "classic"
    builder_version: str = ""
    notes: tuple[str, ...] = ()  # what the user should know: why not BuildKit, a registry cache not written

    def describe(self) -> dict[str, Any]:
        return {
            "verification": self.verification,
            "image_id": self.image_id,
            "engine_id": self.engine_id or self.image_id,
            "tags": self.refs,
            "arch": self.arch,
            "duration_s": round(self.duration_s, 1),
            "steps_total": self.steps_total,
            "steps_cached": self.steps_cached,
            "builder": self.builder,
            "builder_version": self.builder_version,
            "notes": list(self.notes),
            "manifest": str(self.manifest_json),
            "manifest_md": str(self.manifest_md),
            "sbom": str(self.sbom),
        }


def plan_build(
    loaded: LoadedMatrix,
    hw: str,
    *,
    stack: str | None = None,
    os_name: str | None = None,
    arch: str | None = None,
    base_image: str | None = None,
    mirrors: Mirrors | None = None,
    use_default_ca: bool = True,
    repository: str | None = None,
    no_cache: bool = False,
    manifest_dir: Path = Path("manifests"),
    wheelhouse: Path | None = None,
    reverify: bool = False,
    installer: str = INSTALLERS[0],
    builder: str = "auto",
    cache_repo: str | None = None,
    cache_export: bool = True,
) -> BuildPlan:
    """Everything one build needs, checked before the engine is touched. ``wheelhouse`` makes the
    build offline: pip installs only from that directory, which must hold every locked package.
    ``installer`` installs the locked layers: uv (the Dockerfile's default) or pip. ``repository``
    is where the image is tagged locally (default ascendkit/<its framework>)."""
    check_names(repository, base_image)
    cache_repo = cache_repo or None  # an empty ASCENDKIT_CACHE_REPO: no cache
    _check_cache_repo(cache_repo)
    if builder not in BUILDERS:
        raise InputError(f"--builder {builder!r}: choose one of {', '.join(BUILDERS)}")
    refuse_classic_cache(builder, bool(cache_repo))
    if installer not in INSTALLERS:
        raise InputError(f"--installer {installer!r}: choose one of {', '.join(INSTALLERS)}")
    image = plan_image(loaded, plan_target(loaded, hw, stack, os_name), arch or hosts_arch(loaded, hw))
    repository = repository or default_repository(image.framework)
    mirrors = mirrors or Mirrors()
    base_registry = mirrors.get("base_registry")
    if base_image and base_registry:
        raise InputError(
            f"--base-image names the whole base; base_registry (from {mirrors.origin['base_registry']}) only its registry: give one"
        )
    base = base_image or image.base_image_at(base_registry)
    if not IMAGE_REFERENCE.match(base):
        raise InputError(
            f"base_registry {base_registry!r} (from {mirrors.origin['base_registry']}) makes the base {base!r}, which is not an "
            "image reference: give HOST[:PORT]/PATH in lowercase, e.g. quay.nju.edu.cn/ascend"
        )
    ctx = build_context(loaded, image)
    declared = {name for name, _ in ctx.build_args}
    buildargs = [("BASE_IMAGE", base)]
    if installer != INSTALLERS[0]:
        buildargs.append((INSTALLER_ARG, installer))
    env: list[tuple[str, str]] = []
    for arg, value in mirrors.build_args().items():
        if arg not in declared:
            continue  # this stack's Dockerfile does not use that index or host
        parts = [split_credentials(url) for url in value.split()]
        buildargs.append((arg, " ".join(public for public, _ in parts)))
        if any(full for _, full in parts):
            env.append((arg, value))  # with credentials: served for the build, never a build arg
    ca_setting = mirrors.get("ca_bundle")
    ca_path = Path(ca_setting) if ca_setting else (default_ca_bundle() if use_default_ca else None)
    lock_files, lock, warnings = _check_locks(loaded, image.stack_id, image.arch, wheelhouse)
    lock_status = "resolved" if lock.resolved else "unresolved"
    if image.arch != host_arch():
        why = "" if arch else f" (the arch of the {hw} hosts; --arch {host_arch()} builds for this machine)"
        warnings += (f"building {image.arch}{why} on this {host_arch()} machine: emulated with qemu, several times slower",)
    locked = tuple((p.key, p.version) for _, p in lock.packages)
    secrets = BuildSecrets(read_ca_bundle(ca_path) if ca_path else b"", tuple(env), wheelhouse)
    expected = Expected(
        stack_id=image.stack_id,
        chip_id=image.chip_id,
        skus=image.skus,
        os_name=image.os_name,
        arch=image.arch,
        python=image.stack.python,
        cann=image.stack.cann,
        base_image=base,
        packages=image.expected_packages,
        labels=image.labels_for(base),
        lock=image.lock_path if lock_status == "resolved" else "",
        locked=locked,
        unresolved_lock=image.lock_path if lock_status != "resolved" else "",
        commits=image.expected_sources.commits,
        leaves_out=image.expected_sources.leaves_out,
        patches=image.expected_sources.patches,
        user=(image.user.name, image.user.uid, image.user.gid),
        extensions=tuple((component, module) for component, pin in image.stack.pins().items() for module in pin.extensions),
        archive_wheels=image.stack.sgl_kernel_npu.wheels if image.stack.sgl_kernel_npu is not None else (),
        imports=tuple((component, module) for component, pin in image.stack.pins().items() for module in pin.imports),
    )
    return BuildPlan(
        image=image,
        dockerfile=render_context(ctx),
        classic_dockerfile=render_context(ctx, buildkit=False),
        served_dockerfile=render_context(ctx, secret_mounts=False),
        builder=builder,
        cache_repo=cache_repo,
        cache_export=cache_export,
        base_image=base,
        buildargs=tuple(buildargs),
        repository=repository,
        expected=expected,
        no_cache=no_cache,
        manifest_dir=manifest_dir,
        secrets=secrets,
        lock_files=lock_files,
        lock_status=lock_status,
        warnings=warnings,
        reverify=reverify,
        matrix_root=loaded.root,
    )


def check_names(repository: str | None, base_image: str | None) -> None:
    """``--repo``: a repository name the engine accepts for a tag, without a tag or digest of its own;
    ``--base-image``: an image reference. The same for every target of ``build --all``."""
    if base_image is not None and not IMAGE_REFERENCE.match(base_image):
        raise InputError(
            f"--base-image {base_image!r} is not an image reference: NAME[:TAG][@sha256:<64 hex>], "
            "e.g. quay.io/ascend/cann:8.3.rc1-a3-ubuntu22.04-py3.11"
        )
    if repository is None:
        return
    match = IMAGE_REFERENCE.match(repository)
    if not match or match["tag"] or match["digest"]:
        raise InputError(
            f"--repo {repository!r}: expected a repository name without a tag, [HOST[:PORT]/]PATH in lowercase letters, "
            "digits and . _ - (e.g. ascendkit/verl)"
        )


def _check_cache_repo(cache_repo: str | None) -> None:
    if cache_repo is None:
        return
    match = IMAGE_REFERENCE.match(cache_repo)
    if not match or match["tag"] or match["digest"] or "/" not in cache_repo:
        raise InputError(
            f"--cache-repo {cache_repo!r}: expected a registry repository without a tag, HOST[:PORT]/PATH in lowercase "
            "(e.g. harbor.example.com/ascend/buildcache); each image's cache is a tag in it"
        )


def _check_locks(
    loaded: LoadedMatrix, stack_id: str, arch: str, wheelhouse: Path | None
) -> tuple[tuple[tuple[str, str], ...], LockFile, tuple[str, ...]]:
    """The Dockerfile copies every arch's lock sections: each lock must be current. This arch's
    decides whether hashes are enforced; an offline build needs it resolved and the wheelhouse
    complete. The sections go into the context from the locks, whatever the tree holds."""
    files: list[tuple[str, str]] = []
    for lock_arch in loaded.matrix.stacks[stack_id].arches:
        inputs = lock_inputs(loaded, LockTarget(stack_id, lock_arch))
        problem = lock_problem(loaded.root, inputs)
        if problem is not None:
            raise InputError(f"{problem} (the image carries it; nothing was built)")
        files += section_texts(loaded, inputs.target).items()
    this = LockTarget(stack_id, arch)  # type: ignore[arg-type]  # arch was checked against the stack
    lock = read_lock(loaded.root / this.path)
    warnings = []
    if wheelhouse is not None:
        lock = current_lock(loaded, this)
        missing = missing_from(wheelhouse, lock)
        if missing:
            shown = "\n".join(f"    {m}" for m in missing[:20]) + (f"\n    ... and {len(missing) - 20} more" if len(missing) > 20 else "")
            raise InputError(
                f"--wheelhouse {wheelhouse} lacks {len(missing)} locked package(s) of {this.path}:\n{shown}\n"
                f"  fill it with: ascendkit wheelhouse --stack {stack_id} --arch {arch} -o {wheelhouse}"
            )
    elif not lock.resolved:
        warnings.append(
            f"{this.path} is unresolved ({lock.header.get('reason', 'no reason recorded')}): this image installs its "
            "pins without hash checks; run `ascendkit lock` where the index answers to enforce them"
        )
    return tuple(files), lock, tuple(warnings)


def check_outputs(plan: BuildPlan) -> None:
    """What a build will write, checked before the engine is contacted (exit 3, not a failed build)."""
    check_output_dir(plan.manifest_dir, "manifest directory (--manifest-dir)")
