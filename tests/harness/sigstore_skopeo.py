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

import subprocess
from pathlib import Path

from tests.harness.debian_packages import unpacked

SUITE = "trixie"
PACKAGES = ("skopeo", "libc6", "libgpgme11t64", "libassuan9", "libgpg-error0", "libsqlite3-0")


def skopeo_sigstore(state: Path) -> Path:
    root = unpacked(state, SUITE, PACKAGES, "skopeo")
    script = root / "skopeo.sh"
    libs = root / "usr/lib/x86_64-linux-gnu"
    loader = libs / "ld-linux-x86-64.so.2"
    run = [loader, "--library-path", libs, root / "usr/bin/skopeo"]
    if not script.is_file():
        probe = subprocess.run([*map(str, run), "--version"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            raise SystemExit(f"[services] {SUITE}'s skopeo does not run here: {probe.stderr.strip()}")
        staged = root / "skopeo.sh.partial"
        staged.write_text("#!/bin/sh\nexec " + " ".join(f'"{part}"' for part in run) + ' "$@"\n')
        staged.chmod(0o755)
        staged.rename(script)
    return script
