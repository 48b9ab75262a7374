"""Bad input, tried the way a new user would, across every command: paths, numbers, files, options.

Each case runs the real ``ascendkit`` in a fresh directory, as its own process with a memory limit
and a deadline, forked from a server that has imported ascendkit's libraries once
(tests/harness/forkrun.py: the same ``python -m buildkit``, without two hundred processes each importing
them again); the tripwires' own test and ``-o -`` start ``python -m buildkit`` from nothing.
DOCKER_HOST points at a tripwire socket and every HTTP(S) proxy at a tripwire port, so a refusal
must come before the engine, a registry, an index or a git host is contacted: the case fails if
anything connected to either. Every case asserts the documented exit code, a
message naming the problem, no traceback, and that no file or folder was created, replaced or
changed (FIFOs, devices and symlink targets included).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from buildkit.trust.keys import generate
from tests.conftest import MATRIX, ROOT, RUN_MEMORY, RUN_TIMEOUT_S
from tests.harness.forkrun import ForkServer

ASCENDKIT = [sys.executable, "-m", "buildkit"]
DIGEST = "127.0.0.1:5000/ascendkit/verl@sha256:" + "ab" * 32
TIME_LIMIT_S = 30.0  # CPU seconds a refusal may take: what the command did, whatever the machine's load
HUGE = "99999999999999999999"

ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=True)
)
DEEP = "a: " + "[" * 50_000 + "]" * 50_000 + "\n"
BASELINE_BAD_SHAPE = json.dumps({"format": "ascendkit-baseline/1", "steps": [{"step": 1, "metrics": {"critic/rewards/mean": "high"}}]})
WRONG_SHAPES = "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: [1]\nspec: {rayClusterSpec: {headGroupSpec: x, workerGroupSpecs: 3}}\n"
LOG = "".join(f"step:{i} - critic/rewards/mean:0.{i} - actor/pg_loss:0.1 - perf/throughput:100\n" for i in range(1, 6))


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]  # "{d}" is the case's directory
    code: int
    message: str  # must appear on stderr (case-insensitive)
    setup: Callable[[Path], None] = field(default=lambda d: None)


def files(**contents: str | bytes) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        for name, body in contents.items():
            path = d / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body if isinstance(body, bytes) else body.encode())

    return make


def build_manifest(text: str) -> Callable[[Path], None]:
    """``m/a.json``: a file where `publish --index-only` looks for build manifests."""

    def make(d: Path) -> None:
        (d / "m").mkdir()
        (d / "m" / "a.json").write_text(text, encoding="utf-8")

    return make


def fifo(name: str) -> Callable[[Path], None]:
    return lambda d: os.mkfifo(d / name)


def symlink(name: str, target: str) -> Callable[[Path], None]:
    return lambda d: (d / name).symlink_to(target)


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        for step in steps:
            step(d)

    return make


def render_all_tree(d: Path) -> None:
    """A matrix checkout where one output of render --all is a directory: nothing may be written."""
    shutil.copy(MATRIX, d / "compat_matrix.yaml")
    shutil.copytree(ROOT / "locks", d / "locks")
    shutil.copy(ROOT / "README.md", d / "README.md")
    (d / "Dockerfile.a3").mkdir()


M = ["--matrix", str(MATRIX)]
PUBLISH = ["publish", "a:1", "--registry", "127.0.0.1:5000/x"]
_KEY, _PUB = generate(b"bad-inputs")
KEYS = files(**{"c.key": _KEY, "c.pub": _PUB, "cosign.key": _KEY, "cosign.pub": _PUB})
SMOKE = ["smoke", "--hw", "a3", "--image", "ascendkit/verl:x", "--out", "{d}/out", *M]
K8S = ["k8s", "render", "--hw", "a3", "--image", DIGEST, "--job", "train", *M]
TRAIN = ["--", "python3", "-c", "pass"]
PREFLIGHT = ["k8s", "render", "--hw", "a3", "--image", "harbor.example.com/rl/verl:1", "--job", "preflight", *M]
PREPULL = ["k8s", "render", "--hw", "a3", "--image", "harbor.example.com/rl/verl:1", "--job", "prepull", *M]

CASES = [
    # --- the matrix file ----------------------------------------------------------------------
    Case("matrix-missing", ["matrix", "validate", "--matrix", "{d}/nope.yaml"], 2, "not found"),
    Case("matrix-directory", ["matrix", "validate", "--matrix", "{d}"], 2, "a directory"),
    Case("matrix-symlink-loop", ["matrix", "validate", "--matrix", "{d}/loop.yaml"], 2, "loop.yaml", symlink("loop.yaml", "loop.yaml")),
    Case("matrix-dangling-symlink", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "m.yaml", symlink("m.yaml", "gone.yaml")),
    Case("matrix-fifo", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "a FIFO", fifo("m.yaml")),
    Case("matrix-device", ["matrix", "validate", "--matrix", "/dev/zero"], 2, "a character device"),
    Case("matrix-empty", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "empty", files(**{"m.yaml": ""})),
    Case("matrix-binary", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "not UTF-8", files(**{"m.yaml": b"\xff\xfe\x00garbage"})),
    Case("matrix-not-yaml", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "malformed YAML", files(**{"m.yaml": "a: [b\n"})),
    Case("matrix-a-list", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "must be a mapping", files(**{"m.yaml": "- 1\n"})),
    Case("matrix-alias-bomb", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "alias bomb", files(**{"m.yaml": ALIAS_BOMB})),
    Case("matrix-deep-nesting", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "levels deep", files(**{"m.yaml": DEEP})),
    Case("matrix-huge", ["matrix", "validate", "--matrix", "{d}/m.yaml"], 2, "MiB", files(**{"m.yaml": b"#" * (65 << 20)})),
    Case("matrix-name-too-long", ["matrix", "validate", "--matrix", "{d}/" + "m" * 300 + ".yaml"], 2, "File name too long"),
    Case("matrix-in-a-file", ["render", "--hw", "a3", "--matrix", "{d}/f/compat_matrix.yaml"], 2, "matrix file not found", files(f="x")),
    Case("show-unknown-stack", ["matrix", "show", "cann0.0", *M], 2, "cann0.0"),
    Case("verify-bad-arch", ["matrix", "verify", "--arch", "sparc", *M], 2, "sparc"),
    Case("verify-fresh-and-no-resolve", ["matrix", "verify", "--fresh", "--no-resolve", *M], 2, "exclude each other"),
    Case("verify-ca-missing", ["matrix", "verify", "--ca-bundle", "{d}/ca.pem", *M], 2, "ca.pem"),
    Case("verify-ca-not-pem", ["matrix", "verify", "--ca-bundle", "{d}/ca.pem", *M], 2, "PEM", files(**{"ca.pem": "x"})),
    Case("verify-bad-mirror", ["matrix", "verify", "--pip-index-url", "pypi.example/simple", *M], 2, "expected http(s) URL"),
    Case("outdated-ca-not-pem", ["matrix", "outdated", "--ca-bundle", "{d}/ca.pem", *M], 2, "PEM", files(**{"ca.pem": "x"})),
    Case("outdated-unknown-stack", ["matrix", "outdated", "--stack", "nope", *M], 2, "nope"),
    Case("outdated-propose-no-stack", ["matrix", "outdated", "--propose", "new", *M], 2, "give --stack"),
    Case("outdated-propose-bad-id", ["matrix", "outdated", "-s", "cann8.3", "--propose", "New Stack", *M], 2, "stack id"),
    Case("lock-bad-exclude-newer", ["lock", "--exclude-newer", "last tuesday", *M], 2, "--exclude-newer 'last tuesday'"),
    Case("outdated-bad-mirror", ["matrix", "outdated", "--ascend-index-url", "x", *M], 2, "expected http(s) URL"),
    Case("outdated-config-missing", ["matrix", "outdated", "--config", "{d}/nope.toml", *M], 2, "config file not found"),
    Case("schema-to-dev-null", ["matrix", "schema", "-o", "/dev/null"], 3, "not a regular file"),
    Case("schema-to-fifo", ["matrix", "schema", "-o", "{d}/out"], 3, "a FIFO", fifo("out")),
    # --- render ---------------------------------------------------------------------------------
    Case("render-no-hw", ["render", *M], 2, "give --hw"),
    Case("render-unknown-hw", ["render", "--hw", "a9", *M], 2, "a9"),
    Case("render-unknown-stack", ["render", "--hw", "a3", "--stack", "nope", *M], 2, "nope"),
    Case("render-unknown-os", ["render", "--hw", "a3", "--os", "windows", *M], 2, "windows"),
    Case("render-empty-os", ["render", "--hw", "a3", "--os", "", *M], 2, "--os ''"),
    Case("render-empty-stack", ["render", "--hw", "a3", "--stack", "", *M], 2, "stack ''"),
    Case("render-empty-hw", ["render", "--hw", "", *M], 2, "--hw"),
    Case("render-to-read-only-fs", ["render", "--hw", "a3", "-o", "/proc/Dockerfile", *M], 3, "cannot write"),
    Case("render-to-name-too-long", ["render", "--hw", "a3", "-o", "{d}/" + "D" * 300, *M], 3, "File name too long"),
    Case("render-all-with-hw", ["render", "--all", "--hw", "a3", *M], 2, "--all/--check"),
    Case("render-to-dev-null", ["render", "--hw", "a3", "-o", "/dev/null", *M], 3, "not a regular file"),
    Case("render-to-fifo", ["render", "--hw", "a3", "-o", "{d}/Dockerfile", *M], 3, "a FIFO", fifo("Dockerfile")),
    Case(
        "render-to-symlink",
        ["render", "--hw", "a3", "-o", "{d}/link", *M],
        3,
        "symlink",
        both(files(keep="mine\n"), symlink("link", "keep")),
    ),
    Case("render-to-directory", ["render", "--hw", "a3", "-o", "{d}", *M], 3, "a directory"),
    Case("render-to-missing-dir", ["render", "--hw", "a3", "-o", "{d}/no/such/Dockerfile", *M], 3, "does not exist"),
    Case("render-to-file-as-dir", ["render", "--hw", "a3", "-o", "{d}/f/Dockerfile", *M], 3, "not a directory", files(f="x")),
    Case("render-all-one-output-blocked", ["render", "--all", "--matrix", "{d}/compat_matrix.yaml"], 3, "Dockerfile.a3", render_all_tree),
    # --- plan -------------------------------------------------------------------------------------
    Case("plan-nothing-named", ["plan", *M], 2, "give --all"),
    Case("plan-all-and-a-filter", ["plan", "--all", "--stack", "cann8.3", *M], 2, "not both"),
    Case("plan-unknown-stack", ["plan", "--stack", "nope", *M], 2, "nope"),
    Case("plan-unknown-os", ["plan", "--os", "windows", *M], 2, "windows"),
    Case("plan-empty-os", ["plan", "--os", "", *M], 2, "''"),
    Case("plan-bad-arch", ["plan", "--arch", "sparc", *M], 2, "sparc"),
    Case("plan-nothing-matches", ["plan", "--stack", "cann8.1", "--hw", "a3", *M], 2, "no image of the matrix matches"),
    # --- lock and wheelhouse ----------------------------------------------------------------------
    Case("lock-unknown-stack", ["lock", "--stack", "nope", *M], 2, "nope"),
    Case("lock-bad-arch", ["lock", "--arch", "sparc", *M], 2, "sparc"),
    Case("lock-jobs-zero", ["lock", "--jobs", "0", *M], 2, "--jobs"),
    Case("lock-jobs-huge", ["lock", "--jobs", HUGE, *M], 2, "--jobs"),
    Case("lock-config-missing", ["lock", "--config", "{d}/none.toml", *M], 2, "none.toml"),
    Case("lock-config-fifo", ["lock", "--config", "{d}/c.toml", *M], 2, "a FIFO", fifo("c.toml")),
    Case("lock-config-not-toml", ["lock", "--config", "{d}/c.toml", *M], 2, "not valid TOML", files(**{"c.toml": "[mirrors\n"})),
    Case("lock-ca-not-pem", ["lock", "--ca-bundle", "{d}/ca.pem", *M], 2, "PEM", files(**{"ca.pem": "x"})),
    Case(
        "wheelhouse-ca-missing",
        ["wheelhouse", "--stack", "cann8.3", "--arch", "aarch64", "-o", "{d}/wh", "--ca-bundle", "{d}/ca.pem", *M],
        2,
        "ca.pem",
    ),
    Case("wheelhouse-bad-arch", ["wheelhouse", "--stack", "cann8.3", "--arch", "sparc", "-o", "{d}/wh", *M], 2, "sparc"),
    Case(
        "wheelhouse-into-a-file",
        ["wheelhouse", "--stack", "cann8.3", "--arch", "aarch64", "-o", "{d}/wh", *M],
        3,
        "not a directory",
        files(wh="x"),
    ),
    Case(
        "wheelhouse-into-dev-null", ["wheelhouse", "--stack", "cann8.3", "--arch", "aarch64", "-o", "/dev/null", *M], 3, "not a directory"
    ),
    # --- build and publish (no engine here: these must be refused before it is contacted) ----------
    Case("build-unknown-hw", ["build", "--hw", "a9", *M], 2, "a9"),
    Case("build-nothing-named", ["build", *M], 2, "give --hw"),
    Case("build-all-dry-run", ["build", "--all", "--dry-run", *M], 2, "ascendkit plan"),
    Case("build-all-nothing-matches", ["build", "--all", "--stack", "cann8.1", "--hw", "a3", *M], 2, "no image of the matrix matches"),
    Case("build-bad-arch", ["build", "--hw", "a3", "--arch", "sparc", *M], 2, "sparc"),
    Case("build-unknown-installer", ["build", "--hw", "a3", "--installer", "conda", *M], 2, "'conda' is not one of 'uv', 'pip'"),
    Case("build-all-unknown-installer", ["build", "--all", "--installer", "", *M], 2, "is not one of 'uv', 'pip'"),
    Case("build-push-no-registry", ["build", "--hw", "a3", "--push", *M], 2, "--registry"),
    Case("build-bad-registry", ["build", "--hw", "a3", "--push", "--registry", "Not A Ref", *M], 2, "Not A Ref"),
    Case("build-offline-alone", ["build", "--hw", "a3", "--offline", *M], 2, "--wheelhouse"),
    Case("build-wheelhouse-missing", ["build", "--hw", "a3", "--arch", "x86_64", "--offline", "--wheelhouse", "{d}/wh", *M], 2, "wh"),
    Case("build-ca-missing", ["build", "--hw", "a3", "--arch", "x86_64", "--ca-bundle", "{d}/ca.pem", *M], 2, "ca.pem"),
    Case("build-ca-fifo", ["build", "--hw", "a3", "--arch", "x86_64", "--ca-bundle", "{d}/ca.pem", *M], 2, "a FIFO", fifo("ca.pem")),
    Case(
        "build-ca-not-pem", ["build", "--hw", "a3", "--arch", "x86_64", "--ca-bundle", "{d}/ca.pem", *M], 2, "PEM", files(**{"ca.pem": "x"})
    ),
    Case("build-base-twice", ["build", "--hw", "a3", "--base-image", "x", "--base-registry", "y", *M], 2, "give one"),
    Case("build-base-image-not-a-ref", ["build", "--hw", "a3", "--base-image", "UPPER/Case:tag@@", *M], 2, "--base-image"),
    Case("build-base-image-empty", ["build", "--hw", "a3", "--base-image", "", *M], 2, "--base-image"),
    Case("build-base-registry-not-a-host", ["build", "--hw", "a3", "--base-registry", "Bad Host/x", *M], 2, "base_registry"),
    Case("build-repo-not-a-name", ["build", "--hw", "a3", "--repo", "Bad Repo", *M], 2, "--repo"),
    Case("build-repo-with-a-tag", ["build", "--hw", "a3", "--repo", "ascendkit/verl:v1", *M], 2, "without a tag"),
    Case("build-all-repo-not-a-name", ["build", "--all", "--repo", "Bad Repo", *M], 2, "--repo"),
    Case("build-all-bad-arch", ["build", "--all", "--arch", "sparc", *M], 2, "sparc"),
    Case("build-all-unknown-stack", ["build", "--all", "--stack", "nope", *M], 2, "nope"),
    Case(
        "build-manifest-dir-file",
        ["build", "--hw", "a3", "--arch", "x86_64", "--manifest-dir", "{d}/m", *M],
        3,
        "not a directory",
        files(m="x"),
    ),
    Case("build-manifest-dir-device", ["build", "--hw", "a3", "--arch", "x86_64", "--manifest-dir", "/dev/null", *M], 3, "not a directory"),
    Case("publish-bad-registry", ["publish", "ascendkit/verl:x", "--registry", "UPPER/Case"], 2, "UPPER/Case"),
    Case("publish-image-not-a-ref", ["publish", "Bad Image!!", "--registry", "127.0.0.1:5000/x"], 2, "not an image reference"),
    Case("publish-image-empty", ["publish", "", "--registry", "127.0.0.1:5000/x"], 2, "not an image reference"),
    Case("publish-manifest-dir-missing", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}/none"], 2, "no such"),
    Case("build-registry-without-push", ["build", "--hw", "a3", "--registry", "127.0.0.1:5000/x", *M], 2, "give --push"),
    Case("build-no-index-without-push", ["build", "--hw", "a3", "--no-index", *M], 2, "--no-index"),
    Case("publish-nothing", ["publish", "--registry", "127.0.0.1:5000/x"], 2, "give the local IMAGES"),
    Case("publish-no-registry", ["publish", "ascendkit/verl:x"], 2, "give --registry"),
    Case("publish-registry-twice", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--registry", "127.0.0.1:5000/x"], 2, "twice"),
    Case("publish-bad-second-registry", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--registry", "nohost"], 2, "'nohost'"),
    Case("publish-media-types-unknown", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--media-types", "swr"], 2, "swr"),
    Case("publish-compression-unknown", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--compression", "xz"], 2, "xz"),
    Case(
        "publish-docker-zstd",
        ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--media-types", "docker", "--compression", "zstd"],
        2,
        "zstd needs OCI media types",
    ),
    Case(
        "publish-index-only-docker-zstd",
        ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--media-types", "docker", "--compression", "zstd"],
        2,
        "zstd needs OCI media types",
    ),
    Case("build-media-types-without-push", ["build", "--hw", "a3", "--media-types", "oci", *M], 2, "give --push"),
    Case("build-zstd-without-push", ["build", "--hw", "a3", "--compression", "zstd", *M], 2, "give --push"),
    Case("build-lazy-without-push", ["build", "--hw", "a3", "--lazy", "soci", *M], 2, "give --push"),
    Case(
        "publish-lazy-docker-media-types",
        ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--media-types", "docker", "--lazy", "soci"],
        2,
        "a SOCI index is an OCI manifest",
    ),
    Case("publish-lazy-unknown", ["publish", "a:1", "--registry", "127.0.0.1:5000/x", "--lazy", "estargz"], 2, "'estargz'"),
    Case("publish-lazy-index-only", ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--lazy", "soci"], 2, "not --index-only"),
    Case("mirror-src-no-registry", ["mirror", "ascendkit/verl:latest", "127.0.0.1:5000/x"], 2, "mirror SRC"),
    Case("mirror-src-not-a-ref", ["mirror", "127.0.0.1:5000/Bad Ref", "127.0.0.1:5000/x"], 2, "mirror SRC"),
    Case("mirror-dst-digest", ["mirror", "127.0.0.1:5000/a:t", "127.0.0.1:5001/b@sha256:" + "c" * 64], 2, "mirror DST"),
    Case("mirror-dst-no-repository", ["mirror", "127.0.0.1:5000/a:t", "127.0.0.1:5001"], 2, "expected HOST"),
    Case("mirror-docker-media-types-unknown", ["mirror", "127.0.0.1:5000/a:t", "127.0.0.1:5001/b", "--media-types", "x"], 2, "'x'"),
    Case("publish-index-only-with-images", ["publish", "img", "--index-only", "--registry", "127.0.0.1:5000/x"], 2, "--index-only"),
    Case("publish-dry-run-alone", ["publish", "img", "--dry-run", "--registry", "127.0.0.1:5000/x"], 2, "--dry-run"),
    Case(
        "publish-index-only-no-dir",
        ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}/none"],
        2,
        "no such",
    ),
    Case(
        "publish-index-only-not-json",
        ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}/m"],
        2,
        "not JSON",
        build_manifest("{"),
    ),
    Case(
        "publish-index-only-unpushed",
        ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}/m"],
        7,
        "records no push",
        build_manifest('{"image": {"id": "sha256:1", "tags": ["ascendkit/verl:x-x86_64"]}, "passed": true, "arch": "x86_64"}'),
    ),
    Case(
        "publish-index-only-not-a-record",
        ["publish", "--index-only", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}/m"],
        2,
        "a.json: not an ascendkit build manifest (no image)",
        build_manifest('{"passed": true, "arch": "x86_64"}'),
    ),
    # --- keys, signing, verifying ------------------------------------------------------------------
    Case("publish-sign-key-missing", [*PUBLISH, "--sign-key", "{d}/none.key"], 2, "none.key: key not found"),
    Case(
        "publish-sign-key-no-passphrase",
        [*PUBLISH, "--sign-key", "{d}/c.key"],
        2,
        "COSIGN_PASSWORD",
        KEYS,
    ),
    Case(
        "publish-sign-key-is-public",
        [*PUBLISH, "--sign-key", "{d}/c.pub"],
        2,
        "not an encrypted",
        KEYS,
    ),
    Case("build-sign-key-without-push", ["build", "--hw", "a3", "--sign-key", "{d}/c.key", *M], 2, "give --push", KEYS),
    Case(
        "mirror-sign-key-env-unset",
        ["mirror", "127.0.0.1:5000/a:t", "127.0.0.1:5001/b", "--sign-key", "env://NO_SUCH_KEY_VAR"],
        2,
        "not set",
    ),
    Case("keygen-over-a-key", ["keygen", "-o", "{d}"], 2, "already exist", KEYS),
    Case("sign-not-a-registry-image", ["sign", "ascendkit/verl:1", "--key", "{d}/c.key"], 2, "give a registry image", KEYS),
    Case("sign-with-a-public-key", ["sign", "127.0.0.1:5000/x:1", "--key", "{d}/c.pub"], 2, "not an encrypted", KEYS),
    Case("verify-with-a-private-key", ["verify", "127.0.0.1:5000/x:1", "--key", "{d}/c.key", *M], 2, "takes the public key", KEYS),
    Case("verify-not-a-registry-image", ["verify", "Bad Ref!", "--key", "{d}/c.pub", *M], 2, "give a registry image", KEYS),
    Case("verify-key-not-pem", ["verify", "127.0.0.1:5000/x:1", "--key", "{d}/junk", *M], 2, "not a PEM block", files(junk="x")),
    Case("k8s-policy-without-key", ["k8s", "render", "--image", DIGEST, "--policy", "kyverno", *M], 2, "go together"),
    Case(
        "k8s-policy-unknown",
        ["k8s", "render", "--image", DIGEST, "--policy", "opa", "--key", "{d}/c.pub", *M],
        2,
        "kyverno or sigstore",
        KEYS,
    ),
    Case("k8s-render-without-hw", ["k8s", "render", "--image", DIGEST, *M], 2, "give --hw"),
    # --- sbom -------------------------------------------------------------------------------------
    Case("sbom-bad-ref", ["sbom", "Bad Image!!"], 2, "not an image reference"),
    Case("sbom-short-digest", ["sbom", "127.0.0.1:5000/x@sha256:short"], 2, "not an image reference"),
    Case("sbom-digest-no-host", ["sbom", "verl@sha256:" + "a" * 64], 2, "read from its registry"),
    Case("sbom-diff-one", ["sbom", "diff", "a:1"], 2, "two images"),
    Case("sbom-two-without-diff", ["sbom", "a:1", "b:1"], 2, "two images"),
    Case("sbom-bad-arch", ["sbom", "a:1", "--arch", "ppc64le"], 2, "--arch"),
    # --- smoke ------------------------------------------------------------------------------------
    Case("smoke-unknown-hw", ["smoke", "--hw", "a9", *M], 2, "a9"),
    Case("smoke-family-not-sku", ["smoke", "--hw", "a2", *M], 2, "SKU"),
    Case("smoke-stack-not-on-sku", ["smoke", "--hw", "a3", "--stack", "openrlhf-cann8.1", *M], 2, "does not support SKU 'a3'"),
    Case("smoke-unknown-stack", ["smoke", "--hw", "a3", "--stack", "nope", *M], 2, "unknown stack 'nope'"),
    Case("smoke-image-and-stack", [*SMOKE, "--stack", "cann8.3"], 2, "--image and --stack exclude each other"),
    Case("smoke-steps-zero", [*SMOKE, "--steps", "0"], 2, "--steps"),
    Case("smoke-steps-huge", [*SMOKE, "--steps", HUGE], 2, "--steps"),
    Case("smoke-steps-float", [*SMOKE, "--steps", "1e20"], 2, "--steps"),
    Case("smoke-timeout-nan", [*SMOKE, "--timeout", "nan"], 2, "--timeout"),
    Case("smoke-timeout-inf", [*SMOKE, "--timeout", "inf"], 2, "--timeout"),
    Case("smoke-timeout-huge", [*SMOKE, "--timeout", "1e20"], 2, "--timeout"),
    Case("smoke-stall-negative", [*SMOKE, "--stall-timeout", "-5"], 2, "--stall-timeout"),
    Case("smoke-devices-garbage", [*SMOKE, "--devices", "all"], 2, "--devices"),
    Case("smoke-devices-huge-range", [*SMOKE, "--devices", f"0-{HUGE}"], 2, "--devices"),
    Case("smoke-devices-beyond-the-sku", [*SMOKE, "--devices", "0-99"], 2, "a3 has 16 NPUs per node"),
    Case("smoke-devices-empty", [*SMOKE, "--devices", ""], 2, "--devices is empty"),
    Case(
        "smoke-image-short-digest", ["smoke", "--hw", "a3", "--image", "x@sha256:short", "--out", "{d}/o", *M], 2, "not an image reference"
    ),
    Case(
        "smoke-check-image-short-digest", ["smoke", "--hw", "a3", "--image", "x@sha256:short", "--check", *M], 2, "not an image reference"
    ),
    Case("smoke-image-empty", ["smoke", "--hw", "a3", "--image", "", "--out", "{d}/o", *M], 2, "not an image reference"),
    Case("smoke-data-without-parquet", [*SMOKE, "--data", "{d}/data"], 2, "no train.parquet", files(**{"data__README": "gsm8k"})),
    Case(
        "smoke-data-not-parquet",
        [*SMOKE, "--data", "{d}/data"],
        2,
        "not a parquet file",
        files(**{"data__train.parquet": "a,b\n", "data__test.parquet": "PAR1"}),
    ),
    Case("smoke-override-not-key-value", [*SMOKE, "--override", "novalue"], 2, "novalue"),
    Case("smoke-env-no-key", [*SMOKE, "--env", "=x"], 2, "--env"),
    Case("smoke-check-and-no-check", [*SMOKE, "--check", "--no-config-check"], 2, "exclude each other"),
    Case("smoke-model-path-missing", [*SMOKE, "--model-path", "{d}/model"], 2, "--model-path"),
    Case("smoke-data-missing", [*SMOKE, "--data", "{d}/data"], 2, "--data"),
    Case("smoke-out-is-a-file", ["smoke", "--hw", "a3", "--image", "x:y", "--out", "{d}/o", *M], 3, "not a directory", files(o="x")),
    Case("smoke-baseline-missing", [*SMOKE, "--baseline", "{d}/b.json"], 2, "b.json"),
    Case("smoke-baseline-bad-shape", [*SMOKE, "--baseline", "{d}/b.json"], 2, "finite number", files(**{"b.json": BASELINE_BAD_SHAPE})),
    # --- k8s --------------------------------------------------------------------------------------
    Case("k8s-nodes-zero", [*K8S, "--nodes", "0", *TRAIN], 2, "--nodes"),
    # the preflight: refused before its tag is pinned at the registry (the tripwire)
    Case("k8s-preflight-nodes", [*PREFLIGHT, "--nodes", "2"], 2, "drop --nodes"),
    Case("k8s-preflight-override", [*PREFLIGHT, "--override", "a=b"], 2, "drop --override"),
    Case("k8s-preflight-log-missing", ["k8s", "preflight", "{d}/none.log"], 2, "none.log"),
    Case("k8s-preflight-no-report", ["k8s", "preflight", "{d}/p.log"], 2, "no `ascendkit doctor --json` report", files(**{"p.log": "x\n"})),
    Case("k8s-preflight-empty-dir", ["k8s", "preflight", "{d}/logs"], 2, "an empty directory", files(**{"logs__.keep": ""})),
    Case("k8s-preflight-expect-zero", ["k8s", "preflight", "-", "--expect", "0"], 2, "--expect"),
    Case(
        "k8s-preflight-node-info-not-json",
        ["k8s", "preflight", "{d}/p.log", "--node-info", "{d}/n.json"],
        2,
        "not JSON",
        files(**{"p.log": "x\n", "n.json": "nodes"}),
    ),
    Case(
        "k8s-preflight-node-info-missing",
        ["k8s", "preflight", "{d}/p.log", "--node-info", "{d}/none.json"],
        2,
        "none.json",
        files(**{"p.log": "x\n"}),
    ),
    Case("k8s-prepull-nodes", [*PREPULL, "--nodes", "2"], 2, "drop --nodes"),
    Case("k8s-prepull-npu-resource", [*PREPULL, "--npu-resource", "huawei.com/Ascend910"], 2, "takes no NPU"),
    Case("k8s-nodes-huge", [*K8S, "--nodes", HUGE, "-o", "{d}/k.yaml", *TRAIN], 2, "--nodes"),
    Case("k8s-steps-huge", [*K8S, "--steps", "99999999999", *TRAIN], 2, "--steps"),
    Case("k8s-deadline-zero", [*K8S, "--deadline", "0", *TRAIN], 2, "--deadline"),
    Case("k8s-deadline-huge", [*K8S, "--deadline", HUGE, *TRAIN], 2, "--deadline"),
    Case(
        "k8s-image-by-tag", ["k8s", "render", "--hw", "a3", "--image", "ascendkit/verl:latest", "--job", "train", *M, *TRAIN], 2, "digest"
    ),
    Case(
        "k8s-registry-tag-bad-nodes",  # a tag to pin at its registry: the other options are refused before it is asked
        ["k8s", "render", "--hw", "a3", "--image", "registry.example.com/ml/verl:v1", "--nodes", "0", *M],
        2,
        "--nodes",
    ),
    Case("k8s-to-dev-null", [*K8S, "-o", "/dev/null", *TRAIN], 3, "not a regular file"),
    Case("k8s-to-fifo", [*K8S, "-o", "{d}/k.yaml", *TRAIN], 3, "a FIFO", fifo("k.yaml")),
    Case("k8s-to-symlink", [*K8S, "-o", "{d}/link", *TRAIN], 3, "symlink", both(files(keep="mine\n"), symlink("link", "keep"))),
    Case("k8s-to-name-too-long", [*K8S, "-o", "{d}/" + "k" * 300, *TRAIN], 3, "File name too long"),
    Case("k8s-empty-name", [*K8S, "--name", "", *TRAIN], 2, "--name"),
    Case("validate-missing", ["k8s", "validate", "{d}/none.yaml"], 2, "none.yaml"),
    Case("validate-fifo", ["k8s", "validate", "{d}/k.yaml"], 2, "a FIFO", fifo("k.yaml")),
    Case("validate-alias-bomb", ["k8s", "validate", "{d}/k.yaml"], 2, "alias bomb", files(**{"k.yaml": ALIAS_BOMB})),
    Case("validate-scalar-doc", ["k8s", "validate", "{d}/k.yaml"], 2, "not a mapping", files(**{"k.yaml": "just text\n"})),
    Case("validate-json-list-items", ["k8s", "validate", "{d}/k.json"], 2, "items", files(**{"k.json": '{"kind": "List", "items": [1]}'})),
    Case(
        "validate-wrong-shapes",
        ["k8s", "validate", "{d}/k.yaml"],
        1,
        "is not of type",
        files(**{"k.yaml": WRONG_SHAPES}),
    ),
    # --- metrics, compare, baselines ----------------------------------------------------------------
    Case("parse-missing", ["metrics", "parse", "{d}/none.log"], 2, "none.log"),
    Case(
        "compare-tolerance-negative",
        ["compare", "{d}/a.log", "{d}/a.log", "--metric", "x", "--tolerance", "-5"],
        2,
        "--tolerance",
        files(**{"a.log": LOG}),
    ),
    Case(
        "compare-tolerance-nan",
        ["compare", "{d}/a.log", "{d}/a.log", "--metric", "x", "--tolerance", "nan"],
        2,
        "--tolerance",
        files(**{"a.log": LOG}),
    ),
    Case("compare-metric-alone", ["compare", "{d}/a.log", "{d}/a.log", "--metric", "x"], 2, "--tolerance", files(**{"a.log": LOG})),
    Case(
        "compare-throughput-huge",
        ["compare", "{d}/a.log", "{d}/a.log", "--throughput-steps", HUGE],
        2,
        "--throughput-steps",
        files(**{"a.log": LOG}),
    ),
    Case("compare-baseline-not-json", ["compare", "{d}/a.log", "{d}/b.json"], 2, "not valid", files(**{"a.log": LOG, "b.json": "{nope"})),
    Case(
        "compare-baseline-wrong-format",
        ["compare", "{d}/a.log", "{d}/b.json"],
        2,
        "not an ascendkit baseline",
        files(**{"a.log": LOG, "b.json": "{}"}),
    ),
    Case(
        "compare-baseline-bad-steps",
        ["compare", "{d}/a.log", "{d}/b.json"],
        2,
        "steps",
        files(**{"a.log": LOG, "b.json": '{"format": "ascendkit-baseline/1", "steps": 5}'}),
    ),
    Case(
        "compare-plot-to-device",
        ["compare", "{d}/a.log", "{d}/a.log", "--plot", "/dev/null"],
        3,
        "not a regular file",
        files(**{"a.log": LOG}),
    ),
    Case("baseline-name-traversal", ["baseline", "import", "{d}/a.log", "--name", "../x"], 2, "--name", files(**{"a.log": LOG})),
    Case(
        "baseline-log-without-steps",
        ["baseline", "import", "{d}/a.log", "--name", "x", "-o", "{d}/x.json"],
        2,
        "no steps: neither verl's step lines",
        files(**{"a.log": "hello\n"}),
    ),
    Case(
        "baseline-to-dev-null",
        ["baseline", "import", "{d}/a.log", "--name", "x", "-o", "/dev/null"],
        3,
        "not a regular file",
        files(**{"a.log": LOG}),
    ),
]


class Tripwire:
    """A Unix socket (for DOCKER_HOST) and a TCP port (for the proxies) that note every connection."""

    def __init__(self, directory: Path) -> None:
        self.contacts: list[str] = []
        self.unix = socket.socket(socket.AF_UNIX)
        self.socket_path = directory / "engine.sock"
        self.unix.bind(str(self.socket_path))
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.tcp.getsockname()[1])
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(s, name), daemon=True) for s, name in ((self.unix, "engine"), (self.tcp, "proxy"))
        ]

    def _watch(self, server: socket.socket, name: str) -> None:
        server.listen()
        server.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            self.contacts.append(name)
            conn.close()

    @property
    def env(self) -> dict[str, str]:
        proxy = f"http://127.0.0.1:{self.port}"
        return {
            "DOCKER_HOST": f"unix://{self.socket_path}",
            **{name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")},
            "NO_PROXY": "",
            "no_proxy": "",
        }


@contextmanager
def tripwire(directory: Path) -> Iterator[Tripwire]:
    wire = Tripwire(directory)
    for thread in wire._threads:
        thread.start()
    try:
        yield wire
    finally:
        wire._stop.set()
        for thread in wire._threads:
            thread.join()
        wire.unix.close()
        wire.tcp.close()


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under root: its kind and content (a hash for files, the target for symlinks)."""
    seen: dict[str, tuple[str, str]] = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        relative = path.relative_to(root).as_posix()
        if stat.S_ISLNK(mode):
            seen[relative] = ("link", str(path.readlink()))
        elif stat.S_ISREG(mode):
            seen[relative] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            seen[relative] = ("dir" if stat.S_ISDIR(mode) else "special", "")
    return seen


