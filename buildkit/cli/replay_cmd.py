"""``ascendkit baseline replay`` and ``ascendkit baseline seal``: the GPU side of a deterministic replay, as a bundle."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from buildkit.cli.base import MatrixPath, out, user_errors
from buildkit.cli.metrics_cmd import baseline_app
from buildkit.errors import InputError
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run import MAX_STEPS


@baseline_app.command("replay")
@user_errors
def baseline_replay(
    hw: Annotated[str, typer.Option("--hw", help="The NPU SKU the bundle will be replayed on: {skus} (its NPUs size the batch).")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, max=64, help="GPUs per node on the GPU machine (they must split the batch).")],
    bundle: Annotated[Path, typer.Option("--out", help="A new or empty directory for the bundle.")],
    stack: Annotated[str | None, typer.Option("--stack", help="The stack whose image replays it (default: the matrix's default).")] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="Steps (default: 5; verl 0.6 and 0.7 replay one, their default).")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data", exists=True, file_okay=False, help="train.parquet/test.parquet to train on (default: generated as smoke does)."
        ),
    ] = None,
    run: Annotated[bool, typer.Option("--run", help="Run it here (a GPU machine with the stack's verl) and seal the bundle.")] = False,
    model: Annotated[
        Path | None, typer.Option("--model", exists=True, file_okay=False, help="With --run: the model directory (Qwen2.5-0.5B-Instruct).")
    ] = None,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Compose the GPU run of a deterministic replay for a stack's verl and the NPU SKU it is for, and write it as a
    bundle: run.sh (the exact command and environment; it needs bash and the stack's verl) and its plan. The run adds
    its log, verl's rollout dumps, the composed config and the versions; `baseline seal` checks and seals them, and
    `smoke --baseline BUNDLE` replays them on the NPU. See docs/smoke.md, "Precision alignment"."""
    from buildkit.matrix.load import load_matrix, resolve_sku
    from buildkit.run.job import ImageJob, JobFacts
    from buildkit.run.replay import compose_replay
    from buildkit.run.replaybundle import DATA, HERE, MODEL, SCRIPT, ReplayPlan, write_bundle
    from buildkit.run.smokerequest import check_data_dir

    loaded = load_matrix(matrix)
    sku_id, sku, _ = resolve_sku(loaded, hw, "a replay is sized by the NPU SKU it is for")
    stack_id = stack or loaded.default_stack()
    if stack_id not in loaded.matrix.stacks:
        raise InputError(f"--stack {stack_id!r}: stacks: {', '.join(loaded.matrix.stacks)}")
    if run and model is None:
        raise InputError("--run needs --model: the model directory the GPU run trains (the NPU run must use the same)")
    if data is not None:
        check_data_dir(data)
    st = loaded.matrix.stacks[stack_id]
    sides = compose_replay(
        sku, ImageJob.of(stack_id, st), facts=JobFacts.of(loaded.matrix.compat), gpus=gpus, steps=steps,
        expansion_mode=st.env.get("HCCL_OP_EXPANSION_MODE"), model=MODEL, data=f"{HERE}/{DATA}", dump_dir=f"{HERE}/dump",
    )  # fmt: skip
    plan = ReplayPlan.of(sides, stack=stack_id, sku=sku_id, version=st.framework_version)
    write_bundle(bundle, plan, data)
    typer.echo(f"wrote {bundle}: verl {plan.version}, {plan.steps} step(s) on {gpus} GPU(s), for {stack_id} on {sku_id}", err=True)
    script = bundle / SCRIPT
    if not run:
        where, weights = shlex.quote(str(bundle)), "/path/to/Qwen2.5-0.5B-Instruct"
        out.print(f"GPU machine:  MODEL={weights} bash {shlex.quote(str(script))}")
        out.print(f"then:         ascendkit baseline seal {where} --model {weights}")
        out.print(f"NPU host:     ascendkit smoke --hw {sku_id} --stack {stack_id} --baseline {where} --model-path {weights}")
        return
    done = subprocess.run(["bash", str(script)], env={**os.environ, "MODEL": str(model)}, check=False)
    if done.returncode != 0:
        raise InputError(f"{script} exited {done.returncode}; the bundle is left unsealed (its log: {bundle / 'run.log'})")
    _seal(bundle, model)


def _seal(bundle: Path, model: Path | None) -> None:
    from buildkit.run.replaybundle import seal

    manifest = seal(bundle, model)
    typer.echo(f"sealed {bundle}: {manifest['steps']} steps, {len(manifest['files'])} files", err=True)


@baseline_app.command("seal")
@user_errors
def baseline_seal(
    bundle: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="A bundle whose run.sh has run.")],
    model: Annotated[
        Path | None,
        typer.Option("--model", exists=True, file_okay=False, help="The model the GPU run trained: its files' sha256 go in the manifest."),
    ] = None,
) -> None:
    """Check a replay bundle after its GPU run (the log's steps, verl's dumps, the composed names, the versions) and write
    manifest.json with the sha256 of every file; `smoke --baseline` refuses a bundle that differs from it."""
    _seal(bundle, model)
