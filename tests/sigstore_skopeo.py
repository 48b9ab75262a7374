"""A skopeo that checks and makes sigstore signatures, for the signing tests.

Debian bookworm's skopeo 1.9.3 is built with sigstore cut out ("Debian-local change: sigstore
disabled": its ``sigstoreSigned`` policy and ``--sign-by-sigstore-private-key`` both fail). Debian
trixie's skopeo 1.18 has it, and needs trixie's C library. So its package and those of the
libraries it links are taken from Debian's archive (each checked against the sha256 the signed-by-
Debian ``Packages`` index gives), unpacked side by side, and run with trixie's own loader: no
container, nothing installed on the host. The result is cached in the services directory.

    skopeo_sigstore(state_dir) -> Path   # a script that runs it: `<script> copy ...`
"""

from __future__ import annotations

import hashlib
import lzma
import subprocess
import tempfile
import urllib.request
from pathlib import Path

ARCHIVE = "http://deb.debian.org/debian"
SUITE = "trixie"
PACKAGES = ("skopeo", "libc6", "libgpgme11t64", "libassuan9", "libgpg-error0", "libsqlite3-0")
VERSION = "1"  # bump to re-fetch


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        data: bytes = response.read()
        return data


def _index() -> dict[str, dict[str, str]]:
    """Package -> its Filename and SHA256 in trixie's amd64 Packages index."""
    text = lzma.decompress(_fetch(f"{ARCHIVE}/dists/{SUITE}/main/binary-amd64/Packages.xz")).decode()
    found: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") in PACKAGES and fields.get("Architecture") in ("amd64", None):
            found[fields["Package"]] = fields
    return found


def skopeo_sigstore(state: Path) -> Path:
    root = state / f"skopeo-{SUITE}-v{VERSION}"
    script = root / "skopeo"
    if script.is_file():
        return script
    index = _index()
    missing = [p for p in PACKAGES if p not in index]
    if missing:
        raise SystemExit(f"[services] {SUITE}'s Packages index has no {', '.join(missing)}")
    with tempfile.TemporaryDirectory(dir=state) as tmp:
        unpacked = Path(tmp) / "root"
        for name in PACKAGES:
            deb = _fetch(f"{ARCHIVE}/{index[name]['Filename']}")
            if hashlib.sha256(deb).hexdigest() != index[name]["SHA256"]:
                raise SystemExit(f"[services] {name}: the download does not match the sha256 of {SUITE}'s index")
            path = Path(tmp) / f"{name}.deb"
            path.write_bytes(deb)
            subprocess.run(["dpkg-deb", "-x", str(path), str(unpacked)], check=True)
        libs = unpacked / "usr/lib/x86_64-linux-gnu"
        loader = libs / "ld-linux-x86-64.so.2"
        final = root / "root"
        run = [final / loader.relative_to(unpacked), "--library-path", final / libs.relative_to(unpacked), final / "usr/bin/skopeo"]
        wrapper = "#!/bin/sh\nexec " + " ".join(f'"{part}"' for part in run) + ' "$@"\n'
        staged = Path(tmp) / "skopeo"
        staged.write_text(wrapper)
        staged.chmod(0o755)
        probe = subprocess.run(
            [str(loader), "--library-path", str(libs), str(unpacked / "usr/bin/skopeo"), "--version"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0:
            raise SystemExit(f"[services] {SUITE}'s skopeo does not run here: {probe.stderr.strip()}")
        root.mkdir(parents=True, exist_ok=True)
        unpacked.rename(root / "root")
        staged.rename(script)
    return script
