"""The verification probe: a short Python program run inside the image, as its own user, that
prints what the image holds as one JSON document; and the short-lived containers it runs in."""

from __future__ import annotations

import json
from typing import Any

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import VerifyFailed
from buildkit.image.engine import remove_containers
from buildkit.reach import engine_said

PROBE_LABEL = "io.ascendkit.probe"

# Runs inside the image with its own Python; prints one JSON document.
PROBE = r"""
import glob, hashlib, importlib.machinery, importlib.util, json, os, platform, pwd, site, struct, subprocess, sys
from importlib import metadata
def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None
pip = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], capture_output=True, text=True)
arch = platform.machine()
def installed(name, relative):
    try:
        with open(metadata.distribution(name).locate_file(relative), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (metadata.PackageNotFoundError, OSError):
        return None
try:
    patches = json.loads(read("/etc/ascendkit/patches.json") or "[]")
except ValueError:
    patches = []
for patch in patches:
    patch["sha256_now"] = installed(patch.get("package", ""), patch.get("file", ""))
revisions = read("/etc/ascendkit/git-revisions.txt") or ""
requires = {}
for line in revisions.splitlines():
    name = (line.split() or [""])[0]
    try:
        requires[name] = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        pass
def top_levels(dist):
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return []
    names = (found.read_text("top_level.txt") or "").split()
    if not names:
        names = sorted({str(f.parts[0]).removesuffix(".py") for f in found.files or [] if f.parts
                        and f.parts[0] != ".." and not f.parts[0].endswith((".dist-info", ".egg-info", ".data", ".pth"))
                        and (len(f.parts) > 1 or f.suffix == ".py")})
    return [n for n in names if n.isidentifier() and not n.startswith("_")]
def importable(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return str(exc)
    return "" if spec is not None else "not found on sys.path"
def unreadable(roots, limit=20):
    # what the running user cannot read (files) or enter (directories) under roots: the first few, and how many
    found, count, stack = [], 0, [r for r in roots if os.path.isdir(r)]
    def note(path):
        nonlocal count
        count += 1
        if len(found) < limit:
            found.append(path)
    while stack:
        top = stack.pop()
        if not os.access(top, os.R_OK | os.X_OK):
            note(top + "/")
            continue
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file(follow_symlinks=False) and not os.access(entry.path, os.R_OK):
                note(entry.path)
    return {"count": count, "first": sorted(found)}
def elf_dynamic(path):
    # DT_NEEDED and DT_RUNPATH/DT_RPATH of an ELF shared object, read from its dynamic section
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    phoff = struct.unpack_from(end + ("Q" if wide else "I"), data, 0x20 if wide else 0x1C)[0]
    phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36 if wide else 0x2A)
    loads, dynamic = [], None
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
    if dynamic is None:
        return [], []
    entries, step, fmt = [], 16 if wide else 8, end + ("qQ" if wide else "iI")
    for at in range(dynamic[0], dynamic[0] + dynamic[1], step):
        tag, value = struct.unpack_from(fmt, data, at)
        if tag == 0:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == 5), None)
    if strtab is None:
        return [], []
    base = next((strtab - vaddr + offset for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), strtab)
    def text(i):
        return data[base + i:data.index(b"\0", base + i)].decode("utf-8", "replace")
    needed = [text(v) for t, v in entries if t == 1]
    paths = [p for t, v in entries if t in (15, 29) for p in text(v).split(":") if p]
    return needed, paths
def library_dirs():
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for conf in ["/etc/ld.so.conf"] + sorted(glob.glob("/etc/ld.so.conf.d/*.conf")):
        for line in (read(conf) or "").splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("include"):
                dirs.append(line)
    dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    for package in ("torch", "torch_npu"):  # loaded before any extension built against them
        spec = importlib.util.find_spec(package)
        dirs += [os.path.join(d, "lib") for d in (spec.submodule_search_locations or [])] if spec else []
    return dirs
def extension(name):
    package, _, leaf = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(package)
    except Exception as exc:  # a dotted package imports its parents, which may fail in any way without an NPU
        return {"file": None, "error": "package %s: %s" % (package, exc)}
    places = list(spec.submodule_search_locations or []) if spec else []
    files = [os.path.join(d, leaf + suffix) for d in places for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    files = [f for f in files if os.path.isfile(f)] or sorted(f for d in places for f in glob.glob(os.path.join(d, leaf + ".*so")))
    if not files:
        return {"file": None, "error": "no %s.*.so in %s" % (leaf, ", ".join(places) or "(package %s not found)" % package)}
    try:
        needed, paths = elf_dynamic(files[0])
    except (OSError, ValueError, struct.error) as exc:
        return {"file": files[0], "error": "cannot read it as a shared object: %s" % exc}
    search = [p.replace("$ORIGIN", os.path.dirname(files[0])).replace("${ORIGIN}", os.path.dirname(files[0])) for p in paths]
    search += library_dirs()
    unresolved = [lib for lib in needed if not any(os.path.exists(os.path.join(d, lib)) for d in search)]
    return {"file": files[0], "needed": needed, "unresolved": unresolved}
extensions = {a[4:]: extension(a[4:]) for a in sys.argv[1:] if a.startswith("ext:")}
def imported(name):
    # a module the matrix says must import (a tool's own): imported for real, whatever it raises reported
    try:
        importlib.import_module(name)
    except BaseException as exc:  # SystemExit too: a module that exits on import does not import
        return "%s: %s" % (type(exc).__name__, exc)
    return ""
imports = {a[4:]: imported(a[4:]) for a in sys.argv[1:] if a.startswith("imp:")}
uid = os.getuid()
try:
    entry = pwd.getpwuid(uid)
    account = {"name": entry.pw_name, "home": entry.pw_dir}
except KeyError:
    account = {"name": None, "home": None}
roots = sorted(set(site.getsitepackages()) | {"/etc/ascendkit", "/usr/local/lib/ascendkit", "/opt",
               os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"})
user = {
    "uid": uid, "gid": os.getgid(), **account,
    "writable": {p: os.access(p, os.W_OK | os.X_OK) for p in filter(None, [account["home"], os.getcwd()])},
    "unreadable": unreadable(roots),
    "imports": {d: {n: importable(n) for n in top_levels(d)} for d in sys.argv[1:] if not d.startswith(("ext:", "imp:"))},
}
patterns = ["/usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info",
            "/usr/local/Ascend/ascend-toolkit/latest/version.cfg"]
print(json.dumps({
    "python": platform.python_version(),
    "machine": platform.machine(),
    "pip_list": json.loads(pip.stdout) if pip.returncode == 0 else None,
    "pip_error": pip.stderr[-2000:] if pip.returncode else "",
    "os_release": read("/etc/os-release") or "",
    "cann_files": {p: read(p) for pattern in patterns for p in sorted(glob.glob(pattern))},
    "env": {k: os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ATB_HOME_PATH")},
    "dpkg": run(["dpkg-query", "-W", "-f", "${Package}\\t${Version}\\t${Architecture}\\n"]),
    "rpm": run(["rpm", "-qa", "--qf", "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"]),
    "git_revisions": revisions,
    "locks": {p: read(p) for p in sorted(glob.glob("/etc/ascendkit/locks/*-" + arch + ".txt"))},
    "patches": patches,
    "requires": requires,
    "user": user,
    "extensions": extensions,
    "imported": imports,
}))
"""


