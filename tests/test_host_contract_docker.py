"""The host contract executed, per chip: a stand-in host tree built from upstream's lists (device
nodes made with mknod as root, the null device's numbers 1:3; driver files as small stand-ins) is the
host of containers on the real engine. The container lists what it sees (device nodes, mounts,
environment), and that is compared with what Ascend Docker Runtime and vllm-ascend's docs give the
chip (tests/fixtures/upstream/ascend-host/), less the contract's listed deviations. Then a real
smoke run on that host: refused (exit 2, named) when a required piece is missing, run with a note
when an optional one is."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from buildkit.doctor.contract import HCCL_ROOTINFO, TOPO_DIR, contract_for
from buildkit.errors import InputError
from buildkit.matrix.load import load_matrix
from buildkit.run.container import run_container
from buildkit.run.devices import host_config_args, plan_devices
from buildkit.run.job import JobFacts
from buildkit.run.smoke import SmokeRequest, run_smoke
from tests.conftest import TEST_MATRIX, DockerEnv, build_and_push
from tests.harness.hosttree import stand_in_host
from tests.test_host_contract import docs_blocks, listed, runtime_devices, runtime_paths

pytestmark = pytest.mark.docker

LOADED = load_matrix(TEST_MATRIX)
SKU_OF_CHIP = {"a2": "a2-box16", "a3": "a3", "a5": "350"}  # the test matrix's SKU of each chip
SEE = r"""
import json, os, stat
devices = []
for top, dirs, files in os.walk("/dev"):
    for name in files + dirs:
        path = os.path.join(top, name)
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3) and path != "/dev/null":  # the stand-in nodes
            devices.append(path)
mounted = {line.split()[4] for line in open("/proc/self/mountinfo")}
asked = [p for p in os.environ.get("SEE_PATHS", "").split(":") if p]
mounts = [p for p in asked if os.path.realpath(p) in mounted]  # the image's /lib is /usr/lib: a bind lands on the real path
print(json.dumps({"devices": sorted(devices), "mounts": sorted(mounts), "env": dict(os.environ)}))
"""


def _host(tmp_path: Path, chip: str, **kw: Any) -> Path:
    sku = LOADED.matrix.skus[SKU_OF_CHIP[chip]]
    return stand_in_host(tmp_path / f"host-{chip}", chip, 2, mknod=True, topo_file=sku.hccl_topo_file, **kw)


def _seen(docker_env: DockerEnv, image: str, host_config: dict[str, Any], env: dict[str, str], log: Path) -> dict[str, Any]:
    result = run_container(
        docker_env.client, image, ["python3", "-c", SEE], environment=env, log_path=log,
        deadline=time.monotonic() + 120, host_config=host_config, want_stdout=True, user="root",
    )  # fmt: skip
    assert result.exit_code == 0, log.read_text()
    seen: dict[str, Any] = json.loads(result.stdout)
    return seen


@pytest.mark.engine_20_10
@pytest.mark.parametrize("chip", ["a2", "a3", "a5"])
def test_a_container_on_each_chips_host_sees_what_upstream_gives_it(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path, chip: str
) -> None:
    if chip == "a5":  # a file HCCL reads on the 950 where the host has it
        (tmp_path / f"host-{chip}" / "etc").mkdir(parents=True)
        (tmp_path / f"host-{chip}" / HCCL_ROOTINFO.lstrip("/")).write_text('{"version": "2.0"}\n')
    host = _host(tmp_path, chip)
    sku_id = SKU_OF_CHIP[chip]
    plan = plan_devices(sku_id, LOADED.matrix.skus[sku_id], [0, 1], host_root=host)
    upstream = (runtime_paths() | {v for b in docs_blocks(chip) for v in b["volumes"]}) - listed(chip)
    ours = {p.path for p in contract_for(chip).paths if p.need != "multi_node"}
    env = {**dict(plan.env), "SEE_PATHS": ":".join(sorted(upstream | ours))}
    seen = _seen(docker_env, built["tags"][0], host_config_args(plan, {}, privileged=False), env, tmp_path / "see.log")
    # devices: every one the runtime and the docs give this chip (each node of a directory), less the listed deviations
    wanted = (runtime_devices(chip) | {d for b in docs_blocks(chip) for d in b["devices"] if not d[12:].isdigit()}) - listed(chip)
    expanded = {n for n in seen["devices"] if not n.startswith("/dev/davinci") or not n[12:].isdigit()}
    by_top = {"/".join(n.split("/")[:3]) for n in expanded}
    assert wanted == by_top, f"{chip}: the container sees {sorted(by_top)}, upstream gives {sorted(wanted)}"
    assert {"/dev/davinci0", "/dev/davinci1"} <= set(seen["devices"])
    assert ("/dev/devmm_svm" in seen["devices"]) is (chip != "a5"), "the 950 generation has no devmm_svm"
    # mounts: every upstream path the host has, less the listed deviations; every contract path the host has
    on_host = {p for p in upstream if (host / p.lstrip("/")).exists()}
    mounted = set(seen["mounts"])
    assert on_host <= mounted, f"{chip}: upstream's {sorted(on_host - mounted)} not mounted"
    assert ours <= mounted, f"{chip}: the contract's {sorted(ours - mounted)} not mounted"
    if chip == "a5":
        topo = seen["env"]["HCCL_TOPO_FILE_PATH"]
        assert topo.startswith(TOPO_DIR + "/950/") and (host / topo.lstrip("/")).is_file()
    else:
        assert "HCCL_TOPO_FILE_PATH" not in seen["env"]


@pytest.fixture(scope="module")
def built_a5(docker_env: DockerEnv, built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The test stack built for the 950 generation (its SKU 350): the layers are the a3 build's but the chip's."""
    return build_and_push(docker_env, tmp_path_factory.mktemp("build-a5"), built["repo"], "--hw", "350")


