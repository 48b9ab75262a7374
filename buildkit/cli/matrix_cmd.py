"""``ascendkit matrix ...``: read, validate and verify the compatibility matrix."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildkit.cli.base import (
    ArchChoice,
    JsonFlag,
    MatrixPath,
    finding_json,
    matrix_app,
    out,
    print_json,
    user_errors,
)
from buildkit.cli.mirror_options import AscendIndexUrl, CaBundle, ConfigFile, PipIndexUrl, PytorchIndexUrl, ca_bundle_of, mirrors_from
from buildkit.cli.tables import RichTable
from buildkit.errors import ExitCode, InputError, MatrixError
from buildkit.fsio import write_output
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from buildkit.lock.availability import PinCheck
    from buildkit.matrix.model import Matrix, Stack


@matrix_app.command("validate", short_help="Check the structure and every compatibility rule.")
@user_errors
def matrix_validate(matrix: MatrixPath = DEFAULT_MATRIX, as_json: JsonFlag = False) -> None:
    """Check the matrix's structure and every compatibility rule; report all problems at once."""
    from buildkit.matrix.load import load_matrix

    try:
        loaded = load_matrix(matrix)
    except MatrixError as exc:
        if not as_json:
            raise
        errors = [f for f in exc.findings if f.severity == "error"]
        warnings = [f for f in exc.findings if f.severity != "error"]
        print_json({"valid": False, "errors": [finding_json(f) for f in errors], "warnings": [finding_json(f) for f in warnings]})
        raise typer.Exit(int(ExitCode.INVALID_INPUT)) from None
    m = loaded.matrix
    if as_json:
        print_json({"valid": True, "errors": [], "warnings": [finding_json(f) for f in loaded.warnings]})
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
    from buildkit.matrix.load import load_matrix

    loaded = load_matrix(matrix)
    rows = [
        {
            "stack": name,
            "default": s.default,
            "cann": s.cann,
            "python": s.python,
            "torch_npu": s.torch_npu.version,
            "rollout": s.rollout_title,
            "framework": s.framework,
            "framework_version": s.framework_version,
            "os": list(s.os),
            "arches": list(s.arches),
            "skus": list(s.skus),
        }
        for name, s in loaded.matrix.stacks.items()
    ]
    if as_json:
        print_json(rows)
        return
    table = RichTable(title=f"Stacks in {matrix}")
    for column in ("stack", "CANN", "Python", "torch_npu", "rollout", "framework", "OS", "arches", "SKUs"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            f"{r['stack']} (default)" if r["default"] else str(r["stack"]),
            str(r["cann"]),
            str(r["python"]),
            str(r["torch_npu"]),
            str(r["rollout"]),
            f"{r['framework']} {r['framework_version']}",
            ", ".join(r["os"]),  # type: ignore[arg-type]
            ", ".join(r["arches"]),  # type: ignore[arg-type]
            ", ".join(r["skus"]),  # type: ignore[arg-type]
        )
    out.print(table)


