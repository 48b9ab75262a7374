"""The verification probe's program: run inside the image with the image's own Python, as the
image's user (``python3 -c <this file's text> ARGS``), it prints what the image holds as one JSON
document. The standard library only (it runs before anything of ascendkit is known to import
there) and Python 3.9 or later (the oldest CANN base); :mod:`buildkit.image.probe` runs it,
tests/test_probe_program.py runs its parts here.

ARGS: distribution names (their top-level modules are looked up), ``ext:MODULE`` (a compiled
extension: its file and the shared libraries it needs, resolved as the loader would), and
``imp:MODULE`` (a module imported for real)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import pwd
import site
import struct
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

CANN_FILES = (
    "/usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info",
    "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
)


def read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def run(argv: list[str]) -> str | None:
    """A command's output, None when it is missing or fails (dpkg on an RPM image, say)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def installed_sha256(name: str, relative: str) -> str | None:
    """sha256 of a file of an installed distribution, None when it or the file is missing."""
    try:
        return hashlib.sha256(Path(str(metadata.distribution(name).locate_file(relative))).read_bytes()).hexdigest()
    except (metadata.PackageNotFoundError, OSError):
        return None


def patches() -> list[dict[str, Any]]:
    """The patches the build applied (/etc/ascendkit/patches.json), each with its file's sha256 now."""
    try:
        found = json.loads(read("/etc/ascendkit/patches.json") or "[]")
    except ValueError:
        return []
    done = [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []
    for patch in done:
        patch["sha256_now"] = installed_sha256(str(patch.get("package", "")), str(patch.get("file", "")))
    return done


def requirements(revisions: str) -> dict[str, list[str]]:
    """What each distribution installed from git (a line of git-revisions.txt) declares it requires."""
    requires: dict[str, list[str]] = {}
    for line in revisions.splitlines():
        name = (line.split() or [""])[0]
        with contextlib.suppress(metadata.PackageNotFoundError):
            requires[name] = list(metadata.requires(name) or [])
    return requires


def top_levels(dist: str) -> list[str]:
    """The public top-level modules of a distribution: top_level.txt, else its RECORD's files."""
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return []
    names = (found.read_text("top_level.txt") or "").split()
    if not names:
        skipped = (".dist-info", ".egg-info", ".data", ".pth")
        names = sorted(
            {
                str(f.parts[0])[: -len(".py")] if str(f.parts[0]).endswith(".py") else str(f.parts[0])
                for f in found.files or []
                if f.parts and f.parts[0] != ".." and not f.parts[0].endswith(skipped) and (len(f.parts) > 1 or f.suffix == ".py")
            }
        )
    return [n for n in names if n.isidentifier() and not n.startswith("_")]


def importable(name: str) -> str:
    """ "" when ``name`` is found on sys.path (without importing it), else why not."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return str(exc)
    return "" if spec is not None else "not found on sys.path"


def unreadable(roots: list[str], limit: int = 20) -> dict[str, Any]:
    """What the running user cannot read (files) or enter (directories) under ``roots``: the first few, and how many."""
    found: list[str] = []
    count = 0
    stack = [r for r in roots if Path(r).is_dir()]
    while stack:
        top = stack.pop()
        if not os.access(top, os.R_OK | os.X_OK):
            count += 1
            found += [top + "/"] if len(found) < limit else []
            continue
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file(follow_symlinks=False) and not os.access(entry.path, os.R_OK):
                count += 1
                found += [entry.path] if len(found) < limit else []
    return {"count": count, "first": sorted(found)}


def _program_headers(data: bytes, wide: bool, end: str) -> tuple[list[tuple[int, int, int]], tuple[int, int] | None]:
    """The PT_LOAD segments (vaddr, offset, size) and the PT_DYNAMIC one (offset, size) of an ELF file."""
    phoff = struct.unpack_from(end + ("Q" if wide else "I"), data, 0x20 if wide else 0x1C)[0]
    phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36 if wide else 0x2A)
    loads: list[tuple[int, int, int]] = []
    dynamic = None
    for i in range(phnum):
        at = phoff + i * phentsize
        if wide:
            kind, _, offset, vaddr, _, size = struct.unpack_from(end + "IIQQQQ", data, at)
        else:
            kind, offset, vaddr, _, size = struct.unpack_from(end + "IIIII", data, at)
        if kind == 1:
            loads.append((vaddr, offset, size))
        elif kind == 2:
            dynamic = (offset, size)
    return loads, dynamic


def elf_dynamic(path: str) -> tuple[list[str], list[str]]:
    """DT_NEEDED and DT_RUNPATH/DT_RPATH of an ELF shared object, read from its dynamic section."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    loads, dynamic = _program_headers(data, wide, end)
    if dynamic is None:
        return [], []
    entries: list[tuple[int, int]] = []
    step, fmt = (16, end + "qQ") if wide else (8, end + "iI")
    for at in range(dynamic[0], dynamic[0] + dynamic[1], step):
        tag, value = struct.unpack_from(fmt, data, at)
        if tag == 0:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == 5), None)
    if strtab is None:
        return [], []
    base = next((strtab - vaddr + offset for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), strtab)

    def text(i: int) -> str:
        return data[base + i : data.index(b"\0", base + i)].decode("utf-8", "replace")

    needed = [text(v) for t, v in entries if t == 1]
    paths = [p for t, v in entries if t in (15, 29) for p in text(v).split(":") if p]
    return needed, paths


