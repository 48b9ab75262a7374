"""Upstream's side of the host contract: what Ascend Docker Runtime, the Ascend device plugin,
vllm-ascend's and verl's docs give an Ascend container, per chip, read from their sources.

CI cannot reach GitHub, so what the tests compare with is committed under
``tests/fixtures/upstream/ascend-host/``: ``base.list`` verbatim (a data file: the runtime's mount
list), and ``facts.json``, the facts this module extracts from each upstream file (device rules,
mounts, environment, resource names), each with the file's repository, path, commit, git blob id
and sha256, so anyone can check them against the file. After an upstream release:

    python -m tests.harness.upstream_host extract --mind-cluster DIR --vllm-ascend DIR --verl DIR

(each DIR a git clone; the refs are the ones below) rewrites facts.json and base.list; the unit test
``tests/test_host_contract.py`` then names every difference from our contract that is not in the
contract's table of deliberate ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

STORE = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "ascend-host"
FACTS = STORE / "facts.json"
BASE_LIST = STORE / "base.list"

MIND_CLUSTER = ("https://github.com/Ascend/mind-cluster", "v26.1.0")
VLLM_ASCEND = ("https://github.com/vllm-project/vllm-ascend", "182b75ea84ff13ece27b57391331ef8935410aea")
VERL = ("https://github.com/verl-project/verl", "1dda039b9")

RUNTIME_PROCESS = "component/ascend-docker-runtime/runtime/process/process.go"
HOOK_PROCESS = "component/ascend-docker-runtime/hook/process/process.go"
BASE_LIST_PATH = "component/ascend-docker-runtime/build/scripts/base.list"
DEFAULT_NAME = "component/ascend-common/api/default_name.go"
PLUGIN_CONSTANTS_V2 = "component/ascend-device-plugin/pkg/common/constants_v2.go"
VLLM_INSTALL = "docs/source/installation.md"
VLLM_950 = "docs/source/tutorials/models/Qwen3.8-27B.md"
VLLM_950_VL = "docs/source/tutorials/models/Qwen-VL-Dense.md"
VERL_MULTINODE = "docs/ascend_tutorial/model_support/examples/multi-machine_task_startup_practice.rst"


def _show(repo: Path, ref: str, path: str) -> tuple[str, dict[str, str]]:
    """The file at ``ref`` and where it came from (commit, blob, sha256)."""
    data = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True).stdout
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{ref}^{{commit}}"], check=True, capture_output=True, text=True)
    blob = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{ref}:{path}"], check=True, capture_output=True, text=True)
    where = {"path": path, "commit": commit.stdout.strip(), "blob": blob.stdout.strip(), "sha256": hashlib.sha256(data).hexdigest()}
    return data.decode(), where


def go_strings(text: str) -> dict[str, str]:
    """Every ``name = "value"`` constant of a Go file, and aliases ``name = other`` resolved among them."""
    found = dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]*)"', text, re.M))
    return found


def _go_list(text: str, name: str, consts: dict[str, str]) -> list[str]:
    match = re.search(rf"{name}\s*=\s*\[\]string\{{([^}}]*)\}}", text)
    assert match, f"no []string {name} in the file: upstream changed, read it again"
    return [consts[item.strip()] for item in match[1].split(",") if item.strip()]


def runtime_devices(text: str) -> dict[str, Any]:
    """The runtime's device rules: every chip's manager devices, dvpp_cmdlist but on A5, the UB directories."""
    consts = go_strings(text)
    dev = consts["devicePath"]
    assert re.search(r'devType != "" && devType != Ascend910A5 \{\s*dPath := devicePath \+ dvppCmdList', text), "dvpp_cmdlist rule moved"
    assert re.search(r"dPath := devicePath \+ davinciManager", text), "davinci_manager rule moved"
    body = text[text.index("func addUBDevice(") : text.index("func addDevicesInDir(")]  # every node of each directory there is
    ub = [dev + consts[name] for name in re.findall(r"\w+Path := devicePath \+ (\w+)", body)]
    assert ub and "addDevicesInDir(spec, " in body, "addUBDevice changed"
    return {
        "every_chip": [dev + consts["davinciManager"]],
        "manager_default": [dev + d for d in _go_list(text, "defaultManagerDevices", consts)],
        "manager_a5": [dev + d for d in _go_list(text, "ascend910A5ManagerDevices", consts)],
        "not_a5": [dev + consts["dvppCmdList"]],
        "directories_where_present": ub,
    }


def hook_mounts(text: str) -> list[str]:
    """addUBMount's items: mounted on every chip where the host has them."""
    consts = go_strings(text)
    match = re.search(r"ubMountItems := \[\]string\{([^}]*)\}", text)
    assert match, "addUBMount moved"
    return [consts[item.strip()] for item in match[1].split(",") if item.strip()]


