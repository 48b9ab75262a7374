"""A team's image file: validated with file, line and field; locked against its base, nothing of the base moved."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import yaml

from buildkit.errors import AscendkitError, InputError
from buildkit.lock.lockfile import LockedPackage, read_lock
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.team.ci import team_gitlab, team_workflow
from buildkit.team.fork import ForkWheel, read_wheel
from buildkit.team.inimage import moved, shared, wheel_overlap
from buildkit.team.resolve import (
    TeamResolution,
    base_constraints,
    free_of,
    inputs_digest,
    lock_file,
    lock_sections,
    lock_state,
    refusals,
    render_team_lock,
    resolve_team,
    team_base,
    write_team_lock,
)
from buildkit.team.spec import TeamFileError, load_team
from tests.conftest import ROOT, TEST_MATRIX, Ascendkit

GOOD = """\
schema_version: 1
name: acme/verl-math
base:
  stack: teststack
  sku: a2-box16
packages:
  - tabulate==0.9.0
requirements: [requirements-team.txt]
files:
  - {src: rewards, dest: /opt/team/rewards}
env:
  TEAM_REWARD: /opt/team/rewards/math.py
"""


@pytest.fixture(scope="module")
def test_matrix() -> LoadedMatrix:
    return load_matrix(TEST_MATRIX)


def team_repo(root: Path, text: str = GOOD, requirements: str = "# the team's extras\npyfiglet==1.0.2  # banners\n") -> Path:
    (root / "rewards").mkdir(parents=True, exist_ok=True)
    (root / "rewards" / "math.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    (root / "requirements-team.txt").write_text(requirements)
    path = root / "ascendkit-team.yaml"
    path.write_text(text)
    return path


def findings(path: Path, loaded: LoadedMatrix) -> list[str]:
    with pytest.raises(TeamFileError) as caught:
        load_team(path, loaded)
    return [f.format() for f in caught.value.findings]


def test_a_good_team_file_loads_with_every_requirement_and_where_it_was_written(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team = load_team(team_repo(tmp_path), test_matrix)
    assert [(r.line, r.where) for r in team.requirements] == [
        ("tabulate==0.9.0", "ascendkit-team.yaml:7"),
        ("pyfiglet==1.0.2", "requirements-team.txt:2"),
    ]
    assert team.spec.env == {"TEAM_REWARD": "/opt/team/rewards/math.py"}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("  sku: a2-box16", "  sku: a9"), ":5:8: error: base.sku: unknown SKU 'a9'"),
        (("  stack: teststack", "  stack: cann7"), ":4:10: error: base.stack: unknown stack 'cann7'"),
        (("  - tabulate==0.9.0", "  - tabulate>="), ":7:5: error: packages[0]: 'tabulate>=' is not a requirement line"),
        (
            ("  - tabulate==0.9.0", '  - "tabulate @ git+https://x.example/t.git"'),
            ":7:5: error: packages[0]: 'tabulate @ git+https://x.example/t.git' is a direct reference",
        ),
        (("  - {src: rewards,", "  - {src: recipes,"), ":10:11: error: files[0].src: recipes does not exist"),
        (
            ("  - {src: rewards, dest: /opt/team/rewards}", "  - {src: rewards, dest: opt/team}"),
            ":10:26: error: files[0].dest: 'opt/team' must be an absolute path",
        ),
        (("env:", "colour: red\nenv:"), ":11:1: error: colour: unknown key 'colour'"),
        (
            ("  sku: a2-box16", "  sku: a2-box16\n  image: quay.io/ascend/verl:cann8.3"),
            ":4:3: error: base: give stack: and sku: (a stack of the matrix) or image: (a published ascendkit image), not both",
        ),
        (("  sku: a2-box16\n", ""), ":4:3: error: base: give stack: and sku: (a stack of the matrix for one SKU), or image:"),
        (
            ("env:", "framework:\n  git: https://gitlab.example.cn/rl/verl.git\n  commit: main\n  replaces: verl\nenv:"),
            ":13:11: error: framework.commit: 'main' is not a full commit: a branch or tag moves",
        ),
        (
            ("env:", f"framework:\n  git: https://gitlab.example.cn/rl/verl.git\n  commit: {'a' * 40}\n  replaces: openrlhf\nenv:"),
            ":14:13: error: framework.replaces: the base's framework is verl, not openrlhf",
        ),
        (("env:", "arches: [x86_64, x86_64]\nenv:"), ":11:9: error: arches: an arch is named twice: x86_64, x86_64"),
        (("env:", "arches: [x86_64, riscv64]\nenv:"), ":11:18: error: arches[1]: Input should be 'aarch64' or 'x86_64'"),
        (
            ("  stack: teststack\n", "  stack: teststack-sglang\n", "env:", "arches: [x86_64, aarch64]\nenv:"),
            ":11:18: error: arches[1]: stack teststack-sglang is not built for aarch64",
        ),
    ],
)
def test_each_problem_is_named_with_its_file_line_and_field(
    tmp_path: Path, test_matrix: LoadedMatrix, edit: tuple[str, ...], expected: str
) -> None:
    text = GOOD
    for old, new in zip(edit[::2], edit[1::2], strict=True):
        assert old in text
        text = text.replace(old, new, 1)
    path = team_repo(tmp_path, text)
    said = findings(path, test_matrix)
    assert any(f.startswith(str(path) + expected) for f in said), said


def test_a_bad_line_of_a_requirements_file_is_named_there(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    path = team_repo(tmp_path, requirements="pyfiglet==1.0.2\n--index-url https://elsewhere.example/simple\n")
    said = findings(path, test_matrix)
    assert said[0].startswith(f"{tmp_path / 'requirements-team.txt'}:2:1: error: requirements-team.txt: '--index-url")


def test_a_missing_team_file_says_what_to_write(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    said = findings(tmp_path / "ascendkit-team.yaml", test_matrix)
    assert "no such file" in said[0]


def pkg(name: str, version: str, *via: str) -> LockedPackage:
    return LockedPackage(name, version, ["sha256:" + "0" * 64], list(via))


def test_refusals_name_the_package_who_asked_and_what_holds_the_base(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team = load_team(team_repo(tmp_path), test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    held = base.packages["attrs"]
    said = refusals(
        team,
        base,
        [
            pkg("tabulate", "0.9.0", "-r team.in"),
            pkg("attrs", "99.0", "swanlab"),
            pkg("triton", "3.1.0", "xgrammar"),
            pkg("nvidia-cublas-cu12", "12.4.5.8", "torch"),
            pkg("triton-ascend", "0.2.13", "vllm"),
        ],
    )
    assert said == [
        f"swanlab requires attrs 99.0; the base has attrs {held.version}, which {', '.join(held.via)} requires",
        "triton 3.1.0, asked for by xgrammar: mainline triton writes triton/ over the base's triton-ascend",
        "nvidia-cublas-cu12 12.4.5.8, asked for by torch: a CUDA package, which an NPU image must not carry",
    ]
    assert refusals(team, base, [pkg("tabulate", "0.9.0", "-r team.in"), pkg("nvidia-ml-py", "13.615.71", "pynvml")]) == []


def test_a_replace_is_the_one_escape_and_the_lock_records_its_reason(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team = load_team(team_repo(tmp_path, GOOD + "replace:\n  attrs: swanlab's cloud client needs attrs 23\n"), test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    moved = pkg("attrs", "23.2.0", "swanlab")
    assert refusals(team, base, [moved]) == []
    text = render_team_lock(
        team, base, TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")], [(moved, base.packages["attrs"].version, "why")])
    )
    assert f"# replaces: attrs {base.packages['attrs'].version} -> 23.2.0: why" in text


def test_the_lock_goes_stale_when_the_team_file_a_requirements_file_or_the_base_changes(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    path = team_repo(tmp_path)
    team = load_team(path, test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    assert lock_state(team, base) == "missing"
    written = write_team_lock(team, base, TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")]))
    assert written == lock_file(team, "x86_64")
    lock = read_lock(written)
    assert lock.resolved and [p.key for _, p in lock.packages] == ["tabulate"]
    assert lock_state(team, base) == "fresh"
    (tmp_path / "requirements-team.txt").write_text("pyfiglet==1.0.1\n")
    assert lock_state(load_team(path, test_matrix), base) == "stale"
    team = load_team(path, test_matrix)
    moved_base = type(base)(**{**base.__dict__, "lock_sha256": "f" * 64})
    assert inputs_digest(team, moved_base) != inputs_digest(team, base)


@pytest.mark.network
def test_team_lock_resolves_against_the_base_and_refuses_what_moves_it(tmp_path: Path, ascendkit: Ascendkit) -> None:
    path = team_repo(tmp_path)
    done = ascendkit("team", "lock", "--file", str(path), "--matrix", str(TEST_MATRIX), "--json")
    assert done.returncode == 0, done.stderr
    lock = read_lock(tmp_path / "ascendkit-team-x86_64.lock")
    assert {p.key: p.version for _, p in lock.packages} == {"tabulate": "0.9.0", "pyfiglet": "1.0.2"}
    assert all(p.hashes for _, p in lock.packages)
    assert ascendkit("team", "check", "--file", str(path), "--matrix", str(TEST_MATRIX)).returncode == 0
    # attrs is the base's (markdown-it-py, standing in for torch_npu, requires it): another version is refused
    path.write_text(GOOD.replace("tabulate==0.9.0", "attrs==23.2.0"))
    refused = ascendkit("team", "lock", "--file", str(path), "--matrix", str(TEST_MATRIX))
    assert refused.returncode == 1, refused.stderr
    assert "ascendkit-team.yaml:7 requires attrs 23.2.0; the base has attrs 21.4.0, which markdown-it-py requires" in refused.stderr
    assert (tmp_path / "ascendkit-team-x86_64.lock").read_text() == lock.path.read_text(), "a refused lock leaves the old one"
    assert ascendkit("team", "check", "--file", str(path), "--matrix", str(TEST_MATRIX)).returncode == 1  # stale now
    path.write_text(GOOD.replace("tabulate==0.9.0", "nvidia-nccl-cu12==2.21.5"))
    cuda = ascendkit("team", "lock", "--file", str(path), "--matrix", str(TEST_MATRIX))
    assert cuda.returncode == 1 and "nvidia-nccl-cu12 2.21.5, asked for by ascendkit-team.yaml:7: a CUDA package" in cuda.stderr


FORK = f"framework:\n  git: https://gitlab.example.cn/rl/verl.git\n  commit: {'a' * 40}\n  replaces: verl\nenv:"


def test_a_fork_frees_the_framework_and_locks_its_wheel_in_a_section_of_its_own(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team = load_team(team_repo(tmp_path, GOOD.replace("env:", FORK, 1)), test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    assert base.framework_dist == "idna" and free_of(team, base) == {"idna"}
    assert "idna==3.7" not in base_constraints(team, base), "the fork replaces the base's framework: not held to its pin"
    wheel = ForkWheel(tmp_path / "idna-3.7+acme.1-py3-none-any.whl", "idna", "3.7+acme.1", ("tabulate==0.9.0",), "b" * 64)
    text = render_team_lock(team, base, TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")], fork=wheel))
    assert f"# framework: idna==3.7+acme.1 from https://gitlab.example.cn/rl/verl.git@{'a' * 40}" in text
    assert "# replaces: idna 3.7 -> 3.7+acme.1: the team's framework fork" in text
    sections = lock_sections(text)
    assert list(sections) == ["team-deps", "team-framework"]
    assert all("# status: resolved" in section for section in sections.values()), "each section installs as a lock"
    assert "tabulate==0.9.0" in sections["team-deps"] and "idna" not in sections["team-deps"].split("# layer:")[1]
    assert f"idna==3.7+acme.1 \\\n    --hash=sha256:{'b' * 64}" in sections["team-framework"]
    assert [p.key for _, p in read_lock(written_lock(tmp_path, text)).packages] == ["tabulate", "idna"]


def written_lock(root: Path, text: str) -> Path:
    path = root / "lock.txt"
    path.write_text(text)
    return path


def test_an_index_that_cannot_be_reached_is_exit_4_and_writes_nothing(tmp_path: Path, ascendkit: Ascendkit) -> None:
    path = team_repo(tmp_path)
    done = ascendkit("team", "lock", "--file", str(path), "--matrix", str(TEST_MATRIX), "--pip-index-url", "http://127.0.0.1:9/simple")
    assert done.returncode == 4, done.stderr
    assert "cannot be reached" in done.stderr
    assert not (tmp_path / "ascendkit-team-x86_64.lock").exists()


def test_the_check_after_the_build_names_every_base_distribution_that_moved() -> None:
    before = {
        "torch": ["2.7.1", "r1", ""],
        "idna": ["3.7", "r2", ""],
        "six": ["1.16.0", "r3", ""],
        "attrs": ["21.4.0", "r4", ""],
        "h11": ["0.15.0", "r5", ""],
    }
    after = {
        "torch": ["2.7.1", "r1", ""],
        "idna": ["3.7", "r2-rewritten", ""],
        "attrs": ["23.2.0", "r9", ""],
        "h11": ["0.15.0", "r5", '{"url": "file:///tmp/h11"}'],
        "tabulate": ["0.9.0", "r6", ""],
    }
    assert moved(before, after, set()) == [
        "attrs: 21.4.0 in the base, 23.2.0 in the team image",
        "h11 0.15.0: installed from elsewhere (direct_url.json)",
        "idna 3.7: its files differ from the base's (RECORD, or a file it lists rewritten)",
        "six 1.16.0: gone",
    ]
    assert moved(before, after, {"attrs", "h11", "idna", "six"}) == []


def test_a_fork_that_builds_a_platform_wheel_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "verl-0.6.1+acme-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("verl-0.6.1+acme.dist-info/METADATA", "Metadata-Version: 2.1\nName: verl\nVersion: 0.6.1+acme\n")
    with pytest.raises(AscendkitError, match="only pure-Python forks"):
        read_wheel(wheel)
    pure = tmp_path / "verl-0.6.1+acme-py3-none-any.whl"
    with zipfile.ZipFile(pure, "w") as archive:
        archive.writestr(
            "verl-0.6.1+acme.dist-info/METADATA", "Metadata-Version: 2.1\nName: verl\nVersion: 0.6.1+acme\nRequires-Dist: ray\n"
        )
    assert read_wheel(pure).pin == "verl==0.6.1+acme" and read_wheel(pure).requires == ("ray",)


def test_files_two_distributions_own_are_named_after_the_build_and_a_forks_before_it(tmp_path: Path) -> None:
    site = "/usr/local/lib/python3.11/dist-packages"
    before = {
        "wcwidth": ["0.2.13", "r1", "", [f"{site}/wcwidth/__init__.py", f"{site}/wcwidth/table.py"], site],
        "idna": ["3.7", "r2", "", [f"{site}/idna/__init__.py"], site],
    }
    after = {
        **before,
        "idna": ["3.7+acme.1", "r3", "", [f"{site}/idna/__init__.py"], site],
        "triton": ["3.1.0", "r4", "", [f"{site}/wcwidth/table.py", f"{site}/triton/__init__.py"], site],
    }
    assert shared(before, after, {"idna"}) == [f"{site}/wcwidth/table.py: triton 3.1.0 writes it, and the base's wcwidth owns it"]
    wheel = tmp_path / "idna-3.7+acme.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("idna/__init__.py", "wcwidth/__init__.py", "idna-3.7+acme.1.data/scripts/idna", "idna-3.7+acme.1.dist-info/RECORD"):
            archive.writestr(name, "")
    assert wheel_overlap(wheel, "idna", before, {"idna"}) == [
        f"{site}/wcwidth/__init__.py: the fork's wheel {wheel.name} writes it, and the base's wcwidth owns it"
    ]


@pytest.mark.slow
def test_the_generated_team_workflow_passes_githubs_schema_actionlint_and_zizmor(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    from tests.test_workflow import actionlint, schema, zizmor

    image = "quay.io/ascend/verl:verl0.6.1-cann8.3.rc1-a3-ubuntu22.04-py3.11"
    team = load_team(team_repo(tmp_path, GOOD.replace("  stack: teststack\n  sku: a2-box16\n", f"  image: {image}\n")), test_matrix)
    path = tmp_path / "team-image.yml"
    path.write_text(team_workflow(team, "aarch64"))
    for tool in (actionlint, zizmor, schema):
        proc = tool(path)
        assert proc.returncode == 0, f"{tool.__name__}:\n{proc.stdout}\n{proc.stderr}"
    text = path.read_text()
    assert "runs-on: ubuntu-24.04-arm" in text and f"ASCENDKIT_BASE: {image}" in text
    assert text.index('docker pull "$ASCENDKIT_BASE"') < text.index("ascendkit team check") < text.index("ascendkit team build")
    with pytest.raises(InputError, match=r"give base\.image"):
        team_workflow(load_team(team_repo(tmp_path / "stack"), test_matrix), "x86_64")
    both = load_team(
        team_repo(tmp_path / "arches", path.parent.joinpath("ascendkit-team.yaml").read_text() + "arches: [x86_64, aarch64]\n")
    )
    multi = tmp_path / "arches" / "team-image.yml"
    multi.write_text(team_workflow(both, "x86_64"))  # `arches:`: a job per arch, each on a native runner, each its artifact
    for tool in (actionlint, zizmor, schema):
        proc = tool(multi)
        assert proc.returncode == 0, f"{tool.__name__}:\n{proc.stdout}\n{proc.stderr}"
    jobs = yaml.safe_load(multi.read_text())["jobs"]
    assert {job: (spec["runs-on"], spec["env"]["ASCENDKIT_ARCH"]) for job, spec in jobs.items()} == {
        "team-image-x86_64": ("ubuntu-24.04", "x86_64"),
        "team-image-aarch64": ("ubuntu-24.04-arm", "aarch64"),
    }
    assert len({spec["steps"][-1]["with"]["name"] for spec in jobs.values()}) == 2, "one artifact name per job"
    gitlab = yaml.safe_load(team_gitlab(both, "x86_64"))
    assert {job: spec["tags"][-1] for job, spec in gitlab.items()} == {"team-image-x86_64": "x86_64", "team-image-aarch64": "aarch64"}


def test_the_generated_ci_installs_this_distribution_by_the_name_pip_knows_it_by(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    """`ascendkit` on PyPI is another project: the team's CI must install this one, by pyproject's name and version."""
    from buildkit.version import __version__

    project = re.search(r'^\[project\]\n(?:.*\n)*?name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert project is not None
    wanted = f'"{project.group(1)}=={__version__}"'
    team = load_team(
        team_repo(tmp_path, GOOD.replace("  stack: teststack\n  sku: a2-box16\n", "  image: r.example/acme/verl:x\n")), test_matrix
    )
    for text in (team_workflow(team, "x86_64"), team_gitlab(team, "x86_64")):
        installs = [line for line in text.splitlines() if "pip install" in line]
        assert installs and all(wanted in line for line in installs), installs


def test_a_replace_of_a_package_the_base_does_not_have_is_refused(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team = load_team(team_repo(tmp_path, GOOD + "replace:\n  protobuf: swanlab needs protobuf 5\n"), test_matrix)
    with pytest.raises(InputError, match="protobuf is not a package of the base"):
        resolve_team(
            team, team_base(test_matrix, team, "x86_64"), {"pypi": "http://127.0.0.1:9/simple", "pypi-again": "http://127.0.0.1:9/simple"}
        )


@pytest.mark.slow
def test_the_generated_team_pipeline_passes_gitlabs_schema(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    from tests.test_gitlab import gitlab_schema

    image = "swr.cn-south-1.myhuaweicloud.com/acme/verl:cann8.3-a3-ubuntu22.04-x86_64"
    team = load_team(team_repo(tmp_path, GOOD.replace("  stack: teststack\n  sku: a2-box16\n", f"  image: {image}\n")), test_matrix)
    path = tmp_path / "team-image.gitlab-ci.yml"
    path.write_text(team_gitlab(team, "x86_64"))
    proc = gitlab_schema(path)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    job = yaml.safe_load(path.read_text())["team-image"]
    assert job["tags"] == ["ascendkit-build", "x86_64"] and job["variables"]["ASCENDKIT_BASE"] == image
    assert [line.split()[0:3] for line in job["script"][1:]] == [
        ["docker", "pull", '"$ASCENDKIT_BASE"'],
        ["ascendkit", "team", "check"],
        ["ascendkit", "team", "build"],
    ]


def test_verify_holds_a_team_image_to_its_bases_stack_with_each_escape_named() -> None:
    """A team image's provenance pins against the matrix: the stack's pins held but those the team replaced (each
    printed with its reason), what it added its own; a pin moved without an escape fails as a reference image's would."""
    from buildkit.ship.trust.checks import _matrix_check

    stack = {"torch": "2.5.1", "verl": "0.5.0", "wcwidth": "0.2.13"}
    team = {"name": "acme/verl-math", "replaces": {"verl": {"base": "0.5.0", "team": "0.5.0+acme", "reason": "the fork"}}}
    team["added"] = {"tabulate": "0.9.0"}
    pins = {"torch": "2.5.1", "verl": "0.5.0+acme", "wcwidth": "0.2.13", "tabulate": "0.9.0"}
    held = _matrix_check("sha256:x", "teststack", stack, pins, team)
    assert not held.failed
    assert (
        held.detail
        == "team acme/verl-math on stack teststack: 2 of the matrix's pins held, 1 added; replaced: verl 0.5.0 -> 0.5.0+acme (the fork)"
    )
    moved = _matrix_check("sha256:x", "teststack", stack, {**pins, "wcwidth": "0.9.4"}, team)
    assert moved.failed and "wcwidth 0.9.4 (matrix: 0.2.13)" in moved.detail
    assert _matrix_check("sha256:x", "teststack", stack, pins, None).failed, "a reference image has no escape"
    assert not _matrix_check("sha256:x", "teststack", stack, dict(stack), None).failed


