"""The host contract (buildkit/doctor/host_contract.json) held to upstream: Ascend Docker Runtime's
mount list and device rules, the device plugin's resource names and environment, vllm-ascend's
`docker run` blocks for A2/A3 and the 950, verl's multi-node environment; read from the files
themselves (tests/fixtures/upstream/ascend-host/, see tests/harness/upstream_host.py). Every difference must
be one the contract's ``deviations`` table lists with its reason, and every listed one must still be
a difference: a new upstream fact fails here until someone decides."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from buildkit.doctor.contract import HCCL_ROOTINFO, TOPO_DIR, ChipContract, chips, contract_for, raw
from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from tests.conftest import ROOT
from tests.harness.upstream_host import BASE_LIST, load_facts

FACTS = load_facts()
MATRICES = [load_matrix(ROOT / DEFAULT_MATRIX).matrix, load_matrix(ROOT / "tests/fixtures/test_matrix.yaml").matrix]


def test_the_vendored_base_list_is_the_one_the_facts_name() -> None:
    base = FACTS["runtime_base_list"]
    assert hashlib.sha256(BASE_LIST.read_bytes()).hexdigest() == base["sha256"]
    assert [line for line in BASE_LIST.read_text().splitlines() if line] == base["mounts"]
    for name, source in FACTS.items():
        if isinstance(source, dict):
            assert source["repository"].startswith("https://github.com/") and len(source["sha256"]) == 64, name
            assert len(source["blob"]) == 40 and len(source["commit"]) == 40, name


def runtime_devices(chip: str) -> set[str]:
    """What Ascend Docker Runtime passes on ``chip`` (the UB directories on every chip where they exist)."""
    rules = FACTS["runtime_devices"]
    manager = rules["manager_a5"] if chip == "a5" else rules["manager_default"]
    return {*rules["every_chip"], *manager, *([] if chip == "a5" else rules["not_a5"]), *rules["directories_where_present"]}


def runtime_paths() -> set[str]:
    return {*FACTS["runtime_base_list"]["mounts"], *FACTS["runtime_ub_mounts"]["where_present"]}


def docs_blocks(chip: str) -> list[dict[str, Any]]:
    return [FACTS["vllm_ascend_950"], FACTS["vllm_ascend_950_vl"]] if chip == "a5" else [FACTS["vllm_ascend_a2_a3"]]


def _covered(path: str, upstream: set[str]) -> bool:
    """``path`` is upstream's, or inside a directory upstream mounts whole."""
    return any(path == u or path.startswith(u.rstrip("/") + "/") for u in upstream)


def differences(chip: str, contract: ChipContract) -> set[str]:
    """Every item where our contract and upstream's sources differ on ``chip``."""
    ours_devices = {p.path for p in contract.devices}
    ours_paths = {p.path for p in contract.paths}
    docs = docs_blocks(chip)
    upstream_devices = runtime_devices(chip) | {d for b in docs for d in b["devices"] if not d[len("/dev/davinci") :].isdigit()}
    upstream_paths = runtime_paths() | {v for b in docs for v in b["volumes"]}
    found = upstream_devices ^ ours_devices
    found |= upstream_paths - ours_paths  # a directory upstream mounts whole and we in parts is a difference too
    found |= {p for p in ours_paths if not _covered(p, upstream_paths)}
    verl = FACTS["verl_multi_node"]["env"]
    ours_env = {e.name: e.value for e in contract.multi_node_env}
    found |= {name for name in verl if name not in ours_env}
    found |= {f"{n}={ours_env[n]}" for n, v in verl.items() if n in ours_env and v != "<per node>" and ours_env[n] != v}
    return found


def listed(chip: str) -> set[str]:
    return {str(d["item"]) for d in raw()["deviations"] if chip in d["chips"] or "*" in d["chips"]}


@pytest.mark.parametrize("chip", chips())
def test_every_difference_from_upstream_is_a_listed_deliberate_one(chip: str) -> None:
    found = differences(chip, contract_for(chip))
    unlisted = sorted(found - listed(chip))
    stale = sorted(listed(chip) - found)
    assert not unlisted, f"{chip}: differs from upstream, and the contract's deviations do not say why: {unlisted}"
    assert not stale, f"{chip}: listed as deviations, but no longer differ from upstream: {stale}"


@pytest.mark.parametrize("chip", chips())
def test_what_the_contract_says_the_runtime_gives_is_what_the_runtime_gives(chip: str) -> None:
    """Pods on nodes with Ascend Docker Runtime leave these to it: a wrong flag is a missing mount."""
    contract = contract_for(chip)
    given = runtime_devices(chip) | runtime_paths()
    wrong = sorted(p.path for p in (*contract.devices, *contract.paths) if p.runtime != (p.path in given))
    assert not wrong, f"{chip}: the 'runtime' flag is wrong for {wrong}"


def test_the_950_generation_has_no_devmm_svm_and_every_ub_directory() -> None:
    a5 = contract_for("a5")
    assert "/dev/devmm_svm" not in {p.path for p in a5.devices}
    assert {p.path for p in a5.devices if p.kind == "device-directory"} == set(FACTS["runtime_devices"]["directories_where_present"])
    assert {p.path: p.need for p in a5.paths}[TOPO_DIR] == "required" and HCCL_ROOTINFO in {p.path for p in a5.paths}


def test_resource_names_and_topology_files_are_the_device_plugins() -> None:
    plugin, topology = FACTS["device_plugin_names"], FACTS["device_plugin_topology"]
    assert [e.name for e in contract_for("a5").sku_env] == [topology["env"]]
    for matrix in MATRICES:
        for sku_id, sku in matrix.skus.items():
            assert sku.k8s_npu_resource == (plugin["resource_a5"] if sku.chip == "a5" else plugin["resource_910"]), sku_id
            env = contract_for(sku.chip).env_for(sku.hccl_topo_file)
            if sku.chip == "a5":
                assert env and env[topology["env"]] in topology["files"], f"{sku_id}: no topology file the device plugin knows"
            else:
                assert sku.hccl_topo_file is None and env == {}, sku_id


def test_every_deviation_says_why_and_names_known_chips() -> None:
    for deviation in raw()["deviations"]:
        assert set(deviation["chips"]) <= {*chips(), "*"} and len(deviation["why"]) > 20, deviation
