"""Render a Dockerfile from an image plan and the Jinja2 templates in ``templates/``.

Python prepares every value (steps, pins, env, labels); the templates only lay them out. Output
depends on nothing but the matrix and the templates: no clock, no network, no environment.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from buildkit.arch import ARCHES
from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import Matrix, Stack
from buildkit.plan import (
    CONSTRAINTS_FILE,
    ENTRYPOINT,
    GIT_LAYER,
    IMAGE_LOCKS_DIR,
    INSTALLER_ARG,
    PRIMARY_INDEX,
    WORKSPACE,
    GitCheckout,
    ImagePlan,
    Layer,
    Pin,
    section_path,
)
from buildkit.plan.layers import SOURCE_DATE_EPOCH
from buildkit.resources import PACKAGE_DIR, TEMPLATES_DIR

GIT_REVISIONS_FILE = "/etc/ascendkit/git-revisions.txt"
TOOLKIT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
BUILD_ENV = "/usr/local/lib/ascendkit/build-env.sh"
DOCTOR_PATH = "/usr/local/lib/ascendkit/doctor"  # the doctor package, which python3 runs as a directory
IN_IMAGE_CLI = "/usr/local/bin/ascendkit"
IMAGE_INFO_FILE = "/etc/ascendkit/image.json"
PATCH_TOOL = "/usr/local/lib/ascendkit/patch.py"
PATCHES_FILE = "/etc/ascendkit/patches.json"  # what patch.py records: verification and the SBOM read it
# The classic builder passes predefined proxy build args to RUN but keeps them out of
# `docker history` and the cache key; ascendkit uses this one to hand the pip layers the loopback
# URL where it serves a CA bundle and index credentials for the length of one build
# (buildkit/image/files/build-env.sh reads it).
SECRETS_ARG = "ftp_proxy"
# Files the image carries as they are, by their path in the build context (the repository root, the
# same as in the package): the in-image doctor (a directory: its modules and its table of error codes)
# and the scripts in buildkit/image/files/.
CONTEXT_FILES = {
    "doctor": "buildkit/doctor/",
    "entrypoint": "buildkit/image/files/entrypoint.sh",
    "build_env": "buildkit/image/files/build-env.sh",
    "in_image_cli": "buildkit/image/files/ascendkit.sh",
    "patch_tool": "buildkit/image/files/patch.py",
    "add_user": "buildkit/image/files/add-user.sh",
}
ADD_USER = "/usr/local/lib/ascendkit/add-user.sh"
# Where BuildKit mounts the pip and uv download cache in the installing steps (build-env.sh uses it
# when it is mounted there; with the classic builder nothing is, and they install without a cache).
BUILD_CACHE_DIR = "/var/cache/ascendkit"


DIRECTORY_MEMBERS = ("*.py", "*.json")  # what a directory of CONTEXT_FILES sends: never __pycache__


def context_file(name: str) -> Path:
    """Where a file (or directory) of CONTEXT_FILES is on this machine (inside the installed package)."""
    return PACKAGE_DIR.parent / CONTEXT_FILES[name]


def context_paths() -> list[str]:
    """Every file the build context carries for CONTEXT_FILES, by its path in the context, sorted:
    a directory's members that match DIRECTORY_MEMBERS, not its caches."""
    paths = []
    for name, relative in CONTEXT_FILES.items():
        if not relative.endswith("/"):
            paths.append(relative)
            continue
        here = context_file(name)
        paths += [f"{relative}{p.name}" for pattern in DIRECTORY_MEMBERS for p in here.glob(pattern) if p.is_file()]
    return sorted(paths)