@matrix_app.command("show")
@user_errors
def matrix_show(
    stack: Annotated[str, typer.Argument(help="Stack id: {stacks}.")],
    matrix: MatrixPath = DEFAULT_MATRIX,
    as_json: JsonFlag = False,
) -> None:
    """Show every pin of one stack, its base images and known issues."""
    from buildkit.matrix.load import load_matrix, resolve_stack
    from buildkit.plan import base_image_ref

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
    drivers = m.compat.cann_drivers.get(s.cann)
    data = {
        "stack": name,
        **s.model_dump(mode="json", exclude_none=True),
        "base_images": bases,
        "drivers": drivers.model_dump(mode="json") if drivers else None,
        "known_issues": issues,
    }
    if as_json:
        print_json(data)
        return
    table = RichTable(title=f"{name}{' (default)' if s.default else ''}: {s.description}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key in ("cann", "python", "os", "arches", "skus", "atb_cxx_abi"):
        value = getattr(s, key)
        table.add_row(key, ", ".join(value) if isinstance(value, tuple) else str(value))
    for key, value in _pin_rows(m, s):
        table.add_row(key, value)
    for patch in s.patches:
        table.add_row(f"patch {patch.package}", f"{patch.file}: comments out {patch.comment_out!r} ({patch.reason})")
    for pkg, spec in s.constraints.items():
        table.add_row(f"constraint {pkg}", spec)
    for arch, specs in s.constraints_by_arch.items():
        for pkg, spec in specs.items():
            table.add_row(f"constraint {pkg} ({arch})", spec)
    for key, value in s.env.items():
        table.add_row(f"env {key}", value)
    for label, ref in bases.items():
        table.add_row(f"base {label}", ref)
    table.add_row(
        "host driver (Ascend HDK)",
        f"{drivers.describe()}  ({drivers.source})" if drivers else "none recorded: `matrix validate` fails",
    )
    for component, why in (s.upstream.unconfirmed if s.upstream is not None else {}).items():
        table.add_row(f"unconfirmed {component}", " ".join(why.split()))
    for issue in issues:
        table.add_row(f"known issue ({issue['severity']})", issue["reason"])
    out.print(table)


def _pin_rows(m: Matrix, s: Stack) -> list[tuple[str, str]]:
    """Each pin of the stack, where it comes from and how it is built."""
    rows: list[tuple[str, str]] = []
    for component, pin in s.pins().items():
        extra = [f"index {pin.index}"] + [f"{a}: {i}" for a, i in pin.index_by_arch.items()]
        if pin.build_from_source:
            extra.append("built from sdist")
        if pin.extensions:
            extra.append(f"compiles {', '.join(pin.extensions)}")
        rows.append((component, f"{pin.version}  ({'; '.join(extra)})"))
    for component, git in s.git_pins().items():
        repo = m.repos[git.repo]
        rows.append((component, f"{git.ref}  ({m.git_hosts[repo.host].url}/{repo.path}, {git.install})"))
    if (source := s.framework_source) is not None:
        repo = m.repos[source.repo]
        built = " ".join(f"{k}={v}" for k, v in source.install_env.items())
        rows.append(
            (
                s.framework,
                f"{source.version} from {m.git_hosts[repo.host].url}/{repo.path} at {source.ref} "
                f"({source.requirements}{', ' + built if built else ''}; leaves out {', '.join(source.leaves_out) or 'nothing'})",
            )
        )
    return rows


@matrix_app.command("verify", short_help="Check every pin exists on its index.")
@user_errors
def matrix_verify(
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Only this stack; default: all.")] = None,
    arch: ArchChoice = None,
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    no_resolve: Annotated[bool, typer.Option("--no-resolve", help="Only look the pins up; skip resolving each stack as a whole.")] = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Resolve each stack even when its current lock already shows the pins resolve together.")
    ] = False,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Check that every pin exists on its index for each arch and Python, that each pin meets what the
    others declare they require, and that each stack's pins resolve together (exit 1: missing or
    conflicting, 8: unverified)."""
    from buildkit.lock.availability import check_agreement, check_matrix, check_together, summarize
    from buildkit.lock.index import IndexClient
    from buildkit.lock.metadata import MetadataReader, index_reader
    from buildkit.lock.relock import index_urls_for
    from buildkit.matrix.load import load_matrix, resolve_stack

    if fresh and no_resolve:
        raise InputError("--fresh and --no-resolve exclude each other: --fresh re-resolves each stack, --no-resolve skips resolving")
    loaded = load_matrix(matrix)
    stacks = [resolve_stack(loaded, stack)[0]] if stack else None
    urls = {"pip_index_url": pip_index_url, "pytorch_index_url": pytorch_index_url, "ascend_index_url": ascend_index_url}
    mirrors = mirrors_from(config, ca_bundle, **urls)
    index_urls = index_urls_for(loaded, mirrors)
    ca = ca_bundle_of(mirrors)
    client = IndexClient(ca_bundle=ca)
    checks = check_matrix(loaded.matrix, client, stacks=stacks, arches=[arch] if arch else None, index_urls=index_urls)
    if not no_resolve:
        checks += check_together(loaded, checks, index_urls, ca_bundle=ca, fresh=fresh)
    agreed, warnings = check_agreement(
        loaded, index_reader(MetadataReader(client), index_urls), stacks=stacks, arches=[arch] if arch else None
    )
    checks += agreed
    for warning in warnings:
        typer.echo(f"ascendkit: warning: {warning}", err=True)
    counts = summarize(checks)
    failed = counts["missing"] or counts["conflict"]
    code = ExitCode.CHECK_FAILED if failed else ExitCode.UNVERIFIED if counts["unverified"] else ExitCode.OK
    if as_json:
        print_json({"summary": counts, "exit_code": int(code), "results": [c.describe() for c in checks]})
    else:
        _print_verify_table(checks, counts)
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


_MARK = {"found": "✓", "missing": "✗", "unverified": "?", "conflict": "✗"}


def _print_verify_table(checks: list[PinCheck], counts: dict[str, int]) -> None:
    from buildkit.lock.availability import COMPONENT_AGREE, COMPONENT_SET

    components = list(dict.fromkeys(c.component for c in checks))
    table = RichTable(title="Pins on their indexes, and each stack resolved as a whole (✓ found, ✗ missing/conflict, ? unverified)")
    table.add_column("stack / arch")
    for component in components:
        table.add_column(component.replace("_", "-"), justify="center")
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for c in checks:
        rows.setdefault((c.stack, c.arch), {})[c.component] = _MARK[c.finding]
    for (stack_id, arch_name), cells in rows.items():
        table.add_row(f"{stack_id} / {arch_name}", *(cells.get(component, "") for component in components))
    out.print(table)
    for c in checks:
        if c.finding != "found":
            what = {COMPONENT_SET: "all pins together", COMPONENT_AGREE: "the pins' requirements"}.get(
                c.component, f"{c.package}=={c.version}"
            )
            out.print(f"{_MARK[c.finding]} {c.stack} {c.arch} {what}: {c.detail}")
    out.print(f"{counts['found']} found, {counts['missing']} missing, {counts['conflict']} conflicting, {counts['unverified']} unverified")


class TableFormatChoice(str, enum.Enum):
    md = "md"
    rst = "rst"


@matrix_app.command("table", short_help="Print the support tables.")
@user_errors
def matrix_table(
    fmt: Annotated[TableFormatChoice, typer.Option("--format", "-f", help="Markdown or reStructuredText.")] = TableFormatChoice.md,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Print the support tables (release lines and SKUs) generated from the matrix."""
    from buildkit.matrix import tables
    from buildkit.matrix.load import load_matrix

    loaded = load_matrix(matrix)
    sys.stdout.write(tables.support_tables(loaded.matrix, fmt.value))


