"""``ascendkit build``: images through the engine, verified, tagged, and with --push in their registries."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from buildkit.cli.base import (
    ArchChoice,
    JsonFlag,
    WorkingMatrixPath,
    app,
    out,
    print_json,
    user_errors,
)
from buildkit.cli.build_options import (
    BaseImageOption,
    BuilderOption,
    CacheImportOnlyFlag,
    CacheRepoOption,
    DryRunFlag,
    EveryFlag,
    HwOption,
    InstallerOption,
    NoCaBundleFlag,
    NoCacheFlag,
    NoIndexFlag,
    OfflineFlag,
    OsOption,
    PushFlag,
    QuietFlag,
    RepoOption,
    ReverifyFlag,
    StackOption,
    WheelhouseOption,
    plan_options,
)
from buildkit.cli.mirror_options import (
    AptMirror,
    AscendIndexUrl,
    BaseRegistry,
    CaBundle,
    ConfigFile,
    GitcodeUrl,
    GithubUrl,
    PipExtraIndexUrl,
    PipIndexUrl,
    PytorchIndexUrl,
    mirrors_given,
)
from buildkit.cli.ship_options import (
    CompressionOption,
    LazyOption,
    ManifestDir,
    MediaTypesOption,
    RegistriesOption,
    SignKeyOption,
    load_sign_key,
    print_summary,
    to_stderr,
)
from buildkit.cli.tables import RichTable
from buildkit.errors import InputError
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from buildkit.fleet import TargetOutcome
    from buildkit.image.buildplan import BuildPlan, BuildResult
    from buildkit.image.progress import Step
    from buildkit.image.sbom import BaseImage
    from buildkit.matrix.load import LoadedMatrix
    from buildkit.plan import ImagePlan
    from buildkit.ship.request import PushRequest


class StepPrinter:
    """Progress for people on stderr: one line per step (number, instruction, cached, elapsed)."""

    def __init__(self, show_output: bool) -> None:
        self.console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)
        self.show_output = show_output
        self.started = time.monotonic()

    def _clock(self) -> str:
        return f"{time.monotonic() - self.started:6.1f}s"

    def step_started(self, step: Step) -> None:
        instruction = " ".join(step.instruction.split())
        self.console.print(f"{self._clock()}  [{step.number}/{step.total}] {instruction[:120]}")

    def step_finished(self, step: Step) -> None:
        state = "cached" if step.cached else f"done in {step.elapsed:.1f}s"
        self.console.print(f"{self._clock()}  [{step.number}/{step.total}] {state}")

    def output(self, step: Step | None, line: str) -> None:
        if self.show_output:
            self.console.print(f"         | {line[:200]}")

    def note(self, line: str) -> None:
        self.console.print(f"{self._clock()}  {line}")


@app.command("build")
@user_errors
def build(
    hw: HwOption = None,
    every: EveryFlag = False,
    stack: StackOption = None,
    os_name: OsOption = None,
    arch: ArchChoice = None,
    base_image: BaseImageOption = None,
    base_registry: BaseRegistry = None,
    ca_bundle: CaBundle = None,
    no_ca_bundle: NoCaBundleFlag = False,
    pip_index_url: PipIndexUrl = None,
    pip_extra_index_url: PipExtraIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    apt_mirror: AptMirror = None,
    github_url: GithubUrl = None,
    gitcode_url: GitcodeUrl = None,
    config: ConfigFile = None,
    repository: RepoOption = None,
    no_cache: NoCacheFlag = False,
    reverify: ReverifyFlag = False,
    installer: InstallerOption = "uv",
    builder: BuilderOption = "auto",
    cache_repo: CacheRepoOption = None,
    cache_import_only: CacheImportOnlyFlag = False,
    push: PushFlag = False,
    no_index: NoIndexFlag = False,
    registry: RegistriesOption = None,
    media_types: MediaTypesOption = None,
    sign_key: SignKeyOption = None,
    compression: CompressionOption = "gzip",
    lazy: LazyOption = None,
    manifest_dir: ManifestDir = Path("manifests"),
    offline: OfflineFlag = False,
    wheelhouse: WheelhouseOption = None,
    dry_run: DryRunFlag = False,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Build, verify and tag one image (one stack, chip, OS and arch), or with --all every image the
    filters leave; optionally push them."""
    given = dict(locals())  # the options by name, for the helpers that take several of them
    from buildkit.image.buildplan import check_names
    from buildkit.matrix.load import load_matrix

    _check_flags(given)
    pushing = _pushing(given)
    check_names(repository, base_image)  # options every target shares: refused once, not per target
    loaded = load_matrix(matrix)
    options = plan_options(given, mirrors_given(given))
    if every:
        _build_all(loaded, options, stack=stack, hw=hw, os_name=os_name, arch=arch, pushing=pushing, quiet=quiet, as_json=as_json)
    else:
        assert hw is not None
        _build_one(loaded, hw, options, stack=stack, os_name=os_name, arch=arch, pushing=pushing, given=given)


