"""Debian packages of a named suite, fetched from Debian's archive and unpacked beside the system
(nothing installed, the host's apt state untouched), each checked against the sha256 of the suite's
signed-by-Debian ``Packages`` index. How the tests run the engines users have whatever this
machine's own release is (docs/engines.md): Docker 20.10 from bookworm, Docker 26.1.5 with its
containerd and buildx from trixie, trixie's skopeo.

    unpacked(state_dir, "trixie", ("docker.io", "containerd"), "engine") -> Path   # the root they were unpacked into
"""

from __future__ import annotations

import hashlib
import lzma
import platform
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

ARCHIVE = "http://deb.debian.org/debian"
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
VERSION = "1"  # bump to fetch again


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as response:
        data: bytes = response.read()
        return data


def index(suite: str, packages: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Package -> its fields (Filename, SHA256, Version) in ``suite``'s main index for this machine's arch."""
    text = lzma.decompress(fetch(f"{ARCHIVE}/dists/{suite}/main/binary-{DEB_ARCH}/Packages.xz")).decode()
    found: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") in packages and fields.get("Architecture") in (DEB_ARCH, "all"):
            found[fields["Package"]] = fields
    missing = [p for p in packages if p not in found]
    if missing:
        raise SystemExit(f"[services] {suite}'s Packages index has no {', '.join(missing)}")
    return found


def unpacked(state: Path, suite: str, packages: tuple[str, ...], name: str) -> Path:
    """The root ``packages`` of ``suite`` are unpacked into (``<state>/<name>-<suite>-v<VERSION>``),
    made once; its ``versions`` file lists each package's version."""
    root = state / f"{name}-{suite}-v{VERSION}"
    stamp = root / "versions"
    if stamp.is_file() and stamp.read_text().split("\n", 1)[0] == " ".join(packages):
        return root
    shutil.rmtree(root, ignore_errors=True)
    fields = index(suite, packages)
    with tempfile.TemporaryDirectory(dir=state) as tmp:
        staged = Path(tmp) / "root"
        for package in packages:
            deb = fetch(f"{ARCHIVE}/{fields[package]['Filename']}")
            if hashlib.sha256(deb).hexdigest() != fields[package]["SHA256"]:
                raise SystemExit(f"[services] {package}: the download does not match the sha256 of {suite}'s index")
            path = Path(tmp) / f"{package}.deb"
            path.write_bytes(deb)
            subprocess.run(["dpkg-deb", "-x", str(path), str(staged)], check=True)
        (staged / "versions").write_text(" ".join(packages) + "\n" + "".join(f"{p} {fields[p]['Version']}\n" for p in packages))
        staged.rename(root)
    return root
