"""The ``ascendkit`` command: a thin layer that parses options, calls one function, prints the result.

User mistakes are printed as messages (never tracebacks) and mapped to the exit codes in
:class:`buildkit.errors.ExitCode`.
"""

from __future__ import annotations

import enum
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table as RichTable

from buildkit import __version__, generate, tables
from buildkit.availability import PinCheck, check_matrix, summarize
from buildkit.build import DEFAULT_REPOSITORY, plan_build, run_build
from buildkit.engine import connect
from buildkit.errors import AscendkitError, ExitCode, Finding, InputError, MatrixError
from buildkit.fsio import write_atomic
from buildkit.matrix import DEFAULT_MATRIX, load_matrix, resolve_stack
from buildkit.model import ARCHES
from buildkit.pkgindex import IndexClient
from buildkit.progress import Step
from buildkit.publish import LocalImage, load_local_image, missing_arches, publish_index, push_image
from buildkit.registry import Registry, RegistryRef
from buildkit.render import all_targets, base_image_ref, plan_target, render_dockerfile
from buildkit.secrets import default_ca_bundle
from buildkit.settings import resolve_mirrors

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="ascendkit",
    help="Build, verify and ship verl-on-Ascend container images from one compatibility matrix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
matrix_app = typer.Typer(help="Inspect and validate compat_matrix.yaml.", no_args_is_help=True)
app.add_typer(matrix_app, name="matrix")

MatrixPath = Annotated[
    Path,
    typer.Option("--matrix", "-m", help="Path of the compatibility matrix.", envvar="ASCENDKIT_MATRIX"),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ArchChoice = Annotated[str | None, typer.Option("--arch", help="aarch64 or x86_64 (build default: this machine's).")]
PipIndexUrl = Annotated[str | None, typer.Option("--pip-index-url", help="PyPI mirror; credentials in a URL stay out of the image.")]
PipExtraIndexUrl = Annotated[str | None, typer.Option("--pip-extra-index-url", help="Extra index(es), space separated.")]
PytorchIndexUrl = Annotated[str | None, typer.Option("--pytorch-index-url", help="Mirror of the PyTorch CPU index (x86_64 torch).")]
AscendIndexUrl = Annotated[str | None, typer.Option("--ascend-index-url", help="Mirror of Ascend's pip index.")]
CaBundle = Annotated[
    Path | None, typer.Option("--ca-bundle", help="PEM bundle for pip (default: $PIP_CERT or $SSL_CERT_FILE); never stored in an image.")
]
ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="Mirror settings file (default: $ASCENDKIT_CONFIG, ./ascendkit.toml, ~/.config/ascendkit/config.toml)."),
]