def run_in_image(client: docker.APIClient, image_id: str, command: list[str], timeout: int = 300) -> tuple[int, str, str]:
    """Run ``command`` in a short-lived container (no network, the image's entrypoint); always removed."""
    container = client.create_container(image_id, command=command, network_disabled=True, labels={PROBE_LABEL: "1"})
    cid = container["Id"]
    try:
        client.start(cid)
        status = client.wait(cid, timeout=timeout)
        stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = client.logs(cid, stdout=False, stderr=True).decode("utf-8", "replace")
    except (DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise VerifyFailed(f"could not run the verification container: {engine_said(exc)}") from None
    finally:
        remove_containers(client, [cid])
    return int(status.get("StatusCode", -1)), stdout, stderr


def run_probe(
    client: docker.APIClient,
    image_id: str,
    distributions: tuple[str, ...] = (),
    extensions: tuple[str, ...] = (),
    imports: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The probe, run as the image's own user; it also finds the top-level modules of ``distributions``,
    for each compiled extension module of ``extensions`` its file and the shared libraries it needs,
    and imports each module of ``imports`` for real."""
    argv = ["python3", "-c", PROBE, *distributions, *(f"ext:{name}" for name in extensions), *(f"imp:{name}" for name in imports)]
    code, stdout, stderr = run_in_image(client, image_id, argv)
    if code != 0:
        raise VerifyFailed(f"the verification probe exited with {code}:\n{stderr[-2000:]}")
    try:
        data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VerifyFailed(f"the verification probe printed no JSON:\n{stdout[-1000:]}{stderr[-1000:]}") from None
    return data