@dataclass(frozen=True)
class DockerfileContext:
    plan: ImagePlan
    header: tuple[str, ...]
    base_registry: str
    base_image: str
    build_args: tuple[tuple[str, str], ...]
    script_args: tuple[tuple[str, str], ...]  # what build-env.sh reads: the arches and their extra indexes
    os_family: str
    system_packages: tuple[str, ...]
    constraints: tuple[str, ...]
    arch_constraints: tuple[tuple[str, tuple[str, ...]], ...]
    env_roots: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    steps: tuple[Layer, ...]
    git_step_title: str
    git_pins: tuple[Pin, ...]
    git_checkouts: tuple[GitCheckout, ...]
    source_checkout: GitCheckout | None  # the framework's checkout, built in the last step
    pythonpath_dirs: tuple[str, ...]
    tail_steps: tuple[Layer, ...]
    last_step: Layer
    patched: bool  # the image carries patch.py: the matrix names lines to comment out
    lock_sections: dict[str, str]  # layer -> its section files (every arch), as COPY sources
    image_info: str
    labels: tuple[tuple[str, str], ...]
    buildkit: bool = True  # BuildKit's cache and secret mounts; False: the classic builder's render
    secret_mounts: bool = True  # False: BuildKit's render without the secret mounts (the secrets served instead)


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


def _script_args(matrix: Matrix, stack: Stack) -> tuple[tuple[str, str], ...]:
    """The arches and, per arch, the names of the index ARGs every pip call gets as extra indexes.

    build-env.sh exports their values as PIP_EXTRA_INDEX_URL, which pip also hands to
    build-isolated sdist builds (vllm, vllm-ascend), so those resolve torch the way the torch layer
    did (on x86_64: the CPU build, not PyPI's CUDA one). Names, not values: the served env may
    re-export an index ARG with its credentials, and the script expands them after that."""
    args = [("ASCENDKIT_ARCHES", " ".join(stack.arches))]
    for arch in ARCHES:
        if arch in stack.arches:
            used = sorted({pin.index_for(arch) for pin in stack.pins().values()} - {PRIMARY_INDEX})
            args.append((f"ASCENDKIT_EXTRA_INDEXES_{arch}", " ".join(matrix.indexes[i].arg for i in used)))
    return tuple(args)


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
        ("ASCENDKIT_ATB_CXX_ABI", str(stack.atb_cxx_abi)),  # the entrypoint passes it to ATB's set_env.sh
        ("PIP_NO_CACHE_DIR", "1"),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ]
    env += sorted(stack.env.items())
    return roots, tuple(env)


def _image_info(matrix: Matrix, plan: ImagePlan) -> dict[str, Any]:
    """/etc/ascendkit/image.json: what doctor knows of the image it runs in, besides its pins."""
    stack, target = plan.stack, plan.target
    drivers = matrix.compat.cann_drivers.get(stack.cann)
    return {
        "stack": target.stack_id,
        "chip": target.chip_id,
        "chip_name": plan.chip.name,
        "soc_names": list(plan.chip.soc_names),
        **({"soc_family": plan.chip.soc_family} if plan.chip.soc_family else {}),  # 950: SoCs the list may not name yet
        "skus": list(plan.skus),
        "os": target.os_name,
        "cann": stack.cann,
        "python": stack.python,
        "atb_cxx_abi": stack.atb_cxx_abi,
        "framework": stack.framework,
        "drivers": drivers.as_image_info() if drivers else None,
    }  # no versions: doctor reads those from the constraints file, and verl's must not touch this layer