def test_sbom_diff_pairs_an_images_base_by_kind_and_names_both() -> None:
    """A team image's base is a reference image, whose own base is another: the diff says the base changed."""
    from buildkit.image.sbom import diff

    def document(base: str, digest: str, *python: tuple[str, str]) -> dict[str, object]:
        components = [{"bom-ref": f"pypi:{n}", "name": n, "version": v, "type": "library"} for n, v in python]
        return {"components": [*components, {"bom-ref": "base:image", "name": base, "version": digest, "type": "container"}]}

    found = diff(
        document("cann:8.3", "sha256:aa", ("idna", "3.7")),
        document("ascendkit/verl:a3", "sha256:bb", ("idna", "3.7"), ("tabulate", "0.9.0")),
    ).describe()
    assert found["removed"] == [] and [a["name"] for a in found["added"]] == ["tabulate"]
    assert found["changed"] == [
        {"kind": "base image", "name": "cann:8.3 -> ascendkit/verl:a3", "from": "sha256:aa", "to": "sha256:bb", "pin": ""}
    ]


def test_a_team_built_for_several_arches_names_each_image_by_every_arch_lock(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    """`arches:`: each arch's image carries one version (its index's name), a digest of every arch's lock; a missing one
    refuses the build (exit 1), another arch is refused; without `arches:` an image is named by its own lock alone."""
    from buildkit.errors import ExitCode
    from buildkit.team.dockerfile import naming_locks

    path = team_repo(tmp_path, GOOD + "arches: [x86_64, aarch64]\n")
    team = load_team(path, test_matrix)
    for arch in ("x86_64", "aarch64"):
        write_team_lock(team, team_base(test_matrix, team, arch), TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")]))
    x86, arm = (naming_locks(team, arch, "ignored") for arch in ("x86_64", "aarch64"))
    assert x86 == arm and x86.count(",") == 1, "both arches' images are named by both locks"
    lock_file(team, "aarch64").unlink()
    with pytest.raises(
        InputError, match=r"ascendkit-team-aarch64\.lock is missing: .* run `ascendkit team lock --arch aarch64`"
    ) as missing:
        naming_locks(team, "x86_64", "ignored")
    assert missing.value.exit_code == ExitCode.CHECK_FAILED
    single = load_team(team_repo(tmp_path / "one"), test_matrix)
    assert naming_locks(single, "x86_64", "f" * 64) == "f" * 64, "one arch: its own lock, as before"


def test_a_resolution_uv_cannot_settle_is_refused_naming_what_the_team_packages_move(
    tmp_path: Path, test_matrix: LoadedMatrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    """swanlab on the default stack: boto3's botocore caps python-dateutil below 3 and the base has 4.0.0, so uv walks
    back through every botocore release (sdists, built one by one) for longer than its timeout. The team's packages
    resolved alone say why, and that is what the refusal names, not the timeout."""
    import buildkit.team.resolve as resolve

    team = load_team(team_repo(tmp_path), test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    held = base.packages["attrs"]
    asked: list[bool] = []

    def fake_uv(*_args: object, constrained: bool, **_kw: object) -> tuple[int | None, str, list[LockedPackage]]:
        asked.append(constrained)
        if constrained:
            return None, "uv did not finish in 600 s", []
        return 0, "", [pkg("tabulate", "0.9.0", "-r team.in"), pkg("attrs", "99.0", "botocore")]

    monkeypatch.setattr(resolve, "_uv", fake_uv)
    monkeypatch.setattr(resolve, "check_indexes", lambda *_a: None)
    with pytest.raises(resolve.TeamRefused) as caught:
        resolve_team(team, base, {"pypi": "https://pypi.org/simple"})
    said = str(caught.value)
    assert asked == [True, False]
    assert said.startswith(f"the team's packages move the base: botocore requires attrs 99.0; the base has attrs {held.version}")
    assert "uv did not finish in 600 s with the base's pins" in said and "`replace:`" in said
    # nothing moved when resolved alone: the timeout itself is what is said (and it is not a refusal of the packages)
    monkeypatch.setattr(
        resolve, "_uv", lambda *_a, constrained, **_k: (None, "uv did not finish in 600 s", []) if constrained else (0, "", [])
    )
    with pytest.raises(AscendkitError) as timed_out:
        resolve_team(team, base, {"pypi": "https://pypi.org/simple"})
    assert not isinstance(timed_out.value, resolve.TeamRefused) and str(timed_out.value) == "uv did not finish in 600 s"
