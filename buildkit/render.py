"""Render Dockerfiles from the matrix and the Jinja2 templates in ``templates/``.

Python prepares every value (steps, pins, env, labels); the templates only lay them out. Output
depends on nothing but the matrix and the templates: no clock, no network, no environment.
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from buildkit import tags
from buildkit.errors import InputError
from buildkit.matrix import HardwareTarget, LoadedMatrix, resolve_hw, resolve_stack
from buildkit.model import ARCHES, Matrix, PypiPin, Stack

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
CONSTRAINTS_FILE = "/etc/ascendkit/constraints.txt"
GIT_REVISIONS_FILE = "/etc/ascendkit/git-revisions.txt"
TOOLKIT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
TOOLKIT_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
ATB_SET_ENV = "/usr/local/Ascend/nnal/atb/set_env.sh"
ENTRYPOINT = "/usr/local/bin/ascendkit-entrypoint"
BUILD_ENV = "/usr/local/lib/ascendkit/build-env.sh"
DOCTOR_SOURCE = "buildkit/doctor.py"  # relative to the build context (the repository root)
DOCTOR_PATH = "/usr/local/lib/ascendkit/doctor.py"
IMAGE_INFO_FILE = "/etc/ascendkit/image.json"
LOCKS_DIR = "locks"  # relative to the matrix's directory, and to the build context
IMAGE_LOCKS_DIR = "/etc/ascendkit/locks"
# The classic builder passes predefined proxy build args to RUN but keeps them out of
# `docker history` and the cache key; ascendkit uses this one to hand the pip layers the loopback
# URL where it serves a CA bundle and index credentials for the length of one build.
SECRETS_ARG = "ftp_proxy"
LABEL_PREFIX = "io.ascendkit"
PRIMARY_INDEX = "pypi"  # read by pip from PIP_INDEX_URL; every other index is an extra one
BUILD_LAYER = "build"  # lock section of the source builds' build requirements
GIT_LAYER = "git"  # lock section of the PyPI pins installed with the git checkouts


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
class InstallStep:
    """One RUN layer of Python packages, with the shell around the pip call prepared here."""

    title: str
    layer: str  # the section of the lock this step installs (see buildkit.lock)
    pins: tuple[Pin, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables for the pip call only
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    soc_arg: bool = False  # declare the SOC_VERSION build ARG right before this step
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
class DockerfileContext:
    target: RenderTarget
    header: tuple[str, ...]
    base_registry: str
    base_image: str
    build_args: tuple[tuple[str, str], ...]
    os_family: str
    system_packages: tuple[str, ...]
    soc_version: str
    constraints: tuple[str, ...]
    arch_constraints: tuple[tuple[str, tuple[str, ...]], ...]
    build_env_lines: tuple[str, ...]
    env_roots: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    steps: tuple[InstallStep, ...]
    git_checkouts: tuple[GitCheckout, ...]
    git_step_title: str
    git_pins: tuple[Pin, ...]
    pythonpath_dirs: tuple[str, ...]
    tail_steps: tuple[InstallStep, ...]
    last_step: InstallStep
    entrypoint_lines: tuple[str, ...]
    lock_sections: dict[str, str]  # layer -> its section files (every arch), as COPY sources
    doctor_wrapper: tuple[str, ...]
    image_info: str
    labels: tuple[tuple[str, str], ...] = field(default=())


SYSTEM_PACKAGES = {
    # git for source checkouts; compilers and cmake for vllm-ascend's custom kernels; numa for vllm.
    # libsndfile: the soundfile wheel vllm's dependencies bring is pure Python on aarch64 and loads the
    # system library; transformers imports it on the way to verl's main_ppo, which fails without it
    # (found by running main_ppo --cfg job on the real cann8.3 aarch64 layers).
    "debian": ("ca-certificates", "git", "gcc", "g++", "make", "cmake", "libnuma-dev", "libsndfile1"),
    "rpm": ("ca-certificates", "git", "gcc", "gcc-c++", "make", "cmake", "numactl-devel", "libsndfile"),
}


OS_FAMILY = {"ubuntu22.04": "debian", "debian12": "debian", "openeuler24.03": "rpm"}


def os_family(os_name: str) -> str:
    return OS_FAMILY[os_name]


def dist_name(component: str) -> str:
    return component.replace("_", "-")


def base_image_tag(matrix: Matrix, stack: Stack, chip_id: str, os_name: str) -> str:
    """The official CANN image tag for a stack, chip and OS (the grammar lives in the matrix)."""
    return matrix.base_image.tag.format(cann=stack.cann.lower(), chip=matrix.chips[chip_id].cann_chip, os=os_name, python=stack.python)


def base_image_ref(matrix: Matrix, stack: Stack, chip_id: str, os_name: str, registry: str | None = None) -> str:
    base = matrix.base_image
    return f"{registry or base.registry}/{base.repository}:{base_image_tag(matrix, stack, chip_id, os_name)}"


def _pin(stack: Stack, component: str) -> Pin:
    pin: PypiPin | None = stack.pins().get(component)
    assert pin is not None, component
    return Pin(pin.package or dist_name(component), pin.version, pin.build_from_source)


def expected_packages(stack: Stack) -> dict[str, str]:
    """Distribution name -> exact version for every PyPI-style pin (what verification checks)."""
    return {_pin(stack, c).dist: _pin(stack, c).version for c in stack.pins()}


def _arch_extra_indexes(matrix: Matrix, stack: Stack) -> tuple[tuple[str, str], ...]:
    """Per arch: the extra index URLs (as ARG references) every pip call of the image gets.

    They are exported as PIP_EXTRA_INDEX_URL, which pip also hands to build-isolated sdist builds
    (vllm, vllm-ascend), so those resolve torch the way the torch layer did (on x86_64: the CPU
    build, not PyPI's CUDA one).
    """
    result = []
    for arch in ARCHES:
        if arch not in stack.arches:
            continue
        used = sorted({pin.index_for(arch) for pin in stack.pins().values()} - {PRIMARY_INDEX})
        result.append((arch, " ".join(f"${{{matrix.indexes[i].arg}}}" for i in used)))
    return tuple(result)


# Run by the image's own Python: fetch ca.pem and env from the URL ascendkit serves for one build.
_FETCH_SECRETS = "; ".join(
    (
        "import sys, urllib.request",
        "url, out = sys.argv[1], sys.argv[2]",
        '[open(out + "/" + n, "wb").write(urllib.request.urlopen(url + "/" + n, timeout=30).read()) for n in ("ca.pem", "env")]',
    )
)


# ascendkit_install LAYER PIN...: what each pip layer runs. With this arch's lock resolved, it
# installs the layer's section of the lock (COPYed right before the step) with every hash enforced
# and no build isolation (the build requirements are locked too); the locked versions join the
# constraints file. A lock marked unresolved (its index was unreachable when it was made) falls
# back to the version pins, loudly.
_INSTALL_FUNCTION = (
    "ascendkit_install() {",
    '  local layer="$1" flags=() section; shift',
    f'  section="{IMAGE_LOCKS_DIR}/${{layer}}-$(uname -m).txt"',
    '  if [ -n "${ASCENDKIT_NO_BINARY:-}" ]; then flags+=(--no-binary "${ASCENDKIT_NO_BINARY}"); fi',
    '  if grep -qx "# status: resolved" "${section}"; then',
    '    if grep -q "^[A-Za-z0-9]" "${section}"; then',
    "      ${ASCENDKIT_LAUNCHER:-} python3 -m pip install --no-cache-dir --require-hashes --no-build-isolation \\",
    '        "${flags[@]}" -r "${section}"',
    f'      grep -o "^[A-Za-z0-9][^ ]*==[^ ]*" "${{section}}" >> {CONSTRAINTS_FILE}',
    "    else",
    '      echo "ascendkit: lock layer ${layer}: nothing new, earlier layers installed all of it"',
    "    fi",
    '  elif [ "$#" -gt 0 ]; then',
    '    echo "ascendkit: WARNING: the $(uname -m) lock is unresolved; installing $* by version pins, hashes NOT enforced" >&2',
    f'    ${{ASCENDKIT_LAUNCHER:-}} python3 -m pip install --no-cache-dir -c {CONSTRAINTS_FILE} "${{flags[@]}}" "$@"',
    "  fi",
    "}",
)


def build_env_script(matrix: Matrix, stack: Stack) -> tuple[str, ...]:
    """The helper every pip layer sources. It holds no secrets: it fetches them, when served."""
    lines = [
        "# ascendkit: sourced by every pip layer of this image; holds no secrets.",
        'ascendkit_xtrace=0; case "$-" in *x*) ascendkit_xtrace=1; set +x ;; esac',
        "# A CA bundle and index credentials, when ascendkit serves them for this build: fetched to",
        "# memory-backed /dev/shm and removed when the RUN ends, so no layer ever contains them.",
        f'if [ -n "${{{SECRETS_ARG}:-}}" ]; then',
        '  ascendkit_secrets="$(mktemp -d /dev/shm/ascendkit.XXXXXX 2>/dev/null || mktemp -d)"',
        "  trap 'rm -rf \"${ascendkit_secrets}\"' EXIT",
        f'  python3 -c \'{_FETCH_SECRETS}\' "${{{SECRETS_ARG}}}" "${{ascendkit_secrets}}"',
        '  if [ -s "${ascendkit_secrets}/ca.pem" ]; then',
        '    export PIP_CERT="${ascendkit_secrets}/ca.pem" SSL_CERT_FILE="${ascendkit_secrets}/ca.pem"',
        '    export REQUESTS_CA_BUNDLE="${ascendkit_secrets}/ca.pem"',
        "  fi",
        '  . "${ascendkit_secrets}/env"',
        f"  unset {SECRETS_ARG}",
        "fi",
        'case "$(uname -m)" in',
    ]
    for arch, urls in _arch_extra_indexes(matrix, stack):
        export = f' export PIP_EXTRA_INDEX_URL="{urls}${{PIP_EXTRA_INDEX_URL:+ ${{PIP_EXTRA_INDEX_URL}}}}"' if urls else ""
        lines.append(f"  {arch}){export} ;;")
    lines += [
        f'  *) echo "ascendkit: this image supports {", ".join(stack.arches)}, not $(uname -m)" >&2; exit 1 ;;',
        "esac",
        *_INSTALL_FUNCTION,
        'if [ "${ascendkit_xtrace}" = 1 ]; then set -x; fi',
    ]
    return tuple(lines)


def _steps(stack: Stack) -> tuple[tuple[InstallStep, ...], tuple[InstallStep, ...]]:
    """Install steps from least to most volatile; returns (before git checkouts, after)."""
    steps = [
        InstallStep(
            "torch, torch_npu and torchvision (pinned together: a loose torchvision replaces torch)",
            "torch",
            (_pin(stack, "torch"), _pin(stack, "torchvision"), _pin(stack, "torch_npu")),
        )
    ]
    if stack.triton_ascend is not None:
        steps.append(
            InstallStep(
                "triton-ascend (the CUDA triton shares its import name and must go first)",
                "triton-ascend",
                (_pin(stack, "triton_ascend"),),
                before=(f"python3 -m pip uninstall -y triton {_pin(stack, 'triton_ascend').dist}",),
            )
        )
    after_vllm: tuple[str, ...] = ()
    if stack.triton_ascend is not None:
        # If vllm's requirements dragged the CUDA triton back in, it overwrote triton-ascend's files.
        after_vllm = (
            "if python3 -m pip show triton >/dev/null 2>&1; then "
            "python3 -m pip uninstall -y triton; "
            "python3 -m pip install --no-cache-dir --no-deps --force-reinstall "
            f"{_pin(stack, 'triton_ascend').requirement}; fi",
        )
    if any(pin.build_from_source for pin in stack.pins().values()):
        steps.append(
            InstallStep(
                "what the source builds below need (their build-system requires, from the lock), so\n"
                "#    they build without isolation against the torch installed above",
                BUILD_LAYER,
            )
        )
    steps.append(
        InstallStep(
            "vllm from source with no device target: vllm-ascend supplies the NPU platform",
            "vllm",
            (_pin(stack, "vllm"),),
            env=(("VLLM_TARGET_DEVICE", "empty"),),
            after=after_vllm,
        )
    )
    steps.append(
        InstallStep(
            "vllm-ascend with its custom kernels compiled against CANN for ${SOC_VERSION}",
            "vllm-ascend",
            (_pin(stack, "vllm_ascend"),),
            env=(("COMPILE_CUSTOM_KERNELS", "1"), ("SOC_VERSION", '"${SOC_VERSION}"')),
            # Through the entrypoint: the same sourcing of set_env.sh (with the ATB ABI) as at run time.
            launcher=ENTRYPOINT,
            soc_arg=True,
        )
    )
    tail = []
    if stack.mbridge is not None and not stack.git_pins():
        tail.append(InstallStep("mbridge", "mbridge", (_pin(stack, "mbridge"),)))
    tail.append(InstallStep("transformers", "transformers", (_pin(stack, "transformers"),)))
    return tuple(steps), tuple(tail)


def _verl_step(stack: Stack) -> InstallStep:
    return InstallStep("verl (the most volatile layer: bumping verl rebuilds only this)", "verl", (_pin(stack, "verl"),))


def git_pip_pins(stack: Stack) -> tuple[Pin, ...]:
    """PyPI pins installed in the git-checkout layer (mbridge rides with MindSpeed)."""
    return (_pin(stack, "mbridge"),) if stack.mbridge is not None and stack.git_pins() else ()


def install_layers(stack: Stack) -> list[tuple[str, tuple[Pin, ...]]]:
    """Every pip layer of the image in build order, as (lock section, the pins it installs).

    This is what ``ascendkit lock`` splits a resolution by: each locked package goes to the first
    layer that needs it, so every layer installs from the lock with hashes enforced."""
    steps, tail = _steps(stack)
    layers = [(step.layer, step.pins) for step in steps]
    if stack.git_pins():
        layers.append((GIT_LAYER, git_pip_pins(stack)))
    layers += [(step.layer, step.pins) for step in tail]
    layers.append(("verl", _verl_step(stack).pins))
    return layers


def lock_path(stack_id: str, arch: str) -> str:
    """A lock's path relative to the matrix's directory."""
    return f"{LOCKS_DIR}/{stack_id}-{arch}.txt"


def section_path(stack_id: str, layer: str, arch: str) -> str:
    """One layer's part of a lock, relative to the matrix's directory (and the build context).

    Each pip layer COPYs only its own section right before it runs, so a lock change rebuilds the
    layers whose packages changed and those after them, nothing earlier (bumping verl: one layer)."""
    return f"{LOCKS_DIR}/{stack_id}/{layer}-{arch}.txt"


def lock_layers(stack: Stack) -> list[str]:
    """The layer of every pip step of the image, in build order (each has a lock section)."""
    return [layer for layer, _ in install_layers(stack)]


def cann_env(stack: Stack) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """What the toolkit's and ATB's set_env.sh export, persisted so `docker exec` and Kubernetes
    see it without a login shell. Both architectures' op_tiling directories are listed because ENV
    cannot branch on the architecture; the missing one is ignored by the loader."""
    home = "${ASCEND_TOOLKIT_HOME}"
    atb = f"/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_{stack.atb_cxx_abi}"
    tiling = f"{home}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux"
    ld_paths = [
        f"{home}/lib64",
        f"{home}/lib64/plugin/opskernel",
        f"{home}/lib64/plugin/nnengine",
        f"{tiling}/aarch64",
        f"{tiling}/x86_64",
        f"{home}/tools/aml/lib64",
        f"{home}/tools/aml/lib64/plugin",
        "${ATB_HOME_PATH}/lib",
        "${ATB_HOME_PATH}/examples",
        "/usr/local/Ascend/driver/lib64",
        "/usr/local/Ascend/driver/lib64/common",
        "/usr/local/Ascend/driver/lib64/driver",
    ]
    # Two ENV instructions: a variable set in one cannot be referenced in the same instruction.
    roots = (("ASCEND_TOOLKIT_HOME", TOOLKIT_HOME), ("ATB_HOME_PATH", atb))
    env = [
        ("ASCEND_HOME_PATH", home),
        ("ASCEND_AICPU_PATH", home),
        ("ASCEND_OPP_PATH", f"{home}/opp"),
        ("TOOLCHAIN_HOME", f"{home}/toolkit"),
        ("LD_LIBRARY_PATH", ":".join(ld_paths) + "${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"),
        ("PYTHONPATH", f"{home}/python/site-packages:{home}/opp/built-in/op_impl/ai_core/tbe" + "${PYTHONPATH:+:${PYTHONPATH}}"),
        ("PATH", f"${{ATB_HOME_PATH}}/bin:{home}/bin:{home}/compiler/ccec_compiler/bin:{home}/tools/ccec_compiler/bin:${{PATH}}"),
        ("PIP_NO_CACHE_DIR", "1"),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ]
    env += sorted(stack.env.items())
    return roots, tuple(env)


def _labels(loaded: LoadedMatrix, target: RenderTarget, stack: Stack, skus: list[str]) -> tuple[tuple[str, str], ...]:
    chip = loaded.matrix.chips[target.chip_id]
    version = tags.full_tag(stack, target.chip_id, target.os_name)
    labels: list[tuple[str, str]] = [
        ("org.opencontainers.image.title", f"ascendkit verl {target.stack_id} {target.chip_id}"),
        (
            "org.opencontainers.image.description",
            f"verl {stack.verl.version} for {chip.name}: CANN {stack.cann}, torch_npu {stack.torch_npu.version}, "
            f"vllm-ascend {stack.vllm_ascend.version}, Python {stack.python}",
        ),
        ("org.opencontainers.image.vendor", "ascendkit"),
        ("org.opencontainers.image.version", version),
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


def stack_skus_on_chip(loaded: LoadedMatrix, stack: Stack, chip_id: str) -> list[str]:
    return [s for s in stack.skus if loaded.matrix.skus[s].chip == chip_id]


def plan_target(loaded: LoadedMatrix, hw: str, stack_name: str | None, os_name: str | None) -> RenderTarget:
    """Check that ``--hw``/``--stack``/``--os`` name a Dockerfile the matrix supports."""
    stack_id, stack = resolve_stack(loaded, stack_name)
    target: HardwareTarget = resolve_hw(loaded, hw)
    if target.sku_id is not None and target.sku_id not in stack.skus:
        raise InputError(f"stack {stack_id!r} does not support SKU {target.sku_id!r}; it supports: {', '.join(stack.skus)}")
    if not stack_skus_on_chip(loaded, stack, target.chip_id):
        raise InputError(f"stack {stack_id!r} has no SKU on chip {target.chip_id!r}; it supports: {', '.join(stack.skus)}")
    chosen_os = os_name or stack.os[0]
    if chosen_os not in stack.os:
        raise InputError(f"stack {stack_id!r} is not built on --os {chosen_os!r}; choose one of: {', '.join(stack.os)}")
    return RenderTarget(stack_id, target.chip_id, chosen_os)


def all_targets(loaded: LoadedMatrix) -> list[RenderTarget]:
    targets = []
    for stack_id, stack in loaded.matrix.stacks.items():
        chips = sorted({loaded.matrix.skus[s].chip for s in stack.skus})
        targets += [RenderTarget(stack_id, chip, os_name) for chip in chips for os_name in stack.os]
    return targets


def build_context(loaded: LoadedMatrix, target: RenderTarget) -> DockerfileContext:
    matrix = loaded.matrix
    stack = matrix.stacks[target.stack_id]
    chip = matrix.chips[target.chip_id]
    skus = stack_skus_on_chip(loaded, stack, target.chip_id)
    base_tag = base_image_tag(matrix, stack, target.chip_id, target.os_name)
    build_args = [(index.arg, index.url) for index in matrix.indexes.values()]
    build_args += [("PIP_EXTRA_INDEX_URL", ""), ("APT_MIRROR", "")]
    used_hosts = {matrix.repos[g.repo].host for g in stack.git_pins().values()}
    build_args += [(h.arg, h.url) for name, h in matrix.git_hosts.items() if name in used_hosts]
    steps, tail = _steps(stack)
    env_roots, env = cann_env(stack)
    checkouts = tuple(
        GitCheckout(
            dist_name(component),
            matrix.git_hosts[matrix.repos[git.repo].host].arg,
            matrix.repos[git.repo].path,
            git.ref,
            git.install,
        )
        for component, git in stack.git_pins().items()
    )
    git_pins = git_pip_pins(stack)
    git_title = " + ".join([f"{c.name} {c.ref}" for c in checkouts] + [p.requirement for p in git_pins])
    constraints = tuple(f"{name}{spec}" for name, spec in sorted(stack.constraints.items()))
    arch_constraints = tuple(
        (arch, tuple(f"{name}{spec}" for name, spec in sorted(stack.constraints_by_arch.get(arch, {}).items())))
        for arch in ARCHES
        if arch in stack.arches
    )
    header = (
        "Generated from compat_matrix.yaml by ascendkit \u2014 do not edit.",
        f"Stack {target.stack_id}: {stack.description}.",
        f"Chip {target.chip_id} ({chip.name}) for SKUs {', '.join(skus)}; {target.os_name}; "
        f"Python {stack.python}; arches {', '.join(stack.arches)}.",
        "Change compat_matrix.yaml or templates/, then run `ascendkit render --all`.",
        "Mirrors: --build-arg BASE_REGISTRY=<host/path> (or BASE_IMAGE=<ref>), PIP_INDEX_URL, "
        + ", ".join(a for a, _ in build_args if a not in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "APT_MIRROR"))
        + ", APT_MIRROR.",
    )
    entrypoint = (
        "#!/bin/bash",
        "# ascendkit: load the full CANN environment (ATB with an explicit C++ ABI), then run the command.",
        f"if [ -f {TOOLKIT_SET_ENV} ]; then source {TOOLKIT_SET_ENV}; fi",
        f"if [ -f {ATB_SET_ENV} ]; then source {ATB_SET_ENV} --cxx_abi={stack.atb_cxx_abi}; fi",
        'exec "$@"',
    )
    image_info = {
        "stack": target.stack_id,
        "chip": target.chip_id,
        "chip_name": chip.name,
        "soc_names": list(chip.soc_names),
        "skus": skus,
        "os": target.os_name,
        "cann": stack.cann,
        "python": stack.python,
        "atb_cxx_abi": stack.atb_cxx_abi,
    }  # no versions: doctor reads those from the constraints file, and verl's must not touch this layer
    doctor_wrapper = (
        "#!/bin/sh",
        "# ascendkit inside the image: `ascendkit doctor` only (the full CLI runs on the build host).",
        f'if [ "${{1:-}}" = doctor ]; then shift; exec python3 {DOCTOR_PATH} "$@"; fi',
        r'echo "ascendkit: this image carries only \`ascendkit doctor\`" >&2',
        "exit 2",
    )
    return DockerfileContext(
        target=target,
        header=header,
        base_registry=matrix.base_image.registry,
        base_image=f"${{BASE_REGISTRY}}/{matrix.base_image.repository}:{base_tag}",
        build_args=tuple(build_args),
        os_family=os_family(target.os_name),
        system_packages=SYSTEM_PACKAGES[os_family(target.os_name)],
        soc_version=chip.soc_version,
        constraints=constraints,
        arch_constraints=arch_constraints,
        build_env_lines=build_env_script(matrix, stack),
        lock_sections={layer: " ".join(section_path(target.stack_id, layer, a) for a in stack.arches) for layer in lock_layers(stack)},
        env_roots=env_roots,
        env=env,
        steps=steps,
        git_checkouts=checkouts,
        git_step_title=git_title,
        git_pins=git_pins,
        pythonpath_dirs=tuple(c.directory for c in checkouts if c.install == "pythonpath"),
        tail_steps=tail,
        last_step=_verl_step(stack),
        entrypoint_lines=entrypoint,
        doctor_wrapper=doctor_wrapper,
        image_info=json.dumps(image_info, sort_keys=True, separators=(",", ":")),
        labels=_labels(loaded, target, stack, skus),
    )


@functools.lru_cache(maxsize=4)
def _environment(templates: Path) -> jinja2.Environment:
    """One environment per templates directory, so each template is compiled once per process."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # Dockerfiles, not HTML
    )
    env.filters["sh"] = shlex.quote
    env.globals["constraints_file"] = CONSTRAINTS_FILE
    env.globals["git_revisions_file"] = GIT_REVISIONS_FILE
    env.globals["entrypoint"] = ENTRYPOINT
    env.globals["build_env"] = BUILD_ENV
    env.globals["doctor_source"] = DOCTOR_SOURCE
    env.globals["doctor_path"] = DOCTOR_PATH
    env.globals["image_info_file"] = IMAGE_INFO_FILE
    env.globals["image_locks_dir"] = IMAGE_LOCKS_DIR
    env.globals["git_layer"] = GIT_LAYER
    return env


def render_dockerfile(loaded: LoadedMatrix, target: RenderTarget, templates: Path = TEMPLATES_DIR) -> str:
    return render_context(build_context(loaded, target), templates)


def render_context(ctx: DockerfileContext, templates: Path = TEMPLATES_DIR) -> str:
    env = _environment(templates)
    try:
        template = env.get_template("Dockerfile.j2")
    except jinja2.TemplateNotFound as exc:
        raise InputError(f"{templates}: template {exc.name} not found") from None
    text = template.render(ctx=ctx)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