@matrix_app.command("schema", short_help="Print the JSON Schema of the matrix.")
@user_errors
def matrix_schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the matrix (for editor completion and validation)."""
    from buildkit import generate

    text = generate.schema_text()
    write_output(output, text)


@matrix_app.command("import", short_help="Propose a stack from an upstream Ascend Dockerfile.")
@user_errors
def matrix_import(
    dockerfile: Annotated[
        Path, typer.Argument(help="An upstream Ascend Dockerfile: verl's docker/ascend/Dockerfile.ascend_* (vllm-ascend's may fit).")
    ],
    stack_id: Annotated[str | None, typer.Option("--id", help="The new stack's id (default: from the Dockerfile's name).")] = None,
    ref: Annotated[
        str | None,
        typer.Option("--ref", help="The branch the Dockerfile comes from: what its clone of verl without --branch gets (default: main)."),
    ] = None,
    repo: Annotated[
        str, typer.Option("--repo", help="The repository the Dockerfile belongs to, which `COPY .` brings in: verl or vllm-ascend.")
    ] = "verl",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the proposal to FILE instead of stdout.")] = None,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Read an upstream Ascend Dockerfile and print a stack for `stacks:` with its pins, base image and chip.

    The requirement files it installs from vllm-ascend's and verl's branches are read from upstream/ beside the
    matrix where vendored there. Settings a pin needs beyond its version come from the matrix's nearest stack;
    values the Dockerfile does not pin, and what has no place in the matrix, are said in comments.
    Exit 0: the proposal validates with the matrix; 1: it does not yet (the findings follow it, on stderr).
    """
    from buildkit.matrix.importer import findings, propose
    from buildkit.matrix.load import load_matrix
    from buildkit.matrix.parity import UPSTREAM_DIR, Vendored
    from buildkit.matrix.upstream import read_dockerfile

    loaded = load_matrix(matrix)
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{dockerfile}: cannot read the Dockerfile: {exc}") from None
    vendored = Vendored.load(loaded.root) if (loaded.root / UPSTREAM_DIR / "SOURCES.json").is_file() else None
    upstream = (loaded.root / UPSTREAM_DIR).resolve()
    key = dockerfile.resolve().relative_to(upstream).as_posix() if dockerfile.resolve().is_relative_to(upstream) else ""
    if vendored is not None and key in vendored.sources and ref is None:  # a vendored file: read as the parity page reads it
        image, source = vendored.image(key), key
    else:
        requirements = vendored.requirements if vendored else None
        image = read_dockerfile(str(dockerfile), text, requirements, default_ref=ref or "main", own_repo=repo)
        source = str(dockerfile)
    proposal = propose(loaded.matrix, image, source, stack_id)
    problems = findings(matrix.read_text(encoding="utf-8"), matrix, proposal)
    if write_output(output, proposal.text()):
        out.print(f"wrote {output}")
    if problems:
        typer.echo(f"matrix validate, with {proposal.stack_id} added, would say:", err=True)
        for finding in problems:
            typer.echo(f"  {finding.field}: {finding.message}" + (f" [{finding.rule}]" if finding.rule else ""), err=True)
        raise typer.Exit(int(ExitCode.CHECK_FAILED))
