"""A stack's lock sections installed in a container the way the image's pip layers install them.

The image's own installer function (``ascendkit_install`` in build-env.sh) runs once per layer, in
build order, offline from a wheelhouse (``PIP_NO_INDEX``/``PIP_FIND_LINKS``, as an offline build's
served env sets them). Shared by the arm64 layers test and bench_build's pip-vs-uv comparison, so
what is measured is what is tested.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import docker

from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import INSTALLER_ARG, section_path, stack_layers

ROOT = Path(__file__).resolve().parents[2]
BUILD_ENV = ROOT / "buildkit/image/files/build-env.sh"
SECONDS_MARK = "ASCENDKIT_INSTALL_SECONDS="

SCRIPT = """\
set -euo pipefail
{setup}
mkdir -p /etc/ascendkit/locks && cp /mnt/sections/*.txt /etc/ascendkit/locks/ && : > /etc/ascendkit/constraints.txt
export ASCENDKIT_ARCHES={arch} PIP_NO_INDEX=1 PIP_FIND_LINKS=/mnt/wheelhouse PIP_ROOT_USER_ACTION=ignore
export {installer_arg}={installer} ASCENDKIT_COMPILE_BYTECODE={compile}
. /mnt/files/build-env.sh
start=$EPOCHREALTIME
{steps}
echo "{mark}$(python3 -c "print(round($EPOCHREALTIME - $start, 2))")"
python3 -m pip check
"""


def write_sections(loaded: LoadedMatrix, stack_id: str, arch: str, directory: Path, drop: frozenset[str] = frozenset()) -> list[Path]:
    """The stack's lock sections for ``arch``, named as in the image, without the packages in ``drop``
    (source builds that need CANN)."""
    written = []
    for layer in stack_layers(loaded.matrix.stacks[stack_id], loaded.matrix.installer).names:
        relative = section_path(stack_id, layer, arch)
        kept, skip = [], False
        for line in (loaded.root / relative).read_text(encoding="utf-8").splitlines():
            if re.match(r"^[A-Za-z0-9]", line):
                skip = line.split("==")[0] in drop
            if not skip:
                kept.append(line)
        path = directory / Path(relative).name
        path.write_text("\n".join(kept) + "\n", encoding="utf-8")
        written.append(path)
    return written


def install_script(
    loaded: LoadedMatrix, stack_id: str, arch: str, installer: str, setup: str = "", *, compile_bytecode: bool = True
) -> str:
    """One ``ascendkit_install`` per layer with the layer's own installer setting (pip installs uv
    itself), the rest by ``installer``; ``setup`` runs first and is not timed. Bytecode is compiled,
    as in the image, unless ``compile_bytecode`` is false."""
    steps = []
    for layer in stack_layers(loaded.matrix.stacks[stack_id], loaded.matrix.installer).all:
        settings = "".join(f"{name}={value} " for name, value in layer.env if name == INSTALLER_ARG)
        steps.append(f"echo 'installing {layer.name}'; {settings}ascendkit_install {layer.name}")
    return SCRIPT.format(
        setup=setup,
        arch=arch,
        installer_arg=INSTALLER_ARG,
        installer=installer,
        compile=int(compile_bytecode),
        steps="\n".join(steps),
        mark=SECONDS_MARK,
    )


@dataclass(frozen=True)
class Installed:
    container: str  # left for the caller to commit or remove
    exit_code: int
    log: str
    seconds: float  # the ascendkit_install calls alone (no setup, no pip check)


def run_install(
    client: docker.APIClient,
    base: str,
    script: str,
    sections: Path,
    wheelhouse: Path,
    extra_binds: Mapping[str, str] | None = None,
    timeout: int = 1800,
) -> Installed:
    """Run ``script`` in a container of ``base`` with the sections, the wheelhouse and build-env.sh
    mounted; ``extra_binds`` maps more host directories to container paths (read-only)."""
    binds: dict[str, Mapping[str, str]] = {
        str(wheelhouse): {"bind": "/mnt/wheelhouse", "mode": "ro"},
        str(sections): {"bind": "/mnt/sections", "mode": "ro"},
        str(BUILD_ENV.parent): {"bind": "/mnt/files", "mode": "ro"},
        **{host: {"bind": path, "mode": "ro"} for host, path in (extra_binds or {}).items()},
    }
    container = client.create_container(base, command=["bash", "-c", script], host_config=client.create_host_config(binds=binds))
    try:
        start = time.perf_counter()
        client.start(container)
        code = client.wait(container, timeout=timeout)["StatusCode"]
        elapsed = time.perf_counter() - start
        log = client.logs(container).decode("utf-8", "replace")
    except BaseException:
        client.remove_container(container, force=True)
        raise
    marks = re.findall(rf"^{SECONDS_MARK}([0-9.]+)$", log, re.M)
    return Installed(container["Id"], code, log, float(marks[-1]) if marks else elapsed)
