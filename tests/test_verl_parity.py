"""Each stack held to the verl images it stands for (buildkit/matrix/parity.py), read from verl's own Ascend
Dockerfiles, vendored in upstream/ (tests/harness/upstream_files.py) with their commits and sha256; and the reader of
those Dockerfiles (buildkit/matrix/upstream.py), on small Dockerfiles of its own and on the vendored ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, parse_matrix
from buildkit.matrix.parity import Vendored, parities, problems
from buildkit.matrix.upstream import UpstreamPin, read_dockerfile
from buildkit.pages.parity import PARITY_PAGE, TAGS_FILE, parity_page, verl_images
from tests.conftest import MATRIX, MATRIX_TEXT, ROOT, edit

UPSTREAM = ROOT / "upstream"
VENDORED = Vendored.load(ROOT)


def test_every_vendored_file_is_what_its_source_says() -> None:
    index = json.loads((UPSTREAM / "SOURCES.json").read_text(encoding="utf-8"))["files"]
    listed = {entry["file"] for entry in index}
    on_disk = {p.relative_to(UPSTREAM).as_posix() for p in UPSTREAM.rglob("*") if p.is_file() and p.name != "SOURCES.json"}
    assert on_disk == listed, "every vendored file is in SOURCES.json and nothing else is there"
    for entry in index:
        data = (UPSTREAM / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
        if "archive" in entry:  # a release's source archive on PyPI: its URL and the archive's sha256, PyPI's own
            assert entry["repository"].startswith("https://pypi.org/project/") and entry["archive"].startswith(
                "https://files.pythonhosted.org/packages/"
            ), entry
            assert len(entry["archive_sha256"]) == 64 and "commit" not in entry, entry
        else:
            assert len(entry["commit"]) == 40 and entry["repository"].startswith("https://github.com/"), entry
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's id of the file's content
        assert blob == entry["blob"], f"{entry['file']} is not the blob {entry['blob']} of {entry['repository']}@{entry['commit'][:8]}"


def test_every_stack_matches_its_verl_images_or_says_why(loaded: LoadedMatrix) -> None:
    found = parities(loaded, VENDORED)
    assert problems(loaded, found) == []
    assert {p.stack_id for p in found} >= {"cann8.2", "cann8.3", "cann8.5", "cann9.0", "cann9.1", "sglang-cann8.5", "cann9.2"}
    for p in found:  # each file builds for a chip of its stack, on its CANN and Python (or the stack says why not)
        rows = {row.component: row for row in p.rows}
        assert all(rows[c].status == "same" or rows[c].reason for c in ("cann", "python", "chip", "os")), (p.file, rows)
    daily = [row for p in found if p.stack_id == "cann9.2" for row in p.rows if row.component == "cann"]
    assert daily and all(row.status == "differs" and "daily build 20260930220649" in row.theirs for row in daily), daily


def test_a_difference_without_its_reason_is_refused(loaded: LoadedMatrix) -> None:
    first = "verl's Dockerfile installs transformers from a development commit (cc7ab9be) after"
    reason = MATRIX_TEXT.index(f"      differences:\n        transformers: >-\n          {first}")
    end = MATRIX_TEXT.index("(see overrides)\n", reason) + len("(see overrides)\n")
    text = MATRIX_TEXT[:reason] + MATRIX_TEXT[end:]
    unexplained = parse_matrix(text, MATRIX)
    assert problems(unexplained, parities(unexplained, VENDORED)) == [
        f"stack cann9.1: transformers differs from verl/main/Dockerfile.ascend_9.1.0_{chip} (verl/main/Dockerfile.ascend_9.1.0_{chip}:57): "
        "verl commit cc7ab9be508c, ours 5.10.4; add its reason to stacks.cann9.1.upstream.differences.transformers"
        for chip in ("a2", "a3")
    ]


def test_a_pin_moved_away_from_verls_image_is_refused() -> None:
    start = MATRIX_TEXT.index("  cann9.0:\n")
    block = MATRIX_TEXT.index("    mindspeed:\n      repo: mindspeed\n      ref: core_r0.16.0\n", start)
    text = MATRIX_TEXT[:block] + MATRIX_TEXT[block:].replace("ref: core_r0.16.0", "ref: core_r0.15.0", 1)
    moved = parse_matrix(text, MATRIX)
    found = problems(moved, parities(moved, VENDORED))
    assert len(found) == 2, found
    assert all("stack cann9.0: mindspeed differs" in f and "verl core_r0.16.0, ours core_r0.15.0" in f for f in found), found


def test_a_reason_with_nothing_under_it_is_stale() -> None:
    stale = parse_matrix(
        edit(
            MATRIX_TEXT,
            "      differences:\n        torch_npu: >-\n",
            "      differences:\n        vllm: no longer differs\n        torch_npu: >-\n",
        ),
        MATRIX,
    )
    assert problems(stale, parities(stale, VENDORED)) == [
        "stack cann8.5: upstream.differences.vllm explains a difference its images no longer have: remove it"
    ]


def test_an_unconfirmed_pin_the_stack_does_not_have_is_refused() -> None:
    text = edit(MATRIX_TEXT, "      unconfirmed:\n", "      unconfirmed:\n        sglang: a pin this stack never had\n")
    odd = parse_matrix(text, MATRIX)
    assert problems(odd, parities(odd, VENDORED)) == [
        "stack cann9.2: upstream.unconfirmed.sglang names a component the stack does not pin: remove it"
    ]


def test_an_image_that_is_not_vendored_is_named() -> None:
    text = edit(MATRIX_TEXT, "verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0]", "verl/main/Dockerfile.ascend_9.0.0_a3_v0.9.9]")
    with pytest.raises(InputError, match=r"verl/main/Dockerfile.ascend_9.0.0_a3_v0.9.9 is not vendored"):
        parities(parse_matrix(text, MATRIX), VENDORED)


def test_the_page_lists_every_release_image_with_its_stack(loaded: LoadedMatrix) -> None:
    page = parity_page(loaded)
    assert page == (ROOT / PARITY_PAGE).read_text(encoding="utf-8"), "run `ascendkit render --all`"
    releases = [i for i in verl_images(VENDORED.text(TAGS_FILE)) if i.section == "verl Release Images"]
    assert sorted({i.release for i in releases}) == ["v0.6.1", "v0.7.0", "v0.7.1", "v0.8.0"]
    for image in releases:
        row = next(line for line in page.splitlines() if f"`{image.tag}`" in line)
        assert "| none |" not in row, f"verl's {image.tag} has no stack"
    assert "Not yet explained" not in page and "**no reason given**" not in page


def _pins(text: str, **kwargs: object) -> dict[str, tuple[str, str]]:
    image = read_dockerfile("Dockerfile.t", text, **kwargs)  # type: ignore[arg-type]
    return {c: (p.value, p.kind) for c, p in image.pins.items()}


def test_the_reader_runs_the_shell_as_an_aarch64_build_would() -> None:
    text = "\n".join(
        [
            "FROM quay.io/ascend/cann:8.5.0-a3-ubuntu22.04-py3.11",
            'ARG PTA="torch_npu-2.8.0.post2-cp311-cp311-manylinux_2_28"',
            "RUN ARCH=$(uname -m) && \\",
            "    # a comment line inside the instruction \\",
            "",
            '    if [ "$ARCH" = "x86_64" ]; then \\',
            "        pip install torch==2.8.0+cpu; \\",
            "    else \\",
            "        pip install torch==2.8.0; \\",
            "    fi && \\",
            "    pip install ${PTA}_${ARCH}.whl transformers==4.57.6 && \\",
            "    git clone --depth 1 --branch v0.13.0 https://github.com/vllm-project/vllm.git && \\",
            "    cd vllm && VLLM_TARGET_DEVICE=empty pip install -v -e. && cd .. && \\",
            "    git clone https://gitcode.com/Ascend/MindSpeed.git && cd MindSpeed && git checkout 2.3.0_core_r0.12.1 && cd .. && \\",
            "    pip install git+https://github.com/NVIDIA/Megatron-LM.git@core_v0.12.1 'transformers>=4.50' mathruler",
        ]
    )
    image = read_dockerfile("Dockerfile.t", text)
    assert image.base is not None and (image.base.cann, image.base.chip, image.base.python) == ("8.5.0", "a3", "3.11")
    assert {c: (p.value, p.kind) for c, p in image.pins.items()} == {
        "torch": ("2.8.0", "version"),  # the x86_64 branch is not read; the else branch is
        "torch_npu": ("2.8.0.post2", "version"),  # the wheel the ARG names
        "transformers": ("4.57.6", "version"),  # a later range does not move a pin
        "vllm": ("0.13.0", "version"),
        "mindspeed": ("2.3.0_core_r0.12.1", "ref"),
        "megatron_lm": ("core_v0.12.1", "ref"),
    }
    assert image.pins["vllm"].where == "Dockerfile.t:13" and image.pins["torch"].where == "Dockerfile.t:9"
    assert any("x86_64 only, not read: pip install torch==2.8.0+cpu" in u for u in image.unmapped)


def test_the_reader_follows_requirement_files_in_install_order() -> None:
    files = {("vllm-ascend", "releases/v0.18.0", "requirements.txt"): "torch==2.9.0\ntorch-npu==2.9.0.post2  # pta\ntriton-ascend==3.2.1\n"}

    def requirements(repo: str, ref: str, name: str) -> tuple[str, str] | None:
        text = files.get((repo, ref, name))
        return (f"{repo}/{ref}/{name}", text) if text is not None else None

    text = "\n".join(
        [
            "FROM swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:9.0.0-910b-ubuntu22.04-py3.11",
            "RUN git clone -b releases/v0.18.0 https://github.com/vllm-project/vllm-ascend.git && \\",
            "    cd vllm-ascend && pip install -r requirements.txt && pip install --no-deps -v -e . && cd .. && \\",
            "    pip install torch_npu==2.9.0 && \\",
            "    git clone https://github.com/verl-project/verl.git && cd verl && pip install -r requirements-npu.txt",
            "RUN cd /transformers && git checkout cc7ab9be508ce6ed3637bba9e50367b29b742dc6",
        ]
    )
    image = read_dockerfile("Dockerfile.t", text, requirements, default_ref="release/v0.8.0")
    assert {c: (p.value, p.kind) for c, p in image.pins.items()} == {
        "torch": ("2.9.0", "version"),
        "torch_npu": ("2.9.0", "version"),  # the later explicit install wins, as pip's would
        "triton_ascend": ("3.2.1", "version"),
        "vllm_ascend": ("0.18.0", "branch"),
        "verl": ("0.8.0", "branch"),  # verl's own repository, cloned without a branch: the Dockerfile's branch
    }
    assert image.pins["triton_ascend"].where == "vllm-ascend/releases/v0.18.0/requirements.txt:3"
    assert any("requirements-npu.txt of verl release/v0.8.0: not vendored" in u for u in image.unmapped)


def test_the_vendored_v080_image_reads_as_verl_publishes_it() -> None:
    image = VENDORED.image("verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0")
    got = {c: p.describe() for c, p in image.pins.items()}
    # the tag names them: v0.8.0-cann9.0.0-torch_npu2.9.0.post2-a3-ubuntu22.04-py3.11-vllm
    assert image.base is not None and (image.base.cann, image.base.cann_chip, image.base.os, image.base.python) == (
        "9.0.0",
        "a3",
        "ubuntu22.04",
        "3.11",
    )
    assert got["torch_npu"] == "2.9.0.post2" and got["verl"] == "branch 0.8.0"
    assert (got["vllm"], got["vllm_ascend"], got["torch"], got["mindspeed"], got["megatron_lm"]) == (
        "0.18.0", "branch 0.18.0", "2.9.0", "core_r0.16.0", "core_r0.16.0",
    )  # fmt: skip
    assert image.pins["transformers"] == UpstreamPin(
        "transformers", "cc7ab9be508ce6ed3637bba9e50367b29b742dc6", "commit", "verl/main/Dockerfile.ascend_9.0.0_a3_v0.8.0:59"
    )


def test_a_page_without_vendored_files_is_not_written(repo_copy: Path) -> None:
    from buildkit.generate import expected_outputs
    from buildkit.matrix.load import load_matrix

    assert PARITY_PAGE in {f.path for f in expected_outputs(load_matrix(repo_copy / "compat_matrix.yaml"))}
    (repo_copy / "upstream" / "SOURCES.json").unlink()
    assert PARITY_PAGE not in {f.path for f in expected_outputs(load_matrix(repo_copy / "compat_matrix.yaml"))}