def build_context(loaded: LoadedMatrix, plan: ImagePlan) -> DockerfileContext:
    matrix = loaded.matrix
    stack = plan.stack
    target = plan.target
    build_args = [(index.arg, index.url) for index in matrix.indexes.values()]
    build_args += [("PIP_EXTRA_INDEX_URL", ""), ("APT_MIRROR", "")]
    used_hosts = {matrix.repos[c.repo].host for c in stack.git_pins().values()}
    used_hosts |= {matrix.repos[c.repo].host for c in (stack.framework_source, stack.sgl_kernel_npu) if c is not None}
    build_args += [(h.arg, h.url) for name, h in matrix.git_hosts.items() if name in used_hosts]
    env_roots, env = cann_env(stack)
    layers = plan.layers
    git_pins = layers.git.pins if layers.git else ()
    git_title = " + ".join([f"{c.name} {c.ref}" for c in plan.git_checkouts] + [p.requirement for p in git_pins])
    constraints = tuple(f"{name}{spec}" for name, spec in sorted(stack.constraints.items()))
    arch_constraints = tuple(
        (arch, tuple(f"{name}{spec}" for name, spec in sorted(stack.constraints_by_arch.get(arch, {}).items())))
        for arch in ARCHES
        if arch in stack.arches
    )
    header = (
        "Generated from compat_matrix.yaml by ascendkit \u2014 do not edit.",
        f"Stack {target.stack_id}: {stack.description}.",
        f"Chip {target.chip_id} ({plan.chip.name}) for SKUs {', '.join(plan.skus)}; {target.os_name}; "
        f"Python {stack.python}; arches {', '.join(stack.arches)}.",
        "Change compat_matrix.yaml or templates/, then run `ascendkit render --all`.",
        "Mirrors: --build-arg BASE_REGISTRY=<host/path> (or BASE_IMAGE=<ref>), PIP_INDEX_URL, "
        + ", ".join(a for a, _ in build_args if a not in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "APT_MIRROR"))
        + ", APT_MIRROR.",
    )
    return DockerfileContext(
        plan=plan,
        header=header,
        base_registry=matrix.base_image.registry,
        base_image=f"${{BASE_REGISTRY}}/{matrix.base_image.repository}:{plan.base_image_tag}",
        build_args=tuple(build_args),
        script_args=_script_args(matrix, stack),
        os_family=os_family(target.os_name),
        system_packages=SYSTEM_PACKAGES[os_family(target.os_name)],
        constraints=constraints,
        arch_constraints=arch_constraints,
        lock_sections={layer: " ".join(section_path(target.stack_id, layer, a) for a in stack.arches) for layer in layers.names},
        env_roots=env_roots,
        env=env,
        steps=layers.head,
        git_checkouts=plan.git_checkouts,
        source_checkout=plan.source_checkout,
        git_step_title=git_title,
        git_pins=git_pins,
        pythonpath_dirs=tuple(c.directory for c in plan.git_checkouts if c.install == "pythonpath"),
        tail_steps=layers.tail,
        last_step=layers.framework,
        patched=bool(stack.patches),
        image_info=json.dumps(_image_info(matrix, plan), sort_keys=True, separators=(",", ":")),
        labels=plan.labels,
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
    env.globals["context_files"] = CONTEXT_FILES
    env.globals["doctor_path"] = DOCTOR_PATH
    env.globals["in_image_cli"] = IN_IMAGE_CLI
    env.globals["image_info_file"] = IMAGE_INFO_FILE
    env.globals["image_locks_dir"] = IMAGE_LOCKS_DIR
    env.globals["installer_arg"] = INSTALLER_ARG
    env.globals["source_date_epoch"] = SOURCE_DATE_EPOCH
    env.globals["git_layer"] = GIT_LAYER
    env.globals["patch_tool"] = PATCH_TOOL
    env.globals["add_user"] = ADD_USER
    env.globals["workspace"] = WORKSPACE
    env.globals["cache_dir"] = BUILD_CACHE_DIR
    return env


def render_dockerfile(loaded: LoadedMatrix, plan: ImagePlan, templates: Path = TEMPLATES_DIR) -> str:
    return render_context(build_context(loaded, plan), templates)


def render_context(ctx: DockerfileContext, templates: Path = TEMPLATES_DIR, *, buildkit: bool = True, secret_mounts: bool = True) -> str:
    """The Dockerfile for ``ctx``: BuildKit's (the committed renders) or, with ``buildkit`` false, the
    classic builder's: the same steps and packages without the cache and secret mounts. With
    ``secret_mounts`` false, BuildKit's without its secret mounts, for the BuildKit releases that read
    and hash a step's whole root filesystem before it runs with one (buildkit/image/buildx.py,
    :func:`serves_secrets`): ascendkit then serves the secrets as it does to the classic builder."""
    ctx = dataclasses.replace(ctx, buildkit=buildkit, secret_mounts=secret_mounts and buildkit)
    env = _environment(templates)
    try:
        template = env.get_template("Dockerfile.j2")
    except jinja2.TemplateNotFound as exc:
        raise InputError(f"{templates}: template {exc.name} not found") from None
    text = template.render(ctx=ctx)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
