"""Every file the repository keeps generated from the matrix, and the drift check over them:
the Dockerfiles, the lock sections, the matrix's JSON schema, the support tables of docs/matrix.md, a page per
image repository (docs/repositories/), the page that holds the stacks to verl's images (docs/verl-parity.md), the
GitHub workflow and the GitLab pipeline (ci/gitlab/).

``ascendkit render --all`` writes them; ``ascendkit render --check`` re-renders them in memory and
reports a unified diff for each committed file that differs, is missing, or is left over, and a
line for each lock (``locks/``) that is missing, stale or left over (``ascendkit lock`` fixes those).
"""

from __future__ import annotations

import difflib
import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from buildkit.ci.gitlab import GITLAB_FILE, render_gitlab
from buildkit.ci.workflow import ACTIONLINT_CONFIG, WORKFLOW_FILE, render_actionlint_config, render_workflow
from buildkit.errors import InputError
from buildkit.fsio import output_dir, write_all_atomic
from buildkit.image.buildrecord import RECORD_SCHEMA_FILE, record_schema_text
from buildkit.image.render import render_dockerfile
from buildkit.lock.inputs import lock_inputs, lock_targets
from buildkit.lock.lockfile import lock_problem, section_texts
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import Matrix
from buildkit.matrix.parity import UPSTREAM_DIR
from buildkit.matrix.tables import support_tables
from buildkit.pages.overview import OVERVIEW_DIR, overview_pages
from buildkit.pages.parity import PARITY_PAGE, parity_page
from buildkit.plan import DOCKERFILES_DIR, LOCKS_DIR, RenderTarget, all_targets, plan_image
from buildkit.resources import TEMPLATES_DIR

SCHEMA_FILE = "compat_matrix.schema.json"
TABLES_FILE = "docs/matrix.md"  # the page that carries the support tables, between the markers
TABLE_BEGIN = "<!-- BEGIN generated: support tables (ascendkit render --all; do not edit) -->"
TABLE_END = "<!-- END generated: support tables -->"


@dataclass(frozen=True)
class GeneratedFile:
    path: str  # relative to the matrix's directory
    content: str


def schema_text() -> str:
    return json.dumps(Matrix.model_json_schema(), indent=2, ensure_ascii=False) + "\n"


def top_level_name(target: RenderTarget) -> str:
    return f"Dockerfile.{target.chip_id}"


def dockerfile_outputs(loaded: LoadedMatrix, templates: Path = TEMPLATES_DIR) -> list[GeneratedFile]:
    default = loaded.default_stack()
    default_os = loaded.matrix.stacks[default].os[0]
    files = []
    for target in all_targets(loaded):
        text = render_dockerfile(loaded, plan_image(loaded, target), templates)
        files.append(GeneratedFile(target.path, text))
        if target.stack_id == default and target.os_name == default_os:
            files.append(GeneratedFile(top_level_name(target), text))
    return files


def page_with_tables(readme: str, matrix: Matrix, readme_path: Path) -> str:
    start, end = readme.find(TABLE_BEGIN), readme.find(TABLE_END)
    if start < 0 or end < start:
        raise InputError(f"{readme_path}: the generated-table markers are missing; add the lines\n  {TABLE_BEGIN}\n  {TABLE_END}")
    head = readme[: start + len(TABLE_BEGIN)]
    return head + "\n\n" + support_tables(matrix, "md") + "\n" + readme[end:]


def lock_section_outputs(loaded: LoadedMatrix) -> list[GeneratedFile]:
    """The per-layer files of every lock on disk (what each pip layer of a Dockerfile COPYs)."""
    return [GeneratedFile(path, text) for target in lock_targets(loaded) for path, text in section_texts(loaded, target).items()]


def expected_outputs(loaded: LoadedMatrix, templates: Path = TEMPLATES_DIR, extra: tuple[GeneratedFile, ...] = ()) -> list[GeneratedFile]:
    """Every generated file, and ``extra`` ones the caller makes (the CLI's reference page, which only
    the command line can write)."""
    files = dockerfile_outputs(loaded, templates) + lock_section_outputs(loaded) + list(extra)
    files.append(GeneratedFile(SCHEMA_FILE, schema_text()))
    files.append(GeneratedFile(RECORD_SCHEMA_FILE, record_schema_text()))
    files.append(GeneratedFile(WORKFLOW_FILE, render_workflow(loaded)))
    files.append(GeneratedFile(GITLAB_FILE, render_gitlab(loaded)))
    files.append(GeneratedFile(ACTIONLINT_CONFIG, render_actionlint_config(loaded)))
    if (loaded.root / OVERVIEW_DIR).parent.is_dir():  # a checkout with docs/: a page per image repository
        files += [GeneratedFile(path, text) for path, text in overview_pages(loaded)]
    if (loaded.root / UPSTREAM_DIR / "SOURCES.json").is_file() and (loaded.root / PARITY_PAGE).parent.is_dir():
        files.append(GeneratedFile(PARITY_PAGE, parity_page(loaded)))  # a checkout with the vendored upstream files
    page = loaded.root / TABLES_FILE
    if page.is_file():
        files.append(GeneratedFile(TABLES_FILE, page_with_tables(page.read_text(encoding="utf-8"), loaded.matrix, page)))
    return sorted(files, key=lambda f: f.path)


