"""Run an OpenRLHF entry point up to the moment it would start Ray, and print the arguments it parsed.

OpenRLHF builds its argument parser inline, under ``if __name__ == "__main__":``, checks the
arguments right after parsing them, and then calls ``train(args)``, whose first act is
``ray.init``. This runs the module as ``__main__`` (exactly as ``python3 -m MODULE`` would) with
``ray.init`` replaced by a stop, so OpenRLHF's own parser and its own start-up assertions judge the
command, and nothing starts Ray, loads a model or touches an NPU:

    python3 openrlhf_args.py MODULE ARG...

Prints ``ASCENDKIT-ARGS {json}``, the arguments as ``train`` receives them, and exits 0.
Otherwise OpenRLHF speaks for itself: argparse's usage and error (exit 2), or the assertion's
traceback (exit 1). Standard library and the image's own Ray only; runs inside the image.
"""

from __future__ import annotations

import json
import runpy
import sys
from typing import Any

MARK = "ASCENDKIT-ARGS "


class _Stop(BaseException):
    """Raised where ``train`` would start Ray; carries the parsed arguments. Not an Exception, so
    no ``except Exception`` on the way up can swallow it."""


def _stop(*_args: Any, **_kwargs: Any) -> None:
    caller = sys._getframe(1)  # train(args): the function that would start Ray
    raise _Stop(caller.f_locals.get("args"))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: openrlhf_args.py MODULE ARG...", file=sys.stderr)
        return 2
    module, *arguments = argv
    import ray  # type: ignore[import-not-found,unused-ignore]  # the image's; the dev tools install it too

    ray.init = _stop
    ray.is_initialized = lambda: False
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Stop as stop:
        parsed = stop.args[0] if stop.args else None
        if parsed is None or not hasattr(parsed, "__dict__"):
            print(f"ascendkit: {module} called ray.init without its parsed arguments at hand", file=sys.stderr)
            return 3
        print(MARK + json.dumps(vars(parsed), sort_keys=True, default=str), flush=True)
        return 0
    print(f"ascendkit: {module} ran to its end without starting Ray: not an OpenRLHF training entry point", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
