"""The requirements of a framework built from a git checkout, read at its pinned commit.

``ascendkit lock`` needs what the checkout's setup.py installs (OpenRLHF with TARGET_DEVICE=NPU:
``requirements-npu.txt``) without building it, as it reads an sdist's requirement file for vllm.
The file is fetched once from the git host, or the mirror given for it, with ``git fetch`` of that
one commit (git checks every object it receives against the commit id), and kept beside the locks
in ``locks/_sources/<repo>/<commit>/<file>``: a re-lock then needs no git host, a reviewer reads
what the lock was made from, and the lock's header holds the file's sha256, so ``render --check``
notices a copy that was edited.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from buildkit.fsio import write_atomic
from buildkit.lock.index import IndexUnreachable
from buildkit.lock.inputs import CheckoutSpec, LockFailed
from buildkit.lock.sdist import requirement_lines
from buildkit.settings import split_credentials

GIT_TIMEOUT_S = 120


@dataclass(frozen=True)
class CheckoutRequirements:
    spec: CheckoutSpec
    sha256: str
    requires: tuple[str, ...]

    def header_line(self) -> str:
        """How the lock records it (``read_lock`` reads it back; ``lock_problem`` checks the file)."""
        return f"{self.spec.layer} {self.spec.url}@{self.spec.commit} {self.spec.stored} sha256:{self.sha256}"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class GitSourceReader:
    """Reads each checkout's requirements file once: from ``locks/_sources`` when it is there, else
    from the git host (``host_urls`` maps the matrix's host URL to the one to use: a mirror)."""

    def __init__(self, root: Path, host_urls: dict[str, str] | None = None, *, keep: bool = True, timeout: float = GIT_TIMEOUT_S) -> None:
        self.root = root
        self.host_urls = host_urls or {}
        self.keep = keep  # write what was fetched into locks/_sources (not for `matrix verify`)
        self.timeout = timeout
        self._lock = threading.Lock()

    def requirements(self, spec: CheckoutSpec) -> CheckoutRequirements:
        path = self.root / spec.stored
        with self._lock:  # two arches of one stack ask for the same file at once
            if path.is_file():
                text = path.read_text(encoding="utf-8")
            else:
                text = self.fetch(spec)
                if self.keep:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(path, text)
        lines = requirement_lines(text, f"{spec.repo_path}@{spec.commit[:12]}: {spec.file}", spec.file)
        return CheckoutRequirements(spec, sha256_text(text), tuple(lines))

    def fetch(self, spec: CheckoutSpec) -> str:
        base = self.host_urls.get(spec.host_url, spec.host_url)
        url = f"{base.rstrip('/')}/{spec.repo_path}"
        public = split_credentials(url)[0]
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
        with tempfile.TemporaryDirectory(prefix="ascendkit-git-") as tmp:
            steps = (
                ["git", "init", "--bare", "--quiet", tmp],
                ["git", "-C", tmp, "fetch", "--quiet", "--depth=1", url, spec.commit],
            )
            for argv in steps:
                try:
                    done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, env=env, check=False)
                except FileNotFoundError:
                    raise LockFailed("git is not installed: `ascendkit lock` reads the requirements of git checkouts with it") from None
                except subprocess.TimeoutExpired:
                    raise IndexUnreachable(public, f"git fetch of {spec.commit[:12]} took over {self.timeout:g} s") from None
                if done.returncode != 0:
                    said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
                    said = said.replace(url, public)
                    if "not our ref" in said or "couldn't find remote ref" in said or "unadvertised object" in said:
                        raise LockFailed(f"{public} has no commit {spec.commit} (the ref of {spec.layer} in the matrix): {said}")
                    raise IndexUnreachable(public, f"git fetch failed: {said}")
            shown = subprocess.run(
                ["git", "-C", tmp, "show", f"{spec.commit}:{spec.file}"], capture_output=True, timeout=self.timeout, check=False
            )
        if shown.returncode != 0:
            raise LockFailed(f"{public}@{spec.commit[:12]} has no {spec.file} (the requirements file the matrix names for {spec.layer})")
        return shown.stdout.decode("utf-8")