def stale_files(root: Path, expected: list[GeneratedFile]) -> list[str]:
    """Generated Dockerfiles, lock sections and repository pages on disk that nothing produces any more."""
    wanted = {f.path for f in expected}
    found = []
    for base, pattern in ((root / DOCKERFILES_DIR, "**/Dockerfile.*"), (root / LOCKS_DIR, "*/*.txt"), (root / OVERVIEW_DIR, "*.md")):
        if base.is_dir():
            found += [p.relative_to(root).as_posix() for p in sorted(base.glob(pattern)) if p.is_file()]
    return [p for p in found if p not in wanted]


def check(loaded: LoadedMatrix, templates: Path = TEMPLATES_DIR, expected: list[GeneratedFile] | None = None) -> list[str]:
    """Unified diffs (committed -> expected) for every out-of-date generated file; empty when clean."""
    root = loaded.root
    expected = expected_outputs(loaded, templates) if expected is None else expected
    diffs = []
    for gen in expected:
        path = root / gen.path
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != gen.content:
            label = gen.path if path.is_file() else "/dev/null"
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        gen.content.splitlines(keepends=True),
                        fromfile=f"a/{gen.path}" if path.is_file() else label,
                        tofile=f"b/{gen.path}",
                    )
                )
            )
    for stale in stale_files(root, expected):
        old = (root / stale).read_text(encoding="utf-8")
        diffs.append("".join(difflib.unified_diff(old.splitlines(keepends=True), [], fromfile=f"a/{stale}", tofile="/dev/null")))
    diffs += lock_problems(loaded)
    return diffs


def lock_problems(loaded: LoadedMatrix) -> list[str]:
    """One line per lock that is missing, stale (its matrix inputs changed) or left over.

    Locks are not re-rendered here (that needs the index); their header's inputs-sha256 is compared
    with the matrix, which is enough to know a lock no longer describes its stack."""
    problems = []
    wanted = set()
    for target in lock_targets(loaded):
        wanted.add(target.path)
        problem = lock_problem(loaded.root, lock_inputs(loaded, target))
        if problem is not None:
            problems.append(f"lock: {problem}\n")
    base = loaded.root / LOCKS_DIR
    for path in sorted(base.glob("*.txt")) if base.is_dir() else []:
        relative = path.relative_to(loaded.root).as_posix()
        if relative not in wanted:
            problems.append(f"lock: {relative} belongs to no stack and arch of the matrix: delete it\n")
    return problems


def _unchanged(path: Path, content: str) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == content
    except (OSError, UnicodeDecodeError):
        return False


def write_all(loaded: LoadedMatrix, templates: Path = TEMPLATES_DIR, extra: tuple[GeneratedFile, ...] = ()) -> list[str]:
    """Write every generated file that changed and remove stale ones; returns the paths touched.

    All or nothing: everything is rendered in memory, every output checked, then written to
    temporary files and only then renamed into place; a refusal or a failed write changes no file
    (and leaves no directory it created)."""
    root = loaded.root
    expected = expected_outputs(loaded, templates, extra)
    changed = [(root / gen.path, gen) for gen in expected if not _unchanged(root / gen.path, gen.content)]
    with ExitStack() as directories:
        for parent in sorted({path.parent for path, _ in changed}):
            directories.enter_context(output_dir(parent, "output directory"))
        write_all_atomic([(path, gen.content) for path, gen in changed])
    touched = [gen.path for _, gen in changed]
    for stale in stale_files(root, expected):
        (root / stale).unlink()
        touched.append(f"{stale} (removed)")
        parent = (root / stale).parent
        if parent not in (root / DOCKERFILES_DIR, root / LOCKS_DIR) and not any(parent.iterdir()):
            parent.rmdir()
    return touched