def library_dirs() -> list[str]:
    """Where the loader looks: LD_LIBRARY_PATH, ld.so.conf, the defaults, and torch's and torch_npu's lib."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for conf in ["/etc/ld.so.conf", *sorted(str(p) for p in Path("/etc/ld.so.conf.d").glob("*.conf"))]:
        for line in (read(conf) or "").splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("include"):
                dirs.append(line)
    dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    for package in ("torch", "torch_npu"):  # loaded before any extension built against them
        spec = importlib.util.find_spec(package)
        dirs += [str(Path(d) / "lib") for d in (spec.submodule_search_locations or [])] if spec else []
    return dirs


def extension(name: str) -> dict[str, Any]:
    """A compiled extension module's file, the libraries it needs and those the loader would not find."""
    package, _, leaf = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(package)
    except Exception as exc:  # a dotted package imports its parents, which may fail in any way without an NPU
        return {"file": None, "error": f"package {package}: {exc}"}
    places = list(spec.submodule_search_locations or []) if spec else []
    files = [str(Path(d) / (leaf + suffix)) for d in places for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    files = [f for f in files if Path(f).is_file()] or sorted(str(f) for d in places for f in Path(d).glob(leaf + ".*so"))
    if not files:
        return {"file": None, "error": f"no {leaf}.*.so in {', '.join(places) or f'(package {package} not found)'}"}
    try:
        needed, paths = elf_dynamic(files[0])
    except (OSError, ValueError, struct.error) as exc:
        return {"file": files[0], "error": f"cannot read it as a shared object: {exc}"}
    origin = str(Path(files[0]).parent)
    search = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in paths] + library_dirs()
    unresolved = [lib for lib in needed if not any((Path(d) / lib).exists() for d in search)]
    return {"file": files[0], "needed": needed, "unresolved": unresolved}


def imported(name: str) -> str:
    """ "" when a module the matrix says must import (a tool's own) imports for real, else what it raised."""
    try:
        importlib.import_module(name)
    except BaseException as exc:  # SystemExit too: a module that exits on import does not import
        return f"{type(exc).__name__}: {exc}"
    return ""


def user(distributions: list[str]) -> dict[str, Any]:
    """Who the probe runs as, what it may write, what it cannot read, and which modules it finds."""
    uid = os.getuid()
    try:
        entry = pwd.getpwuid(uid)
        account: dict[str, Any] = {"name": entry.pw_name, "home": entry.pw_dir}
    except KeyError:
        account = {"name": None, "home": None}
    toolkit = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
    roots = sorted(set(site.getsitepackages()) | {"/etc/ascendkit", "/usr/local/lib/ascendkit", "/opt", toolkit})
    places = [p for p in (account["home"], str(Path.cwd())) if p]
    return {
        "uid": uid,
        "gid": os.getgid(),
        **account,
        "writable": {p: os.access(p, os.W_OK | os.X_OK) for p in places},
        "unreadable": unreadable(roots),
        "imports": {d: {n: importable(n) for n in top_levels(d)} for d in distributions},
    }


def _glob(pattern: str) -> list[str]:
    """The files an absolute pattern matches, sorted."""
    return sorted(str(p) for p in Path("/").glob(pattern.lstrip("/")))


def probe(argv: list[str]) -> dict[str, Any]:
    """The whole report for ``argv`` (see the module's docstring)."""
    distributions = [a for a in argv if not a.startswith(("ext:", "imp:"))]
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], capture_output=True, text=True, check=False
    )
    arch = platform.machine()
    revisions = read("/etc/ascendkit/git-revisions.txt") or ""
    return {
        "python": platform.python_version(),
        "machine": arch,
        "pip_list": json.loads(pip.stdout) if pip.returncode == 0 else None,
        "pip_error": pip.stderr[-2000:] if pip.returncode else "",
        "os_release": read("/etc/os-release") or "",
        "cann_files": {p: read(p) for pattern in CANN_FILES for p in _glob(pattern)},
        "env": {k: os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ATB_HOME_PATH")},
        "dpkg": run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n"]),
        "rpm": run(["rpm", "-qa", "--qf", "%{NAME}\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\t%{ARCH}\n"]),
        "git_revisions": revisions,
        "locks": {p: read(p) for p in _glob(f"/etc/ascendkit/locks/*-{arch}.txt")},
        "patches": patches(),
        "requires": requirements(revisions),
        "user": user(distributions),
        "extensions": {a[4:]: extension(a[4:]) for a in argv if a.startswith("ext:")},
        "imported": {a[4:]: imported(a[4:]) for a in argv if a.startswith("imp:")},
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1:])))