def docker_run(text: str, tab: str) -> dict[str, list[str]]:
    """The devices and volumes of the first ``docker run`` under the ``=== "tab"`` heading of a docs page."""
    start = text.index(f'=== "{tab}"')
    block = text[start : text.index("```", text.index("docker run", start))]
    devices = [d.split(":")[0] for d in re.findall(r"--device[= ](\S+)", block) if d.startswith("/dev/")]
    volumes = [v.split(":")[0].rstrip("/") or "/" for v in re.findall(r"\s-v (\S+)", block)]
    return {"devices": devices, "volumes": [v for v in volumes if not v.startswith("/root/.cache")]}


def verl_exports(text: str) -> dict[str, str]:
    found = re.findall(r'^\s*export (HCCL_\w+|GLOO_\w+|RAY_EXPERIMENTAL_\w+)=("[^"]*"|\S+)', text, re.M)
    return {name: "<per node>" if value.startswith('"') else value for name, value in found}


def extract(mind_cluster: Path, vllm_ascend: Path, verl: Path) -> dict[str, Any]:
    mc_ref, vllm_ref, verl_ref = MIND_CLUSTER[1], VLLM_ASCEND[1], VERL[1]
    base, base_where = _show(mind_cluster, mc_ref, BASE_LIST_PATH)
    runtime, runtime_where = _show(mind_cluster, mc_ref, RUNTIME_PROCESS)
    hook, hook_where = _show(mind_cluster, mc_ref, HOOK_PROCESS)
    names, names_where = _show(mind_cluster, mc_ref, DEFAULT_NAME)
    topo, topo_where = _show(mind_cluster, mc_ref, PLUGIN_CONSTANTS_V2)
    install, install_where = _show(vllm_ascend, vllm_ref, VLLM_INSTALL)
    a5_doc, a5_where = _show(vllm_ascend, vllm_ref, VLLM_950)
    a5_vl, a5_vl_where = _show(vllm_ascend, vllm_ref, VLLM_950_VL)
    multinode, multinode_where = _show(verl, verl_ref, VERL_MULTINODE)
    name_consts, topo_consts = go_strings(names), go_strings(topo)
    BASE_LIST.write_text(base)
    return {
        "about": (
            "Facts read from upstream files by tests/harness/upstream_host.py (see its docstring); each source names its file exactly."
        ),
        "runtime_base_list": {"repository": MIND_CLUSTER[0], **base_where, "mounts": [line for line in base.splitlines() if line]},
        "runtime_devices": {"repository": MIND_CLUSTER[0], **runtime_where, **runtime_devices(runtime)},
        "runtime_ub_mounts": {"repository": MIND_CLUSTER[0], **hook_where, "where_present": hook_mounts(hook)},
        "device_plugin_names": {
            "repository": MIND_CLUSTER[0],
            **names_where,
            "resource_910": name_consts["HuaweiAscend910"],
            "resource_a5": name_consts["HuaweiNPU"],
            "runtime_env": [name_consts["AscendVisibleDevicesEnv"], name_consts["AscendRuntimeOptionsEnv"]],
        },
        "device_plugin_topology": {
            "repository": MIND_CLUSTER[0],
            **topo_where,
            "env": topo_consts["HcclTopoFilePathKey"],
            "files": sorted(v for k, v in topo_consts.items() if k.endswith("TopoPath")),
        },
        "vllm_ascend_a2_a3": {"repository": VLLM_ASCEND[0], **install_where, **docker_run(install, "A2/A3")},
        "vllm_ascend_950": {"repository": VLLM_ASCEND[0], **a5_where, **docker_run(a5_doc, "Ascend950DT series")},
        "vllm_ascend_950_vl": {"repository": VLLM_ASCEND[0], **a5_vl_where, **docker_run(a5_vl, "Ascend950DT series")},
        "verl_multi_node": {"repository": VERL[0], **multinode_where, "env": verl_exports(multinode)},
    }


def load_facts() -> dict[str, Any]:
    facts: dict[str, Any] = json.loads(FACTS.read_text(encoding="utf-8"))
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="read the upstream files from git clones and rewrite facts.json and base.list")
    ex.add_argument("--mind-cluster", type=Path, required=True)
    ex.add_argument("--vllm-ascend", type=Path, required=True)
    ex.add_argument("--verl", type=Path, required=True)
    args = parser.parse_args(argv)
    STORE.mkdir(parents=True, exist_ok=True)
    facts = extract(args.mind_cluster, args.vllm_ascend, args.verl)
    FACTS.write_text(json.dumps(facts, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {FACTS} and {BASE_LIST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