# Piped output is not cut to 80 columns: tables stay readable in logs and CI.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"ascendkit: {message}", err=True)
    return typer.Exit(int(code))


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn :class:`AscendkitError` into a message on stderr and its documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except MatrixError as exc:
            typer.echo(exc.format(), err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except AscendkitError as exc:
            raise _fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise _fail("interrupted", ExitCode.INTERRUPTED) from None

    return wrapper


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "file": str(f.location.path),
        "line": f.location.line,
        "column": f.location.column,
        "field": f.field,
        "message": f.message,
        "valid": f.hint,
        "rule": f.rule,
        "severity": f.severity,
    }


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ascendkit {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Exit codes: 0 ok, 1 check failed (drift), 2 invalid input, 3 output not writable,
    4 engine/base image/registry unavailable, 5 build failed, 6 verification failed,
    7 publish failed, 130 interrupted."""


# ---- matrix ----------------------------------------------------------------------------------


@matrix_app.command("validate")
@user_errors
def matrix_validate(matrix: MatrixPath = DEFAULT_MATRIX, as_json: JsonFlag = False) -> None:
    """Check the matrix's structure and every compatibility rule; report all problems at once."""
    try:
        loaded = load_matrix(matrix)
    except MatrixError as exc:
        if not as_json:
            raise
        errors = [f for f in exc.findings if f.severity == "error"]
        warnings = [f for f in exc.findings if f.severity != "error"]
        _print_json({"valid": False, "errors": [_finding_json(f) for f in errors], "warnings": [_finding_json(f) for f in warnings]})
        raise typer.Exit(int(ExitCode.INVALID_INPUT)) from None
    m = loaded.matrix
    if as_json:
        _print_json({"valid": True, "errors": [], "warnings": [_finding_json(f) for f in loaded.warnings]})
        return
    for warning in loaded.warnings:
        typer.echo(warning.format(), err=True)
    out.print(
        f"{matrix}: valid — {len(m.stacks)} stacks (default {loaded.default_stack()}), "
        f"{len(m.skus)} SKUs, {len(m.chips)} chips, {len(loaded.warnings)} warning(s)"
    )


@matrix_app.command("list")
@user_errors
def matrix_list(matrix: MatrixPath = DEFAULT_MATRIX, as_json: JsonFlag = False) -> None:
    """List the release lines (stacks)."""
    loaded = load_matrix(matrix)
    rows = [
        {
            "stack": name,
            "default": s.default,
            "cann": s.cann,
            "python": s.python,
            "torch_npu": s.torch_npu.version,
            "vllm_ascend": s.vllm_ascend.version,
            "verl": s.verl.version,
            "os": list(s.os),
            "arches": list(s.arches),
            "skus": list(s.skus),
        }
        for name, s in loaded.matrix.stacks.items()
    ]
    if as_json:
        _print_json(rows)
        return
    table = RichTable(title=f"Stacks in {matrix}")
    for column in ("stack", "CANN", "Python", "torch_npu", "vllm-ascend", "verl", "OS", "arches", "SKUs"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            f"{r['stack']} (default)" if r["default"] else str(r["stack"]),
            str(r["cann"]),
            str(r["python"]),
            str(r["torch_npu"]),
            str(r["vllm_ascend"]),
            str(r["verl"]),
            ", ".join(r["os"]),  # type: ignore[arg-type]
            ", ".join(r["arches"]),  # type: ignore[arg-type]
            ", ".join(r["skus"]),  # type: ignore[arg-type]
        )
    out.print(table)


@matrix_app.command("show")
@user_errors
def matrix_show(
    stack: Annotated[str, typer.Argument(help="Stack id, e.g. cann8.3.")],
    matrix: MatrixPath = DEFAULT_MATRIX,
    as_json: JsonFlag = False,
) -> None:
    """Show every pin of one stack, its base images and known issues."""
    loaded = load_matrix(matrix)
    name, s = resolve_stack(loaded, stack)
    m = loaded.matrix
    chips = sorted({m.skus[k].chip for k in s.skus})
    bases = {f"{chip}/{os_name}": base_image_ref(m, s, chip, os_name) for chip in chips for os_name in s.os}
    issues = [
        {"severity": i.severity, "reason": i.reason}
        for i in m.compat.known_issues
        if i.torch_npu == s.torch_npu.version and i.cann == s.cann
    ]
    data = {"stack": name, **s.model_dump(mode="json", exclude_none=True), "base_images": bases, "known_issues": issues}
    if as_json:
        _print_json(data)
        return
    table = RichTable(title=f"{name}{' (default)' if s.default else ''}: {s.description}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key in ("cann", "python", "os", "arches", "skus", "atb_cxx_abi"):
        value = getattr(s, key)
        table.add_row(key, ", ".join(value) if isinstance(value, tuple) else str(value))
    for component, pin in s.pins().items():
        extra = [f"index {pin.index}"] + [f"{a}: {i}" for a, i in pin.index_by_arch.items()]
        if pin.build_from_source:
            extra.append("built from sdist")
        table.add_row(component, f"{pin.version}  ({'; '.join(extra)})")
    for component, git in s.git_pins().items():
        repo = m.repos[git.repo]
        table.add_row(component, f"{git.ref}  ({m.git_hosts[repo.host].url}/{repo.path}, {git.install})")
    for pkg, spec in s.constraints.items():
        table.add_row(f"constraint {pkg}", spec)
    for arch, specs in s.constraints_by_arch.items():
        for pkg, spec in specs.items():
            table.add_row(f"constraint {pkg} ({arch})", spec)
    for key, value in s.env.items():
        table.add_row(f"env {key}", value)
    for label, ref in bases.items():
        table.add_row(f"base {label}", ref)
    for issue in issues:
        table.add_row(f"known issue ({issue['severity']})", issue["reason"])
    out.print(table)


@matrix_app.command("verify")
@user_errors
def matrix_verify(
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Only this stack; default: all.")] = None,
    arch: ArchChoice = None,
    index: Annotated[
        list[str] | None, typer.Option("--index", help="NAME=URL: ask this mirror instead of the matrix's index NAME (repeatable).")
    ] = None,
    ca_bundle: Annotated[
        Path | None, typer.Option("--ca-bundle", help="PEM bundle for the indexes (default: $PIP_CERT/$SSL_CERT_FILE).")
    ] = None,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Check that every pin exists on its index for each arch and Python (exit 1: missing, 8: unverified)."""
    loaded = load_matrix(matrix)
    stacks = [resolve_stack(loaded, stack)[0]] if stack else None
    if arch is not None and arch not in ARCHES:
        raise InputError(f"--arch {arch!r}: choose one of {', '.join(ARCHES)}")
    overrides = {}
    for item in index or []:
        name, sep, url = item.partition("=")
        if not sep or name not in loaded.matrix.indexes or not url.startswith(("http://", "https://")):
            raise InputError(f"--index {item!r}: expected NAME=URL with NAME one of {', '.join(loaded.matrix.indexes)}")
        overrides[name] = url.rstrip("/")
    client = IndexClient(ca_bundle=ca_bundle or default_ca_bundle())
    checks = check_matrix(loaded.matrix, client, stacks=stacks, arches=[arch] if arch else None, index_urls=overrides)
    counts = summarize(checks)
    code = ExitCode.CHECK_FAILED if counts["missing"] else ExitCode.UNVERIFIED if counts["unverified"] else ExitCode.OK
    if as_json:
        _print_json({"summary": counts, "exit_code": int(code), "results": [c.describe() for c in checks]})
    else:
        _print_verify_table(checks, counts)
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


_MARK = {"found": "✓", "missing": "✗", "unverified": "?"}


def _print_verify_table(checks: list[PinCheck], counts: dict[str, int]) -> None:
    components = list(dict.fromkeys(c.component for c in checks))
    table = RichTable(title="Pins on their indexes (✓ found, ✗ missing, ? unverified: index unreachable)")
    table.add_column("stack / arch")
    for component in components:
        table.add_column(component.replace("_", "-"), justify="center")
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for c in checks:
        rows.setdefault((c.stack, c.arch), {})[c.component] = _MARK[c.status]
    for (stack_id, arch_name), cells in rows.items():
        table.add_row(f"{stack_id} / {arch_name}", *(cells.get(component, "") for component in components))
    out.print(table)
    for c in checks:
        if c.status != "found":
            out.print(f"{_MARK[c.status]} {c.stack} {c.arch} {c.package}=={c.version}: {c.detail}")
    out.print(f"{counts['found']} found, {counts['missing']} missing, {counts['unverified']} unverified")


class TableFormatChoice(str, enum.Enum):
    md = "md"
    rst = "rst"


@matrix_app.command("table")
@user_errors
def matrix_table(
    fmt: Annotated[TableFormatChoice, typer.Option("--format", "-f", help="Markdown or reStructuredText.")] = TableFormatChoice.md,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Print the support tables (release lines and SKUs) generated from the matrix."""
    loaded = load_matrix(matrix)
    sys.stdout.write(tables.support_tables(loaded.matrix, fmt.value))


@matrix_app.command("schema")
@user_errors
def matrix_schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the matrix (for editor completion and validation)."""
    text = generate.schema_text()
    if output is None:
        sys.stdout.write(text)
    else:
        write_atomic(output, text)


# ---- render ----------------------------------------------------------------------------------


@app.command("render")
@user_errors
def render(
    hw: Annotated[str | None, typer.Option("--hw", help="SKU (a2-box16, 900-podc, a3) or chip family (a2, a3).")] = None,
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Stack id; default: the matrix's default stack.")] = None,
    os_name: Annotated[str | None, typer.Option("--os", help="Base OS; default: the stack's first OS.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    render_all: Annotated[bool, typer.Option("--all", help="Write every generated file (Dockerfiles, schema, README tables).")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Re-render everything in memory (with or without --all); exit 1 with a diff if a file differs.")
    ] = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Render a Dockerfile for one SKU, or (with --all / --check) every generated file."""
    if (render_all or check) and (hw or stack or os_name or output):
        raise InputError("--all/--check cover every stack and SKU; drop --hw/--stack/--os/--output")
    if not (render_all or check) and hw is None:
        raise InputError("give --hw (e.g. --hw a3), or --all / --check")
    loaded = load_matrix(matrix)
    if check:
        diffs = generate.check(loaded)
        if diffs:
            sys.stdout.write("".join(diffs))
            typer.echo(f"ascendkit: {len(diffs)} generated file(s) are out of date; run `ascendkit render --all`", err=True)
            raise typer.Exit(int(ExitCode.CHECK_FAILED))
        count = len(generate.expected_outputs(loaded))
        typer.echo(f"ascendkit: {count} generated files are up to date", err=True)
        return
    if render_all:
        touched = generate.write_all(loaded)
        for path in touched:
            typer.echo(f"wrote {path}", err=True)
        typer.echo(f"ascendkit: {len(all_targets(loaded))} Dockerfiles rendered, {len(touched)} file(s) changed", err=True)
        return
    assert hw is not None
    target = plan_target(loaded, hw, stack, os_name)
    text = render_dockerfile(loaded, target)
    if output is None:
        sys.stdout.write(text)
    else:
        write_atomic(output, text)
        typer.echo(f"wrote {output} ({target.stack_id}, chip {target.chip_id}, {target.os_name})", err=True)


# ---- build and publish -----------------------------------------------------------------------


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


RegistryOption = Annotated[str | None, typer.Option("--registry", help="Push target HOST[:PORT]/REPO, e.g. 127.0.0.1:5000/ascendkit.")]
ManifestDir = Annotated[Path, typer.Option("--manifest-dir", help="Where build manifests are written and read.")]


def _publish(client: Any, image: LocalImage, target: RegistryRef, *, want_index: bool, require_index: bool) -> dict[str, Any]:
    registry = Registry(target.host)
    pushed = push_image(client, image, target, registry)
    for p in pushed:
        typer.echo(f"pushed {p.ref}", err=True)
    result: dict[str, Any] = {"pushed": [p.describe() for p in pushed], "index": None, "index_missing": []}
    if not want_index:
        return result
    missing = missing_arches(registry, target, image)
    if missing and not require_index:
        result["index_missing"] = missing
        typer.echo(
            f"multi-arch index not published yet: {', '.join(missing)} missing in {target.name} "
            f"(build with --arch {missing[0]} --push, or `ascendkit publish` both images)",
            err=True,
        )
        return result
    index = publish_index(registry, target, image)
    for p in index:
        typer.echo(f"published index {p.ref}", err=True)
    result["index"] = [p.describe() for p in index]
    return result


@app.command("build")
@user_errors
def build(
    hw: Annotated[str, typer.Option("--hw", help="SKU (a2-box16, 900-podc, a3) or chip family (a2, a3).")],
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Stack id; default: the matrix's default.")] = None,
    os_name: Annotated[str | None, typer.Option("--os", help="Base OS; default: the stack's first.")] = None,
    arch: ArchChoice = None,
    base_image: Annotated[str | None, typer.Option("--base-image", help="Build FROM this image instead of the official CANN base.")] = None,
    base_registry: Annotated[
        str | None, typer.Option("--base-registry", help="Mirror of the CANN images, HOST/PATH (e.g. quay.nju.edu.cn/ascend).")
    ] = None,
    ca_bundle: CaBundle = None,
    no_ca_bundle: Annotated[bool, typer.Option("--no-ca-bundle", help="Do not pass the host's CA bundle.")] = False,
    pip_index_url: PipIndexUrl = None,
    pip_extra_index_url: PipExtraIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    apt_mirror: Annotated[str | None, typer.Option("--apt-mirror", help="OS package mirror (serves /ubuntu, /ubuntu-ports, ...).")] = None,
    github_url: Annotated[str | None, typer.Option("--github-url", help="GitHub mirror for source checkouts.")] = None,
    gitcode_url: Annotated[str | None, typer.Option("--gitcode-url", help="gitcode mirror for source checkouts.")] = None,
    config: ConfigFile = None,
    repository: Annotated[str, typer.Option("--repo", help="Local image repository to tag.")] = DEFAULT_REPOSITORY,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")] = False,
    push: Annotated[bool, typer.Option("--push", help="Push the verified image to --registry, by digest.")] = False,
    registry: RegistryOption = None,
    manifest_dir: ManifestDir = Path("manifests"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; do not build.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Show steps only, not their output.")] = False,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Build, verify and tag one image (one stack, chip, OS and arch); optionally push it."""
    if push and not registry:
        raise InputError("--push needs --registry HOST[:PORT]/REPO")
    target = RegistryRef.parse(registry) if registry else None
    loaded = load_matrix(matrix)
    mirrors = resolve_mirrors(
        {
            "pip_index_url": pip_index_url,
            "pip_extra_index_url": pip_extra_index_url,
            "pytorch_index_url": pytorch_index_url,
            "ascend_index_url": ascend_index_url,
            "apt_mirror": apt_mirror,
            "github_url": github_url,
            "gitcode_url": gitcode_url,
            "base_registry": base_registry,
            "ca_bundle": str(ca_bundle) if ca_bundle else None,
        },
        config=config,
    )
    plan = plan_build(
        loaded,
        hw,
        stack=stack,
        os_name=os_name,
        arch=arch,
        base_image=base_image,
        mirrors=mirrors,
        use_default_ca=not no_ca_bundle,
        repository=repository,
        no_cache=no_cache,
        manifest_dir=manifest_dir,
    )
    if dry_run:
        described = plan.describe()
        if as_json:
            _print_json({"dry_run": True, "plan": described})
        else:
            for key, value in described.items():
                out.print(f"{key:>12}: {value}")
        return
    client = connect()
    typer.echo(
        f"building {plan.refs[0]} ({plan.stack_id}, chip {plan.chip_id}, {plan.os_name}, {plan.arch}) FROM {plan.base_image}", err=True
    )
    result = run_build(client, plan, StepPrinter(show_output=not quiet))
    summary: dict[str, Any] = result.describe()
    typer.echo(
        f"built and verified {result.image_id[:19]} in {result.duration_s:.1f}s "
        f"({result.steps_cached}/{result.steps_total} steps cached); manifest {result.manifest_md}",
        err=True,
    )
    for ref in result.refs:
        typer.echo(f"tagged {ref}", err=True)
    if push and target is not None:
        image = LocalImage(result.image_id, plan.arch, tuple(loaded.matrix.stacks[plan.stack_id].arches), plan.tags)
        summary.update(_publish(client, image, target, want_index=True, require_index=False))
    summary["digest"] = summary["pushed"][0]["digest"] if summary.get("pushed") else None
    if as_json:
        _print_json(summary)


@app.command("publish")
@user_errors
def publish(
    images: Annotated[list[str], typer.Argument(help="Local images built by ascendkit (any of their tags).")],
    registry: Annotated[str, typer.Option("--registry", help="HOST[:PORT]/REPO to push to.")],
    no_index: Annotated[bool, typer.Option("--no-index", help="Push the per-arch images only.")] = False,
    manifest_dir: ManifestDir = Path("manifests"),
    as_json: JsonFlag = False,
) -> None:
    """Push verified images by digest, then the multi-arch index (refused if an arch is missing)."""
    target = RegistryRef.parse(registry)
    client = connect()
    local = [load_local_image(client, ref, manifest_dir) for ref in images]
    results = []
    for i, image in enumerate(local):
        last_of_group = all(other.index_names[0] != image.index_names[0] for other in local[i + 1 :])
        results.append(_publish(client, image, target, want_index=not no_index and last_of_group, require_index=True))
    if as_json:
        _print_json(results)


def main() -> None:
    app(prog_name="ascendkit")