def _check_flags(given: dict[str, Any]) -> None:
    """The flags that only go together (or never do), refused before anything is read."""
    if given["hw"] is None and not given["every"]:
        raise InputError("give --hw (e.g. --hw a3), or --all (narrowed by --stack/--hw/--os/--arch)")
    if given["every"] and given["dry_run"]:
        raise InputError("--all builds; for the list of targets run `ascendkit plan`")
    if given["offline"] != (given["wheelhouse"] is not None):
        raise InputError("--offline and --wheelhouse DIR go together: an offline build installs every package from DIR")


def _pushing(given: dict[str, Any]) -> PushRequest | None:
    """What --push, --registry and their options ask (checked), signed by --sign-key unless a dry run."""
    from buildkit.ship.request import push_request

    media_types = given["media_types"]
    pushing = push_request(
        given["registry"] or [],
        push=given["push"],
        index=not given["no_index"],
        media_types=media_types.value if media_types else None,
        compression=given["compression"],
        signed=given["sign_key"] is not None,
        lazy=given["lazy"],
    )
    return pushing.signed_by(load_sign_key(given["sign_key"])) if pushing is not None and not given["dry_run"] else pushing


def _build_one(
    loaded: LoadedMatrix,
    hw: str,
    options: dict[str, Any],
    *,
    stack: str | None,
    os_name: str | None,
    arch: str | None,
    pushing: PushRequest | None,
    given: dict[str, Any],
) -> None:
    """One target: planned (printed and no more with --dry-run), built, verified, tagged, pushed."""
    from buildkit.image.build import run_build
    from buildkit.image.buildplan import check_outputs, plan_build
    from buildkit.image.engine import connect

    plan = plan_build(loaded, hw, stack=stack, os_name=os_name, arch=arch, **options)
    for warning in plan.warnings:
        typer.echo(f"ascendkit: warning: {warning}", err=True)
    if given["dry_run"]:
        described = plan.describe()
        if given["as_json"]:
            print_json({"dry_run": True, "plan": described})
        else:
            for key, value in described.items():
                out.print(f"{key:>12}: {value}")
        return
    check_outputs(plan)
    client = connect()
    base = None
    if pushing is not None:
        from buildkit.image.build import local_base

        base = local_base(client, plan.base_image)  # once: what the inputs tag is made from is what the record names
        if _reused(client, loaded, plan, pushing, given["as_json"], base):
            return
    typer.echo(
        f"building {plan.refs[0]} ({plan.stack_id}, chip {plan.chip_id}, {plan.os_name}, {plan.arch}) FROM {plan.base_image}", err=True
    )
    result = run_build(client, plan, StepPrinter(show_output=not given["quiet"]), base)
    summary: dict[str, Any] = result.describe()
    verified = "unchanged; its passed verification is reused (--reverify runs it again)" if result.verification == "reused" else "verified"
    for note in result.notes:
        typer.echo(f"ascendkit: note: {note}", err=True)
    typer.echo(
        f"built {result.image_id[:19]} with {_builder_name(result.builder)} in {result.duration_s:.1f}s "
        f"({result.steps_cached}/{result.steps_total} steps cached), {verified}; manifest {result.manifest_md}",
        err=True,
    )
    for ref in result.refs:
        typer.echo(f"tagged {ref}", err=True)
    if pushing is not None:
        from buildkit.ship.request import push_built

        summary.update(push_built(client, loaded, plan, result, pushing, say=to_stderr).describe())
        print_summary([summary])
    summary["digest"] = summary["pushed"][0]["digest"] if summary.get("pushed") else None
    if given["as_json"]:
        print_json(summary)


