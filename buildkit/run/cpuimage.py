"""``ascendkit smoke --cpu``: the CPU run of a built image's smoke job, in a container of the image, on
any host with the engine and no NPU, so an image is checked before NPU time is spent on it.

Each program of the run is a container of the image as its own user, with smoke_tests/ mounted
read-only and a work directory under ``--out`` read-write; nothing else of the host, no devices and
no network (the run downloads nothing: the model is made in it, the data generated).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import docker

from buildkit.errors import OutputError
from buildkit.matrix.model import Sku
from buildkit.resources import SMOKE_DIR
from buildkit.run.container import run_container
from buildkit.run.cpurun import CpuRun, run_cpu, write_report
from buildkit.run.devices import image_user
from buildkit.run.job import OUT_DIR, SMOKE_FILES, JobFacts
from buildkit.run.smoke import _image_labels, check_image_chip, image_job_of

WORK_DIR = f"{OUT_DIR}/cpu-work"


@dataclass
class ImagePlace:
    """A container of the image per program, its work directory bind-mounted."""

    client: docker.APIClient
    image_id: str
    work: Path
    user: str
    description: str
    smoke_dir: str = SMOKE_FILES
    work_dir: str = WORK_DIR

    def run(self, argv: list[str], env: dict[str, str], log: Path, timeout: float, stdout: Path | None = None) -> int | None:
        part = log.with_name(log.name + ".part")
        binds = {str(SMOKE_DIR): {"bind": SMOKE_FILES, "mode": "ro"}, str(self.work.resolve()): {"bind": WORK_DIR, "mode": "rw"}}
        result = run_container(
            self.client,
            self.image_id,
            argv,
            log_path=part,
            deadline=time.monotonic() + timeout,
            environment={**env, "HOME": f"{WORK_DIR}/home"},
            host_config={"binds": binds, "network_mode": "none", "shm_size": "2g"},
            user=self.user,
            want_stdout=stdout is not None,
        )
        with log.open("ab") as out:
            out.write(part.read_bytes())
        part.unlink()
        if stdout is not None:
            stdout.write_text(result.stdout, encoding="utf-8")
        return result.exit_code


def run_cpu_image(
    client: docker.APIClient,
    ref: str,
    sku_id: str,
    chip_id: str,
    sku: Sku,
    facts: JobFacts,
    out: Path,
    job: str,
    *,
    bound: float,
    as_root: bool = False,
    progress: object = None,
) -> CpuRun:
    """The CPU run of ``job`` in the image ``ref``; writes cpu-report.json and .md to ``out``."""
    image_id, labels, config_user, _env = _image_labels(client, ref)
    image = image_job_of(labels, check_image_chip(ref, labels, sku_id, chip_id))
    name, uid, gid = ("root", 0, 0) if as_root else image_user(labels, config_user)
    work = out / "cpu-work"
    try:
        work.mkdir(parents=True, exist_ok=True)
        (work / "home").mkdir(exist_ok=True)
        for path in (work, work / "home"):
            if os.geteuid() == 0:
                os.chown(path, uid, gid)
            else:
                path.chmod(0o777)  # the image's user writes the model, data and logs there
    except OSError as exc:
        raise OutputError(f"--out {out}: cannot prepare the CPU run's work directory: {exc.strerror}") from None
    place = ImagePlace(client, image_id, work, f"{uid}:{gid}", f"a container of {ref} as {name}, no network, no devices")
    say = progress if callable(progress) else None
    run = run_cpu(place, work, image, job, sku, facts, bound=bound, progress=say)
    write_report(out, [run])
    return run