def _request(image: str, host: Path, out: Path, model: Path) -> SmokeRequest:
    sku = LOADED.matrix.skus["350"]
    return SmokeRequest(
        sku_id="350", sku=sku, chip_id="a5", image=image, out=out, model_path=model, visible=[0, 1], host_root=host,
        facts=JobFacts.of(LOADED.matrix.compat), config_check=False, timeout=300,
    )  # fmt: skip


@pytest.mark.engine_20_10
def test_smoke_on_a_950_host_runs_with_its_contract_and_refuses_what_lacks_a_required_piece(
    docker_env: DockerEnv, built_a5: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "model").mkdir()
    image = built_a5["tags"][0]
    # a host without the driver's topo directory: refused before any container, naming it
    bare = _host(tmp_path / "bare", "a5", without=(TOPO_DIR,))
    with pytest.raises(InputError, match=f"this host lacks what --hw 350 needs: {TOPO_DIR}"):
        run_smoke(docker_env.client, _request(image, bare, tmp_path / "out-bare", tmp_path / "model"))
    # a host without its optional pieces (no npu-smi, no rootinfo): runs, and says what it left out
    host = _host(tmp_path, "a5", without=("/usr/local/bin/npu-smi", "/etc/ascend_install.info"))
    report = run_smoke(docker_env.client, _request(image, host, tmp_path / "out", tmp_path / "model"))
    notes = report.data["host_notes"]
    assert "/usr/local/bin/npu-smi not on this host: not mounted (optional on a5)" in notes, notes
    assert not any("devmm_svm" in n for n in notes), "the 950 generation has none, and none is asked for"
    assert report.data["settings"]["host_env"] == {"HCCL_TOPO_FILE_PATH": f"{TOPO_DIR}/950/atlas_350_3.json"}
    checks = {c["name"]: c for c in report.data["doctor"]["checks"]}
    assert checks["hccl topology"]["status"] == "ok", checks["hccl topology"]
    assert checks["device access"]["detail"] == "7 device nodes open for reading and writing", "2 NPUs, manager, hdc, ub0, ub1, ummu0"
    assert report.outcome == "failed" and "doctor failed" in report.message, "no torch_npu NPUs behind stand-in nodes"
    report_md = (tmp_path / "out" / "report.md").read_text()
    assert "\n> /usr/local/bin/npu-smi not on this host: not mounted (optional on a5)" in report_md
