"""The scripts every image carries (buildkit/image/files/), run for real with bash on this host.

build-env.sh is sourced the way each pip layer sources it, with the ARG values the rendered
Dockerfile declares and ``uname`` answering for the image's arch; the secrets it fetches come from
ascendkit's real SecretServer. The in-image runs (entrypoint, ascendkit_install) are covered by the
Docker build tests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildkit.image.render import BUILD_ENV, CONTEXT_FILES, DOCTOR_PATH, SECRETS_ARG, context_file, render_dockerfile
from buildkit.image.secrets import BuildSecrets, SecretServer
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import CONSTRAINTS_FILE, ENTRYPOINT, IMAGE_LOCKS_DIR, plan_image, plan_target
from tests.conftest import ROOT
from tests.harness.gitserver import serving
from tests.harness.sglang_standin import wheel_bytes

BUILD_ENV_SH = context_file("build_env")
CA = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def dockerfile_args(loaded: LoadedMatrix, stack: str) -> dict[str, str]:
    """The ARG defaults a rendered Dockerfile declares (what a RUN step sees without --build-arg)."""
    text = render_dockerfile(loaded, plan_image(loaded, plan_target(loaded, "a3", stack, None)))
    args = {}
    for name, value in re.findall(r"^ARG ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", text, re.M):
        args[name] = value[1:-1] if value.startswith('"') else value
    return args


def source_build_env(
    tmp_path: Path, arch: str, env: dict[str, str], probe: str = 'printf "%s" "${PIP_EXTRA_INDEX_URL:-}"'
) -> subprocess.CompletedProcess[str]:
    """Source build-env.sh in a bash like a RUN step's (set -eux), with uname reporting ``arch``."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "uname").write_text(f"#!/bin/sh\necho {arch}\n")
    (fake / "uname").chmod(0o755)
    script = f"set -eux; . {shlex.quote(str(BUILD_ENV_SH))}; {probe}"
    clean = {"PATH": f"{fake}:{os.environ['PATH']}", "HOME": str(tmp_path), **env}
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], env=clean, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("stack", "arch", "expected"),
    [
        ("cann8.3", "x86_64", ["PYTORCH_INDEX_URL"]),  # x86 torch comes from the CPU index, not PyPI's CUDA build
        ("cann8.3", "aarch64", []),
        ("cann9.1", "aarch64", ["ASCEND_INDEX_URL"]),
        ("cann9.1", "x86_64", ["ASCEND_INDEX_URL", "PYTORCH_INDEX_URL"]),
    ],
)
def test_each_arch_gets_its_extra_indexes(loaded: LoadedMatrix, tmp_path: Path, stack: str, arch: str, expected: list[str]) -> None:
    args = dockerfile_args(loaded, stack)
    proc = source_build_env(tmp_path, arch, {**args, "PIP_EXTRA_INDEX_URL": "https://mirror.example/extra"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == " ".join([*(args[name] for name in expected), "https://mirror.example/extra"])


def test_an_arch_the_image_does_not_support_stops_the_layer(loaded: LoadedMatrix, tmp_path: Path) -> None:
    proc = source_build_env(tmp_path, "riscv64", dockerfile_args(loaded, "cann8.3"))
    assert proc.returncode == 1
    assert "ascendkit: this image supports aarch64, x86_64, not riscv64" in proc.stderr


def test_served_secrets_reach_pip_and_are_gone_when_the_step_ends(loaded: LoadedMatrix, tmp_path: Path) -> None:
    args = dockerfile_args(loaded, "cann8.3")
    with_token = "https://user:s3cret@torch.example/whl/cpu"
    secrets = BuildSecrets(CA, (("PYTORCH_INDEX_URL", with_token),))
    probe = (
        '{ set +x; } 2>/dev/null; printf "%s\\n%s\\n%s\\n" "${PIP_EXTRA_INDEX_URL}" "${PIP_CERT}" "${ftp_proxy:-unset}"; '
        'cat "${PIP_CERT}" > "$HOME/seen.pem"'
    )
    with SecretServer(secrets) as server:
        proc = source_build_env(tmp_path, "x86_64", {**args, SECRETS_ARG: server.url}, probe)
    assert proc.returncode == 0, proc.stderr
    extra, cert, proxy = proc.stdout.splitlines()
    assert extra == with_token, "the served credentials, not the public ARG value, reach pip"
    assert cert.startswith("/dev/shm/ascendkit.") or cert.startswith("/tmp/")
    assert proxy == "unset"
    assert (tmp_path / "seen.pem").read_bytes() == CA
    assert not Path(cert).exists(), "the EXIT trap removed the secrets"
    assert "s3cret" not in proc.stderr, "xtrace is off while the secrets are handled"


def test_the_scripts_agree_with_the_paths_the_python_side_uses() -> None:
    build_env = BUILD_ENV_SH.read_text()
    assert f"{IMAGE_LOCKS_DIR}/${{layer}}-${{arch}}.txt" in build_env and f'{IMAGE_LOCKS_DIR}/*-"${{arch}}".txt' in build_env
    assert f"\nascendkit_constraints={CONSTRAINTS_FILE}\n" in build_env and build_env.count(CONSTRAINTS_FILE) == 1
    assert f"${{{SECRETS_ARG}:-}}" in build_env
    assert f"exec python3 {DOCTOR_PATH} " in context_file("in_image_cli").read_text()
    assert BUILD_ENV.endswith("/build-env.sh") and ENTRYPOINT == "/usr/local/bin/ascendkit-entrypoint"
    for name, relative in CONTEXT_FILES.items():  # the Dockerfile COPYs it from the repository root
        assert (ROOT / relative).is_dir() if relative.endswith("/") else (ROOT / relative).is_file(), name
    for name in ("entrypoint", "in_image_cli"):
        assert os.access(context_file(name), os.X_OK), f"{name} is executable in git, so COPY keeps the mode"


def test_the_in_image_cli_carries_only_doctor(tmp_path: Path) -> None:
    proc = subprocess.run(["sh", str(context_file("in_image_cli")), "build"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "this image carries only `ascendkit doctor`" in proc.stderr


def test_the_entrypoint_runs_the_command_where_no_cann_is_installed() -> None:
    proc = subprocess.run([str(context_file("entrypoint")), "sh", "-c", "echo ran $0", "x"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout == "ran x\n"


def test_uv_gets_the_indexes_and_wheelhouse_pip_gets(loaded: LoadedMatrix, tmp_path: Path) -> None:
    """uv reads UV_* variables, not pip's: the served index credentials and an offline build's
    wheelhouse reach them, and xtrace shows neither."""
    args = dockerfile_args(loaded, "cann8.3")
    with_token = "https://user:s3cret@mirror.example/simple"
    secrets = BuildSecrets(CA, (("PIP_INDEX_URL", with_token), ("PYTORCH_INDEX_URL", with_token)))
    probe = '{ set +x; } 2>/dev/null; printf "%s\\n%s\\n%s\\n" "${UV_INDEX_URL}" "${UV_EXTRA_INDEX_URL}" "${UV_FIND_LINKS:-unset}"'
    with SecretServer(secrets) as server:
        proc = source_build_env(tmp_path, "x86_64", {**args, SECRETS_ARG: server.url}, probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [with_token, with_token, "unset"]
    assert "s3cret" not in proc.stderr
    offline = source_build_env(
        tmp_path, "aarch64", {**args, "PIP_FIND_LINKS": "http://127.0.0.1:1/w/ /mnt/wheels"}, 'printf "%s" "${UV_FIND_LINKS}"'
    )
    assert offline.stdout == "http://127.0.0.1:1/w/,/mnt/wheels", "uv separates find-links with commas"
    defaults = source_build_env(
        tmp_path, "aarch64", args, '{ set +x; } 2>/dev/null; printf "%s|%s" "${UV_INDEX_URL}" "${UV_EXTRA_INDEX_URL-unset}"'
    )
    assert defaults.stdout == f"{args['PIP_INDEX_URL']}|unset"


def test_uv_waits_minutes_not_seconds_for_a_compiling_python_to_start(loaded: LoadedMatrix, tmp_path: Path) -> None:
    """uv's default, 60 s, failed an aarch64 build under qemu on a loaded machine: 10 min, or what the user sets."""
    args = dockerfile_args(loaded, "cann8.3")
    probe = 'printf "%s" "${UV_COMPILE_BYTECODE_TIMEOUT}"'
    assert source_build_env(tmp_path, "aarch64", args, probe).stdout == "600"
    assert source_build_env(tmp_path, "aarch64", {**args, "UV_COMPILE_BYTECODE_TIMEOUT": "0"}, probe).stdout == "0"


FAKE_UV = """#!/bin/bash
# STAND-IN for `python3 -m uv` (its output and status only): fails with uv's message for a compiling
# Python that stopped answering, as many times as $FAILS says, then installs.
echo "$*" >> "$CALLS"
if [ "$(wc -l < "$CALLS")" -le "$FAILS" ]; then
  echo "Installed 3 packages in 40ms" >&2
  echo "error: Failed to bytecode-compile installed packages" >&2
  echo "  Caused by: Bytecode timed out (600s)" >&2
  exit 2
fi
echo "$MESSAGE" >&2
exit "$STATUS"
"""


@pytest.mark.parametrize(
    ("fails", "message", "status", "expected_calls", "expected_status"),
    [
        (0, "Installed 3 packages", 0, 1, 0),
        (1, "Installed 3 packages", 0, 2, 0),  # the hang once: installed again, compiling everything
        (2, "Installed 3 packages", 0, 3, 0),
        (3, "unused", 0, 3, 2),  # three times: the step fails with uv's status
        (0, "error: Failed to download `torch==2.8.0`", 1, 1, 1),  # any other failure: not retried
    ],
    ids=["passes", "compile-hangs-once", "twice", "always", "other-failure"],
)
def test_uv_installs_a_section_again_only_when_its_bytecode_compile_failed(
    loaded: LoadedMatrix, tmp_path: Path, fails: int, message: str, status: int, expected_calls: int, expected_status: int
) -> None:
    """Under qemu uv's compiling Pythons now and then stop answering (astral-sh/uv#11699): the section
    installs again with --reinstall (a second plain run would compile nothing), at most three times in
    all; other failures stop the step at once, and nothing of the retries stays behind."""
    args = dockerfile_args(loaded, "cann8.3")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(FAKE_UV)
    (fake / "python3").chmod(0o755)
    section = tmp_path / "framework-aarch64.txt"
    section.write_text("# status: resolved\nverl==0.6.1 --hash=sha256:" + "0" * 64 + "\n")
    constraints = tmp_path / "constraints.txt"
    calls = tmp_path / "calls"
    scratch = tmp_path / "shm"
    scratch.mkdir()
    probe = (
        f"ascendkit_constraints={shlex.quote(str(constraints))} ascendkit_scratch={shlex.quote(str(scratch))}; "
        "status=0; ascendkit_install framework || status=$?; "
        'echo "exit=$status options=$- $(set -o | grep pipefail | tr -s " \t" " ")" >&2'
    )
    env = {
        **args, "PATH": f"{fake}:{os.environ['PATH']}", "ASCENDKIT_SECTION": str(section), "CALLS": str(calls),
        "FAILS": str(fails), "MESSAGE": message, "STATUS": str(status),
    }  # fmt: skip
    script = f"set -eux; . {shlex.quote(str(BUILD_ENV_SH))}; {probe}"
    proc = subprocess.run(["bash", "-c", script], env={"HOME": str(tmp_path), **env}, capture_output=True, text=True, timeout=60)
    made = calls.read_text().splitlines()
    assert len(made) == expected_calls, proc.stderr
    # the step's status, and the caller's shell options as they were (errexit on, pipefail off)
    found = re.search(r"^exit=(\d+) options=(\S+) pipefail off$", proc.stderr, re.M)
    assert found and int(found[1]) == expected_status and "e" in found[2], proc.stderr[-2000:]
    assert "--reinstall" not in made[0] and all(c.count("--reinstall") == 1 for c in made[1:]), made
    assert all("--compile-bytecode" in c and "--require-hashes" in c for c in made)
    assert proc.stderr.count("installing it again, compiling all of it") == expected_calls - 1
    if expected_status == 0:
        assert constraints.read_text() == "verl==0.6.1\n"
    else:
        assert not constraints.exists(), "a failed section is not a constraint of later steps"
    assert not list(scratch.iterdir()), "uv's output is not left behind"


# ---- patch.py: a line commented out of an installed distribution, in the open --------------------------


def _installed(site: Path, source: str) -> Path:
    """A distribution ``demo`` 1.0 installed in ``site`` (what pip leaves: the package and its metadata)."""
    (site / "demo-1.0.dist-info").mkdir(parents=True)
    (site / "demo-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    (site / "demo").mkdir()
    module = site / "demo" / "platform.py"
    module.write_text(source)
    return module


def _patch_tool() -> Any:
    spec = importlib.util.spec_from_file_location("ascendkit_patch", context_file("patch_tool"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_patch_comments_out_the_line_once_and_records_a_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = 'os.environ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"'
    module = _installed(tmp_path / "site", f"import os\n\nif True:\n    {line}\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    record = tmp_path / "patches.json"
    entry = _patch_tool().patch("demo", "demo/platform.py", line, "a device error (the fork's docs)", record)
    text = module.read_text()
    assert text == f"import os\n\nif True:\n    pass  # ascendkit patch (see /etc/ascendkit/patches.json): {line}\nX = 1\n", (
        "indent kept, and the block it was the only statement of stays valid"
    )
    assert entry["line"] == 4 and entry["version"] == "1.0" and entry["package"] == "demo"
    assert entry["sha256_after"] == hashlib.sha256(text.encode()).hexdigest() != entry["sha256_before"]
    assert entry["diff"].startswith("--- a/demo/platform.py\n+++ b/demo/platform.py\n") and f"-    {line}\n" in entry["diff"]
    assert json.loads(record.read_text()) == [entry]
    assert (module.parent / "__pycache__").is_dir(), "the bytecode is made again for the new text"
    with pytest.raises(SystemExit, match="stands there 0 times, not once; the patch was written for another version"):
        _patch_tool().patch("demo", "demo/platform.py", line, "again", record)
    assert json.loads(record.read_text()) == [entry], "a refused patch records nothing"


def test_patch_refuses_a_line_twice_a_missing_file_or_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(tmp_path / "site", "x = 1\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    tool, record = _patch_tool(), tmp_path / "patches.json"
    with pytest.raises(SystemExit, match=r"demo 1\.0 demo/platform\.py: the line 'x = 1' stands there 2 times"):
        tool.patch("demo", "demo/platform.py", "x = 1", "r", record)
    with pytest.raises(SystemExit, match=r"demo 1\.0 demo/nope\.py: no such file in the installed distribution"):
        tool.patch("demo", "demo/nope.py", "x = 1", "r", record)
    with pytest.raises(SystemExit, match="nope is not installed"):
        tool.patch("nope", "demo/platform.py", "x = 1", "r", record)
    assert not record.exists()
    proc = subprocess.run([sys.executable, str(context_file("patch_tool"))], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage: patch.py DIST FILE LINE REASON" in proc.stderr


@pytest.mark.parametrize("verified", [True, False])
def test_an_archives_wheels_install_in_order_only_when_its_sha256_matches(tmp_path: Path, verified: bool) -> None:
    """ascendkit_install_archive, run for real: this arch's archive fetched over HTTP, checked, its wheels installed."""
    import functools
    import http.server
    import zipfile

    served = tmp_path / "srv" / "releases" / "download" / "r1"
    served.mkdir(parents=True)
    name = "kernels-r1-x86_64.zip"
    with zipfile.ZipFile(served / name, "w") as archive:
        for dist in ("ak_first", "ak_second"):
            archive.writestr(f"dist/{dist}-1.0-py3-none-any.whl", wheel_bytes(dist))
    digest = hashlib.sha256((served / name).read_bytes()).hexdigest() if verified else "0" * 64
    locks = tmp_path / "etc" / "locks"
    locks.mkdir(parents=True)
    target = tmp_path / "site"
    script = BUILD_ENV_SH.read_text().replace("/etc/ascendkit/locks", str(locks)).replace("/etc/ascendkit/constraints.txt", os.devnull)
    # the image's fixed work directory, made the test's own: the two cases (and another run's) at once must not share it
    script = script.replace('work="/tmp/ascendkit-archive-', f'work="{tmp_path}/archive-')
    assert f"{tmp_path}/archive-" in script
    (tmp_path / "build-env.sh").write_text(script)
    (locks / "kernels-x86_64.txt").write_text("# status: resolved\n")
    probe = (
        f"PIP_TARGET={shlex.quote(str(target))} ascendkit_install_archive kernels MIRROR_URL releases/download/r1 "
        f"aarch64=kernels-r1-aarch64.zip= x86_64={name}={digest} -- ak_second ak_first"
    )
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text("#!/bin/sh\necho x86_64\n")
    (fake / "uname").chmod(0o755)
    (fake / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "HOME": str(tmp_path), "ASCENDKIT_ARCHES": "x86_64", "PIP_NO_INDEX": "1"}
    with serving(functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "srv"))) as url:
        mirror = url.replace("http://", "http://ak-bot:s3cr3t-mirror@")  # credentials a served env would hold
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", f"set -eux; . {tmp_path / 'build-env.sh'}; {probe}"],
            env={**env, "MIRROR_URL": mirror},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert "s3cr3t-mirror" not in proc.stdout + proc.stderr, "the mirror's credentials are never printed, xtrace on or not"
    assert f"+ fetch {url}/releases/download/r1/{name}" in proc.stderr
    if verified:
        assert proc.returncode == 0, proc.stderr
        assert (target / "ak_first" / "__init__.py").is_file() and (target / "ak_second" / "__init__.py").is_file()
        assert "--no-deps" in proc.stderr, "a resolved lock: the archive's wheels bring nothing unlocked"
    else:
        assert proc.returncode != 0 and "FAILED" in proc.stderr, proc.stderr
        assert not target.exists(), "nothing of an archive whose sha256 differs is installed"


def test_a_checkout_from_a_mirror_with_credentials_never_prints_them(tmp_path: Path) -> None:
    """ascendkit_git_clone, run for real under xtrace: the served credentials reach git, not the log."""
    from tests.harness.gitserver import make_repository, serve

    files = tmp_path / "files"
    files.mkdir()
    (files / "README").write_text("stand-in\n")
    commit = make_repository(files, tmp_path / "srv" / "org" / "repo.git", "one commit")
    (tmp_path / "bin").mkdir()
    with serve(tmp_path / "srv") as url:
        mirror = url.replace("http://", "http://ak-bot:s3cr3t-git@")
        probe = f"ascendkit_git_clone MIRROR_URL org/repo.git {tmp_path / 'checkout'}; git -C {tmp_path / 'checkout'} rev-parse HEAD"
        proc = source_build_env(tmp_path, "x86_64", {"ASCENDKIT_ARCHES": "x86_64", "MIRROR_URL": mirror}, probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == commit
    assert "s3cr3t-git" not in proc.stdout + proc.stderr
    assert f"+ git clone {url}/org/repo.git" in proc.stderr