def test_there_are_enough_cases_and_each_command_is_tried() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {" ".join(a for a in c.argv[:2] if not a.startswith("-") and "{" not in a) for c in CASES}
    for command in (
        "matrix validate",
        "matrix verify",
        "matrix outdated",
        "matrix schema",
        "plan",
        "render",
        "lock",
        "wheelhouse",
        "build",
        "publish",
        "mirror",
        "smoke",
        "k8s render",
        "k8s validate",
        "sbom",
        "metrics parse",
        "compare",
        "baseline import",
        "keygen",
        "sign",
        "verify",
    ):
        assert any(c.startswith(command) for c in commands), command


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case: Case, tmp_path: Path, forked: ForkServer) -> None:
    work = tmp_path / "work"
    work.mkdir()
    case.setup(work)
    before = snapshot(work)
    devnull = Path("/dev/null").stat()
    argv = [a.replace("{d}", str(work)) for a in case.argv]
    with tripwire(tmp_path) as wire:
        env = {**os.environ, **wire.env, "HOME": str(tmp_path), "NO_COLOR": "1"}
        env.pop("ASCENDKIT_CONFIG", None)
        proc = forked.run(argv, cwd=work, env=env, out_dir=tmp_path / "streams", memory=RUN_MEMORY, timeout=RUN_TIMEOUT_S)
    assert not proc.timed_out, f"still running after {RUN_TIMEOUT_S:.0f} s:\n{proc.stderr}"
    assert not wire.contacts, f"contacted {sorted(set(wire.contacts))} before refusing:\n{proc.stderr}"
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == case.code, f"exit {proc.returncode}, expected {case.code}:\n{output}"
    assert case.message.lower() in proc.stderr.lower(), proc.stderr
    assert proc.cpu_s < TIME_LIMIT_S, f"took {proc.cpu_s:.1f} CPU seconds"
    assert snapshot(work) == before, "a file or folder was created, replaced or changed"
    after = Path("/dev/null").stat()
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == devnull.st_rdev, "/dev/null is still the device"


