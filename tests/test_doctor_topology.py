"""doctor's checks of what the host contract adds: the A5 topology file HCCL_TOPO_FILE_PATH names,
/etc/hccl_rootinfo.json's format, the device nodes of the UB directories, and which cluster mode a
pod's node runs."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from buildkit.doctor.base import NODE_ENV, Environment
from buildkit.doctor.contract import HCCL_ROOTINFO, TOPO_DIR, control_nodes
from buildkit.doctor.topology import check_node_runtime, check_rootinfo, check_topology, node_runtime
from tests.harness.hosttree import stand_in_host

TOPO = "/usr/local/Ascend/driver/topo/950/atlas_350_3.json"


def _rootinfo(root: Path, data: object) -> Environment:
    path = root / HCCL_ROOTINFO.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return Environment(root, {})


@pytest.mark.parametrize(
    ("data", "chip", "status"),
    [
        ({"version": "2.0", "server_list": []}, "a5", "ok"),
        ({"version": "1.0", "server_list": []}, "a5", "error"),
        ({"version": "1.0"}, "a3", "warn"),
        ({"server_list": []}, "a5", "warn"),
        ("{not json", "a5", "error"),
    ],
)
def test_a_rootinfo_file_of_format_1_0_is_ei0014_on_a5_with_the_fix(tmp_path: Path, data: object, chip: str, status: str) -> None:
    (check,) = check_rootinfo(_rootinfo(tmp_path, data), chip)
    assert check.status == status, check
    if status == "error":
        assert "EI0014" in check.detail and "regenerate it" in check.detail


def test_no_rootinfo_file_is_no_check(tmp_path: Path) -> None:
    assert check_rootinfo(Environment(tmp_path, {}), "a5") == []


def test_the_a5_topology_file_is_checked_where_hccl_needs_it(tmp_path: Path) -> None:
    host = stand_in_host(tmp_path / "host", "a5", 8, topo_file="atlas_350_3.json")
    (check,) = check_topology(Environment(host, {"HCCL_TOPO_FILE_PATH": TOPO}), "a5", 8)
    assert (check.status, check.detail) == ("ok", f"HCCL_TOPO_FILE_PATH={TOPO}")
    (missing,) = check_topology(Environment(host, {"HCCL_TOPO_FILE_PATH": TOPO.replace("350_3", "950_2")}), "a5", 8)
    assert missing.status == "error" and "topo_file path is invalid" in missing.detail
    (unset,) = check_topology(Environment(host, {}), "a5", 8)
    assert unset.status == "warn" and "device plugin sets it" in unset.detail
    bare = stand_in_host(tmp_path / "bare", "a5", 8, without=(TOPO_DIR,))
    assert check_topology(Environment(bare, {"HCCL_TOPO_FILE_PATH": TOPO}), "a5", 8)[0].status == "error"
    assert check_topology(Environment(bare, {"HCCL_TOPO_FILE_PATH": TOPO}), "a5", 1)[0].status == "warn", "one card: no HCCL"
    assert check_topology(Environment(bare, {}), "a3", 16) == [], "only the 950 generation reads it"


def test_doctor_opens_every_ub_node_and_no_devmm_svm_on_a5(tmp_path: Path) -> None:
    host = stand_in_host(tmp_path / "host", "a5", 2)
    nodes = {str(Path(n).relative_to(host)) for n in control_nodes(host)}
    assert nodes == {"dev/davinci_manager", "dev/hisi_hdc", "dev/uburma/ub0", "dev/uburma/ub1", "dev/ummu/ummu0"}


def test_a_pod_says_which_mode_its_node_runs(tmp_path: Path) -> None:
    assert check_node_runtime(Environment(tmp_path, {}), in_pod=False) == []
    (ascend,) = check_node_runtime(Environment(tmp_path, {NODE_ENV: "n1", "ASCEND_VISIBLE_DEVICES": "0,1"}), in_pod=True)
    assert ascend.detail.startswith("ascend: the device plugin set ASCEND_VISIBLE_DEVICES")
    (plain,) = check_node_runtime(Environment(tmp_path, {NODE_ENV: "n1"}), in_pod=True)
    assert plain.detail.startswith("plain:")


def test_the_preflight_summary_says_which_node_runtime_to_render() -> None:
    from buildkit.k8s.preflight import format_table, summarize

    def report(node: str, env: dict[str, str]) -> tuple[str, dict[str, object]]:
        with tempfile.TemporaryDirectory() as root:  # what doctor writes in a pod whose device plugin set ``env``
            where = Environment(Path(root), {NODE_ENV: node, **env})
            checks = [asdict(c) for c in check_node_runtime(where, in_pod=True)]
            return node, {"node": node, "devices": 8, "exit_code": 0, "checks": checks, "node_runtime": node_runtime(where, True)}

    ascend: dict[str, str] = {"ASCEND_VISIBLE_DEVICES": "0-7"}
    plain: dict[str, str] = {}
    same, problems = summarize([report("n1", ascend), report("n2", ascend)])
    assert "Ascend Docker Runtime: 2 node(s) ascend: render the jobs with --node-runtime ascend" in format_table(same, problems)
    mixed, problems = summarize([report("n1", ascend), report("n2", plain)])
    assert "1 node(s) ascend; 1 node(s) plain: the nodes differ" in format_table(mixed, problems)
    assert [v.describe()["node_runtime"] for v in mixed] == ["ascend", "plain"]
    _, old = report("n3", ascend)
    del old["node_runtime"]  # a report from an image whose doctor predates the field: no advice, no guess from prose
    (unknown,), _ = summarize([("n3", old)])
    assert unknown.describe()["node_runtime"] is None
