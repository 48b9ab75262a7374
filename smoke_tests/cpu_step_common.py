"""What the CPU run's training-step programs (cpu_step_*.py) share: their command line, the laps they time, the
single-process gloo group they run in, and the result they write. Standard library only (torch where the group is
made); imported from beside them, in the image or in a CPU environment."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Laps:
    """Seconds per part of a step, in order."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.mark = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self.mark, 2)
        self.mark = now


def single_process_group() -> None:
    """World size 1 over gloo, as the frameworks' own CPU tests run their pieces."""
    import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(
    description: str,
    default_module: str,
    step: Callable[[str, list[str]], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
    argv: list[str] | None = None,
) -> int:
    """``PROGRAM --out RESULT.json [--module M] -- ARG...``: runs ``step(module, args)`` and writes its result, with
    the seconds it took, to RESULT.json (whole or not at all)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--module", default=default_module, help=f"the job's entry point (default {default_module})")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the job's own arguments, after --")
    args = parser.parse_args(argv)
    arguments = args.arguments[1:] if args.arguments[:1] == ["--"] else args.arguments
    started = time.monotonic()
    result = step(args.module, arguments)
    result["seconds"] = round(time.monotonic() - started, 1)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"{Path(sys.argv[0]).stem}: {summary(result)}")
    return 0