def test_dash_means_stdout(tmp_path: Path) -> None:
    proc = subprocess.run([*ASCENDKIT, "render", "--hw", "a3", "-o", "-", *M], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (ROOT / "Dockerfile.a3").read_text()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "contact"),
    [
        (["publish", "ascendkit/verl:x", "--registry", "127.0.0.1:5000/x", "--manifest-dir", "{d}"], "engine"),
        (["k8s", "render", "--hw", "a3", "--image", DIGEST, "--job", "smoke", "--stack", "cann8.3", *M], "proxy"),  # the image's labels
        (["matrix", "verify", "--stack", "cann8.3", "--arch", "x86_64", "--no-resolve", *M], "proxy"),  # asks PyPI
    ],
    ids=["engine", "registry", "index"],
)
@pytest.mark.parametrize("started", ["forked", "from-nothing"])
def test_the_tripwires_catch_a_command_that_does_reach_out(
    argv: list[str], contact: str, started: str, tmp_path: Path, forked: ForkServer
) -> None:
    """The proof above is only as good as its tripwires: these commands are meant to reach out, forked
    as the cases are and started from nothing."""
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    with tripwire(tmp_path) as wire:
        env = {**os.environ, **wire.env, "HOME": str(tmp_path), "NO_COLOR": "1"}
        if started == "forked":
            forked.run(argv, cwd=tmp_path, env=env, out_dir=tmp_path / "streams", memory=RUN_MEMORY, timeout=120)
        else:
            subprocess.run([*ASCENDKIT, *argv], cwd=tmp_path, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert contact in wire.contacts