def _reused(client: Any, loaded: LoadedMatrix, plan: BuildPlan, pushing: PushRequest, as_json: bool, base: BaseImage | None) -> bool:
    """``build --push`` of inputs every registry already holds the image of: tagged, not built."""
    from buildkit.ship.request import reuse_built

    outcome = reuse_built(client, loaded, plan, pushing, say=to_stderr, base=base)
    if outcome is None:
        return False
    pushed = outcome.pushed[0] if outcome.pushed else None
    summary: dict[str, Any] = {"built": False, "arch": plan.arch, "tags": list(plan.refs), **outcome.describe()}
    if pushed is not None:
        typer.echo(f"not built: {pushed.ref} holds the image these inputs publish (found by {outcome.reused})", err=True)
    print_summary([summary])
    summary["digest"] = summary["pushed"][0]["digest"] if summary.get("pushed") else None
    if as_json:
        print_json(summary)
    return True


def _builder_name(builder: str) -> str:
    return "BuildKit" if builder == "buildkit" else "the classic builder"


def _build_all(
    loaded: LoadedMatrix,
    options: dict[str, Any],
    *,
    stack: str | None,
    hw: str | None,
    os_name: str | None,
    arch: str | None,
    pushing: PushRequest | None,
    quiet: bool,
    as_json: bool,
) -> None:
    from buildkit.errors import AscendkitError
    from buildkit.fleet import build_each, exit_code, refused
    from buildkit.image.buildplan import check_outputs, plan_build
    from buildkit.image.engine import connect
    from buildkit.plan import plan_fleet

    fleet = plan_fleet(loaded, stack=stack, hw=hw, os_name=os_name, arch=arch)
    outcomes, builds = [], []
    for image in fleet:
        try:
            builds.append(plan_build(loaded, image.chip_id, stack=image.stack_id, os_name=image.os_name, arch=image.arch, **options))
        except AscendkitError as exc:
            outcomes.append(refused(image, exc))
    for plan in builds[:1]:
        check_outputs(plan)  # one manifest folder for all of them
    client = connect() if builds else None

    def announce(index: int, plan: BuildPlan) -> None:
        typer.echo(f"[{index + 1}/{len(builds)}] building {plan.refs[0]} FROM {plan.base_image}", err=True)
        for warning in plan.warnings:
            typer.echo(f"ascendkit: warning: {warning}", err=True)

    def push(result: BuildResult, plan: BuildPlan) -> str | None:
        from buildkit.ship.request import push_built

        if pushing is None or client is None:
            return None
        pushed = push_built(client, loaded, plan, result, pushing, say=to_stderr).pushed
        return pushed[0].digest if pushed else None

    def failed(name: str, error: AscendkitError) -> None:
        typer.echo(f"ascendkit: {name}: {error}\nascendkit: {name}: nothing was tagged; going on with the next target", err=True)

    if client is not None:  # every target refused: the engine is not needed
        outcomes += build_each(
            client, builds, lambda _: StepPrinter(show_output=not quiet), publish=push, on_start=announce, on_error=failed
        )
    _print_fleet(outcomes, fleet, as_json)
    code = exit_code(outcomes)
    if code:
        raise typer.Exit(code)


def _print_fleet(outcomes: list[TargetOutcome], fleet: list[ImagePlan], as_json: bool) -> None:
    """Every target's outcome, in the fleet's order: a table on stderr, and with --json the list."""
    order = {f"{p.stack_id} {p.chip_id} {p.os_name} {p.arch}": i for i, p in enumerate(fleet)}
    outcomes.sort(key=lambda o: order[o.name])
    if as_json:
        print_json([o.describe() for o in outcomes])
    table = RichTable(title=f"ascendkit build --all: {sum(o.result == 'built' for o in outcomes)} of {len(outcomes)} built")
    for column in ("target", "result", "time", "size", "digest / image", "detail"):
        table.add_column(column)
    for o in outcomes:
        size = f"{o.size / 1e9:.2f} GB" if o.size else ""
        table.add_row(
            o.name,
            o.result.upper() if o.result != "built" else o.result,
            f"{o.seconds:.1f}s",
            size,
            (o.digest or o.image_id or "")[:19],
            o.message,
        )
    Console(stderr=True, highlight=False, width=200).print(table)
