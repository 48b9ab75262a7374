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
import glob, hashlib, importlib.util, json, os, platform, pwd, site, subprocess, sys
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
    "imports": {d: {n: importable(n) for n in top_levels(d)} for d in sys.argv[1:]},
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


def run_probe(client: docker.APIClient, image_id: str, distributions: tuple[str, ...] = ()) -> dict[str, Any]:
    """The probe, run as the image's own user; it also finds the top-level modules of ``distributions``."""
    code, stdout, stderr = run_in_image(client, image_id, ["python3", "-c", PROBE, *distributions])
    if code != 0:
        raise VerifyFailed(f"the verification probe exited with {code}:\n{stderr[-2000:]}")
    try:
        data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VerifyFailed(f"the verification probe printed no JSON:\n{stdout[-1000:]}{stderr[-1000:]}") from None
    return data
