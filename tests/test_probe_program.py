"""The verification probe's program (buildkit/image/probe_program.py) as a module here: standard
library only, Python 3.9 grammar, its ELF reader held to binutils' readelf, and the whole program
run the way verify runs it in an image (``python3 -c SOURCE ARGS``). The docker tests run it in
every built image (tests/test_build.py, tests/test_verify.py)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml._yaml

from buildkit.image import probe_program
from buildkit.image.probe import PROGRAM

SOURCE = PROGRAM.read_text(encoding="utf-8")


def test_the_program_needs_the_standard_library_only_and_python_3_9() -> None:
    tree = ast.parse(SOURCE, feature_version=(3, 9))
    modules = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert modules - {"__future__"} <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_the_elf_reader_agrees_with_readelf() -> None:
    """DT_NEEDED and RUNPATH of a real compiled extension, as binutils reads them."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("binutils' readelf is not installed here")
    path = str(yaml._yaml.__file__)
    shown = subprocess.run([readelf, "-d", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", shown)
    paths = [p for found in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]+)\]", shown) for p in found.split(":")]
    assert probe_program.elf_dynamic(path) == (needed, paths)
    assert needed, "an extension module needs libc at least"


def test_an_extension_is_found_and_its_libraries_resolved() -> None:
    found = probe_program.extension("yaml._yaml")
    assert found["file"] == str(yaml._yaml.__file__) and found["unresolved"] == [], found
    missing = probe_program.extension("yaml._nothing_here")
    assert missing["file"] is None and missing["error"].startswith("no _nothing_here.*.so in ")
    assert probe_program.extension("no_such_package._x")["error"] == "no _x.*.so in (package no_such_package not found)"


def test_not_an_elf_file_is_said(tmp_path: Path) -> None:
    fake = tmp_path / "x.so"
    fake.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not an ELF file"):
        probe_program.elf_dynamic(str(fake))


def test_modules_and_imports() -> None:
    assert "yaml" in probe_program.top_levels("PyYAML")
    assert probe_program.top_levels("no-such-distribution") == []
    assert probe_program.importable("json") == "" and probe_program.importable("no_such_module_x") == "not found on sys.path"
    assert probe_program.imported("json") == ""
    assert probe_program.imported("no_such_module_x").startswith("ModuleNotFoundError: ")


def test_requirements_of_what_git_revisions_names() -> None:
    requires = probe_program.requirements("requests https://example.invalid/requests abc123\nno-such-dist x y\n")
    assert any(r.startswith("urllib3") for r in requires["requests"]) and "no-such-dist" not in requires


def test_the_whole_program_as_verify_runs_it() -> None:
    argv = [sys.executable, "-c", SOURCE, "PyYAML", "ext:yaml._yaml", "imp:json", "imp:no_such_module_x"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["user"]["imports"] == {"PyYAML": {"yaml": ""}}
    assert report["extensions"]["yaml._yaml"]["unresolved"] == []
    assert report["imported"] == {"json": "", "no_such_module_x": "ModuleNotFoundError: No module named 'no_such_module_x'"}
    assert isinstance(report["pip_list"], list) or report["pip_error"], "pip answered, or said why not"
