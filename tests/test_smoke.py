"""The smoke job without an engine: the job file, per-SKU values, device plans, judging, reports,
and the gsm8k-format data generator."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import docker.errors
import pyarrow.parquet as pq
import pytest
import requests

from buildkit.accuracy.metrics import StepMetrics, parse_log
from buildkit.doctor.base import RUNTIME_ENV, Check
from buildkit.errors import InputError
from buildkit.framework import framework
from buildkit.frameworks.openrlhf import ARGS_CHECK
from buildkit.matrix.load import load_matrix
from buildkit.resources import SMOKE_DIR
from buildkit.run.configcheck import composition_error
from buildkit.run.devices import (
    device_groups,
    host_config_args,
    image_user,
    parse_visible,
    plan_devices,
    prepare_data_dir,
)
from buildkit.run.job import MODEL_DIR, SMOKE_FILES, JobFacts
from buildkit.run.report import judge, write_reports
from buildkit.run.smoke import SmokeRequest, run_smoke
from tests.harness.hosttree import contract_paths, stand_in_host
from tests.harness.openrlhf_log import openrlhf_log
from tests.harness.openrlhf_standin import standin_tree
from tests.harness.upstream import compose_config, hydra_config_name

SKUS = load_matrix().matrix.skus


def gsm8k_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gsm8k_synth", SMOKE_DIR / "gsm8k_synth.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _override(argv: list[str], key: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")]
    assert len(values) == 1, f"{key} appears {len(values)} times in {argv}"
    return values[0]


# --- devices ---------------------------------------------------------------------------------


A3_PATHS = contract_paths("a3", "required", "optional")  # what a full A2/A3 host lends a container


def npu_host(tmp_path: Path, npus: int, *, control: bool = True, driver: bool = True, optional: bool = True, chip: str = "a3") -> Path:
    """A stand-in host of ``chip`` (its contract's pieces as empty files: enough to plan)."""
    return stand_in_host(tmp_path / "host", chip, npus, devices=control, required=driver or control, optional=optional,
                         without=() if driver else contract_paths(chip, "required"))  # fmt: skip


def test_a_host_without_npus_gets_a_preflight_plan(tmp_path: Path) -> None:
    plan = plan_devices("a3", SKUS["a3"], host_root=npu_host(tmp_path, 0, control=False, driver=False, optional=False))
    assert not plan.has_npus and plan.driver_files == () and "preflight only" in plan.notes[0]
    args = host_config_args(plan, {}, privileged=False)
    assert args["devices"] == [] and "network_mode" not in args


def test_a_full_a3_host_gets_every_device_and_the_driver_read_only(tmp_path: Path) -> None:
    plan = plan_devices("a3", SKUS["a3"], host_root=npu_host(tmp_path, 16))
    assert plan.npus == tuple(f"/dev/davinci{i}" for i in range(16))
    args = host_config_args(plan, {"/models/q": (MODEL_DIR, "ro")}, privileged=False)
    host = str(tmp_path / "host")  # the stand-in host's / (on a real host, /): host paths map to the same paths inside
    assert f"{host}/dev/davinci15:/dev/davinci15:rwm" in args["devices"]
    assert {f"{host}{d}:{d}:rwm" for d in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")} <= set(args["devices"])
    assert len(args["devices"]) == 20, "16 NPUs, davinci_manager, hisi_hdc, devmm_svm and dvpp_cmdlist"
    assert args["privileged"] is False and args["network_mode"] == "host" and args["shm_size"] == "16g"
    assert "group_add" not in args
    for path in A3_PATHS:
        assert args["binds"][host + path] == {"bind": path, "mode": "ro"}
    assert args["binds"]["/models/q"] == {"bind": MODEL_DIR, "mode": "ro"}


def test_a_950_host_lends_its_ub_devices_topology_and_files_where_it_has_them(tmp_path: Path) -> None:
    """No devmm_svm on the 950 generation; every node of /dev/uburma and /dev/ummu; the driver's topo
    directory and HCCL_TOPO_FILE_PATH for the SKU's product file; the multi-node files where the host has them."""
    sku = SKUS["950-superpod"]
    left_out = ("/etc/hixlep", "/etc/hccl_rootinfo.json")
    root = stand_in_host(tmp_path / "host", "a5", sku.npus_per_node, topo_file=sku.hccl_topo_file, without=left_out)
    plan = plan_devices("950-superpod", sku, host_root=root)
    args = host_config_args(plan, {}, privileged=False)
    nodes = {d.split(":")[1] for d in args["devices"]}
    assert "/dev/devmm_svm" not in nodes and {"/dev/uburma/ub0", "/dev/uburma/ub1", "/dev/ummu/ummu0", "/dev/hisi_hdc"} <= nodes
    assert args["binds"][f"{root}/lib/route.conf"] == {"bind": "/lib/route.conf", "mode": "ro"}
    assert args["binds"][f"{root}/usr/local/Ascend/driver/topo"]["bind"] == "/usr/local/Ascend/driver/topo"
    assert dict(plan.env) == {"HCCL_TOPO_FILE_PATH": f"/usr/local/Ascend/driver/topo/950/{sku.hccl_topo_file}"}
    assert not any(b["bind"] in ("/etc/hccl_rootinfo.json", "/etc/hixlep") for b in args["binds"].values())
    assert "/etc/hixlep not on this host: not mounted (multi_node on a5)" in plan.notes


def test_a_950_host_without_its_topology_file_is_refused_for_several_cards(tmp_path: Path) -> None:
    sku = SKUS["950-superpod"]
    root = stand_in_host(tmp_path / "host", "a5", sku.npus_per_node)
    with pytest.raises(InputError, match=f"{sku.hccl_topo_file} .*EI0014"):
        plan_devices("950-superpod", sku, host_root=root)
    plan = plan_devices("950-superpod", sku, [0], host_root=root)
    assert any("one NPU needs no HCCL" in n for n in plan.notes)
    with pytest.raises(InputError, match="/usr/local/Ascend/driver/topo"):
        plan_devices(
            "950-superpod", sku, [0], host_root=stand_in_host(tmp_path / "bare", "a5", 8, without=("/usr/local/Ascend/driver/topo",))
        )


def own(path: Path, uid: int, gid: int, mode: int) -> None:
    """Give a stand-in device node an owner and mode, as a host's driver gives its own."""
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        pytest.skip("giving stand-in device nodes other owners needs root (CI runs these tests as root)")
    path.chmod(mode)


def ascend_owned(root: Path) -> None:
    """Every device node of a stand-in host as the Ascend driver leaves them: HwHiAiUser's, 0660."""
    for node in (root / "dev").iterdir():
        own(node, 1000, 1000, 0o660)


def test_the_containers_user_gets_the_groups_that_own_the_hosts_devices(tmp_path: Path) -> None:
    root = npu_host(tmp_path, 2)
    ascend_owned(root)
    plan = plan_devices("a3", SKUS["a3"], [0, 1], host_root=root)
    assert device_groups(plan, 1000, 1000) == ((), ()), "the driver's own user needs no group"
    own(root / "dev/davinci1", 0, 1234, 0o660)  # a host that gives a card another group
    assert device_groups(plan, 1000, 1000) == ((1234,), ())
    assert device_groups(plan, 0, 0) == ((), ()), "root opens every node"
    assert host_config_args(plan, {}, privileged=False, groups=(1234,))["group_add"] == ["1234"]
    own(root / "dev/davinci1", 1000, 1234, 0o600)  # owner-only, and the owner is the user
    assert device_groups(plan, 1000, 1000) == ((), ())
    own(root / "dev/hisi_hdc", 0, 0, 0o660)
    groups, notes = device_groups(plan, 1000, 1000)
    assert groups == (0,) and "group root" in notes[0]
    own(root / "dev/hisi_hdc", 0, 0, 0o600)  # no group opens it: said, not guessed
    groups, notes = device_groups(plan, 1000, 1000)
    assert groups == () and notes == ("/dev/hisi_hdc is 0:0 mode 0600: uid 1000 cannot open it through a group (--as-root runs as root)",)


def test_the_user_an_image_runs_as_comes_from_its_label_then_its_config(tmp_path: Path) -> None:
    assert image_user({"io.ascendkit.user": "HwHiAiUser 1000:1000"}, "1000:1000") == ("HwHiAiUser", 1000, 1000)
    assert image_user({}, "1001:1002") == ("uid 1001", 1001, 1002)
    assert image_user({}, "1001") == ("uid 1001", 1001, 0)
    for root in ("", "0", "0:0", "root"):
        assert image_user({}, root) == ("root", 0, 0)


def test_the_generated_data_directory_is_the_containers_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert prepare_data_dir(out, 0, 0) is None and (out / "data").is_dir()
    if os.geteuid() == 0:
        assert prepare_data_dir(out, 1000, 1001) is None
        assert ((out / "data").stat().st_uid, (out / "data").stat().st_gid) == (1000, 1001)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # a caller who is neither root nor the image's user
    note = prepare_data_dir(out, 1000, 1000)
    assert (out / "data").stat().st_mode & 0o777 == 0o777 and note is not None and "uid 1000" in note
    assert prepare_data_dir(out, 4242, 4242) is None, "the caller is the image's user: nothing to give"


def test_a_host_with_fewer_npus_than_the_sku_is_refused_with_the_way_out(tmp_path: Path) -> None:
    root = npu_host(tmp_path, 8)
    with pytest.raises(InputError, match=r"16 NPUs per node, this host shows 8 .*--devices 0-7"):
        plan_devices("a3", SKUS["a3"], host_root=root)
    plan = plan_devices("a3", SKUS["a3"], parse_visible("0-3,6"), host_root=root)
    assert plan.npus == ("/dev/davinci0", "/dev/davinci1", "/dev/davinci2", "/dev/davinci3", "/dev/davinci6")
    with pytest.raises(InputError, match="/dev/davinci9"):
        plan_devices("a3", SKUS["a3"], [8, 9], host_root=root)


def test_missing_control_devices_or_driver_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="/dev/davinci_manager, /dev/hisi_hdc, /dev/devmm_svm"):
        plan_devices("900-podc", SKUS["900-podc"], host_root=npu_host(tmp_path / "a", 8, control=False))
    with pytest.raises(InputError, match="/usr/local/Ascend/driver/lib64"):
        plan_devices("900-podc", SKUS["900-podc"], host_root=npu_host(tmp_path / "b", 8, driver=False))
    plan = plan_devices("900-podc", SKUS["900-podc"], host_root=npu_host(tmp_path / "c", 8, optional=False))
    assert plan.driver_files == contract_paths("a2", "required")
    assert len(plan.notes) == len(contract_paths("a2", "optional")) + len(contract_paths("a2", "optional", devices=True))


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,1", "-1", "0-"])
def test_bad_device_lists_are_refused(text: str) -> None:
    with pytest.raises(InputError, match="--devices"):
        parse_visible(text)


# --- judging ---------------------------------------------------------------------------------


def run(*rows: tuple[float, float, float]) -> list[StepMetrics]:
    return [
        StepMetrics(i, {"critic/rewards/mean": r, "actor/pg_loss": loss, "perf/throughput": t})
        for i, (r, loss, t) in enumerate(rows, start=1)
    ]


VERL_GRPO = framework("verl").gate("grpo")


def statuses(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_a_good_run_passes_every_check() -> None:
    checks = judge(run((0.1, 0.01, 900.0), (0.2, -0.02, 1100.0), (0.25, 0.0, 1000.0)), 3, VERL_GRPO)
    assert set(statuses(checks).values()) == {"ok"}
    detail = {c.name: c.detail for c in checks}
    assert detail["throughput > 0"] == "mean 1000 tokens/s/device over 3 steps"
    assert detail["rewards in [0, 1]"] == "3 steps, 0.1..0.25"


def test_each_failure_is_caught_and_named() -> None:
    assert statuses(judge(run((0.1, 0.0, 9.0)), 3, VERL_GRPO))["steps completed"] == "error"
    nan = judge(run((0.1, math.nan, 9.0), (0.1, 0.0, 9.0)), 2, VERL_GRPO)
    assert statuses(nan)["finite metrics"] == "error" and "step 1 actor/pg_loss=nan" in nan[1].detail
    high = judge(run((1.5, 0.0, 9.0)), 1, VERL_GRPO)
    assert statuses(high)["rewards in [0, 1]"] == "error" and "step 1: 1.5" in high[2].detail
    assert statuses(judge(run((0.5, 0.0, 0.0)), 1, VERL_GRPO))["throughput > 0"] == "error"
    empty = statuses(judge([], 5, VERL_GRPO))
    assert empty == {
        "steps completed": "error",
        "finite metrics": "ok",
        "rewards in [0, 1]": "error",
        "loss logged": "error",
        "throughput > 0": "error",
    }


def _report_data(outcome: str) -> dict[str, object]:
    return {
        "outcome": outcome,
        "exit_code": 1,
        "message": "failed: finite metrics",
        "sku": "a3",
        "product": "Atlas 800T A3",
        "image": {"ref": "r:1", "id": "sha256:" + "a" * 64, "stack": "cann8.3", "chip": "a3"},
        "settings": {
            "steps": 2,
            "timeout_s": 60.0,
            "devices": [],
            "privileged": False,
            "network": "default",
            "model_path": None,
            "data": "x",
            "baseline": None,
        },
        "host_notes": [],
        "doctor": None,
        "checks": [{"name": "finite metrics", "status": "error", "detail": "step 1 actor/pg_loss=nan"}],
        "comparison": {
            "metrics": {
                "critic/rewards/mean": {
                    "mean_abs_error": math.nan,
                    "mean_abs_error_pct": None,
                    "steps": 2,
                    "tolerance_pct": 4.0,
                    "status": "error",
                }
            },
            "throughput_ratio": 0.5,
        },
        "files": {"doctor_log": "doctor.log", "job_log": "job.log", "plot": "report.png"},
    }


def test_reports_are_valid_json_deterministic_and_readable(tmp_path: Path) -> None:
    write_reports(tmp_path, _report_data("failed"))
    first = (tmp_path / "report.json").read_bytes(), (tmp_path / "report.md").read_bytes()
    write_reports(tmp_path, _report_data("failed"))
    assert ((tmp_path / "report.json").read_bytes(), (tmp_path / "report.md").read_bytes()) == first
    data = json.loads(first[0])  # NaN became null: strict JSON parsers accept it
    assert data["comparison"]["metrics"]["critic/rewards/mean"]["mean_abs_error"] is None
    text = first[1].decode()
    assert text.startswith("# verl GRPO smoke test: FAILED")
    assert "| finite metrics | error | step 1 actor/pg_loss=nan |" in text
    assert "| `critic/rewards/mean` | 2 | n/a | n/a | 4 | FAIL |" in text
    assert "Throughput ratio (NPU / baseline): 0.500" in text
    assert "![reward, loss and throughput per step](report.png)" in text


# --- the data generator ----------------------------------------------------------------------


def test_the_generator_is_deterministic_and_writes_verls_gsm8k_schema(tmp_path: Path) -> None:
    gen = gsm8k_generator()
    for out in (tmp_path / "a", tmp_path / "b"):
        assert gen.main(["--out", str(out), "--train", "40", "--test", "10", "--seed", "7"]) == 0
    for split in ("train", "test"):
        assert (tmp_path / "a" / f"{split}.parquet").read_bytes() == (tmp_path / "b" / f"{split}.parquet").read_bytes()
    table = pq.read_table(tmp_path / "a" / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert str(table.schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
    assert str(table.schema.field("extra_info").type) == "struct<split: string, index: int64, answer: string, question: string>"
    rows = table.to_pylist()
    assert len(rows) == 40 and [r["extra_info"]["index"] for r in rows] == list(range(40))
    for row in rows:
        assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
        assert row["reward_model"]["style"] == "rule"
        (message,) = row["prompt"]
        question = row["extra_info"]["question"]
        assert message == {"role": "user", "content": question + ' Let\'s think step by step and output the final answer after "####".'}
        answer = row["extra_info"]["answer"]
        truth = answer.split("####")[1].strip().replace(",", "")
        assert row["reward_model"]["ground_truth"] == truth and truth.isdigit()
    test_rows = pq.read_table(tmp_path / "a" / "test.parquet").to_pylist()
    assert {r["extra_info"]["split"] for r in test_rows} == {"test"}
    other = gen.rows("train", 40, 8)
    assert [r["extra_info"]["question"] for r in other] != [r["extra_info"]["question"] for r in rows], "the seed matters"


def test_the_worked_answers_are_right() -> None:
    """Every `a op b = c` in a worked answer is true, and the last one is the ground truth."""
    gen = gsm8k_generator()
    ops = {"*": int.__mul__, "+": int.__add__, "-": int.__sub__}
    for row in gen.rows("train", 300, 0):
        answer = row["extra_info"]["answer"]
        equations = re.findall(r"(\d+) ([*+-]) (\d+) = (\d+)", answer)
        assert equations or "divided among" in answer, answer
        for a, op, b, c in equations:
            assert ops[op](int(a), int(b)) == int(c), answer
        if equations and "divided among" not in answer:
            assert equations[-1][3] == row["reward_model"]["ground_truth"], answer
        assert int(row["reward_model"]["ground_truth"]) >= 0


# --- the whole run, on a fake NPU host and a fake engine -------------------------------------

LOGS = Path(__file__).parent / "fixtures" / "logs"


VERL_LABELS = {"io.ascendkit.chip": "a3", "io.ascendkit.stack": "cann8.3", "io.ascendkit.version.verl": "0.6.1"}
OPENRLHF_LABELS = {
    "io.ascendkit.chip": "a2",
    "io.ascendkit.stack": "openrlhf-cann8.1",
    "io.ascendkit.framework": "openrlhf",
    "io.ascendkit.version.openrlhf": "0.7.5",
}


class FakeEngine:
    """Stands in for docker-py's APIClient where no NPU exists: records what smoke asks for, plays
    back doctor's JSON and a training log (the tests' fixtures), and answers the config check as the
    image's framework does: verl 0.6.1 composes the config its entry point names, by Hydra from the
    PyPI wheel with the command's overrides (exit 1 with Hydra's message when they do not compose);
    OpenRLHF runs its own parser, the file vendored from the pinned fork, through smoke_tests'
    openrlhf_args.py (argparse's exit 2 and message for a flag it does not know)."""

    VERL = "0.6.1"

    def __init__(
        self, doctor_code: int, job_log: Path, job_code: int = 0, *, job_hangs: bool = False, labels: dict[str, str] | None = None
    ) -> None:
        self.doctor_code, self.job_log, self.job_code, self.job_hangs = doctor_code, job_log, job_code, job_hangs
        self.labels = labels or VERL_LABELS
        self.created: list[dict[str, Any]] = []
        self.removed: list[str] = []
        self.checked: dict[str, tuple[int, bytes]] = {}

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Id": "sha256:" + "b" * 64, "Config": {"Labels": self.labels}}

    def version(self) -> dict[str, Any]:
        return {"Version": "20.10.24", "ApiVersion": "1.41"}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self.created.append({"image": image, **kwargs})
        return {"Id": f"c{len(self.created)}"}

    def _command(self, cid: str) -> list[str]:
        return list(self.created[int(cid[1:]) - 1]["command"])

    def _kind(self, cid: str) -> str:
        command = self._command(cid)
        if command[:2] == ["ascendkit", "doctor"]:
            return "doctor"
        return "check" if command[3:5] == ["--cfg", "job"] or command[1] == ARGS_CHECK else "job"

    def _check(self, cid: str) -> tuple[int, bytes]:
        if cid not in self.checked:
            command = self._command(cid)
            self.checked[cid] = self._parse(command) if command[1] == ARGS_CHECK else self._compose(command)
        return self.checked[cid]

    def _compose(self, command: list[str]) -> tuple[int, bytes]:
        from hydra.errors import ConfigCompositionException
        from omegaconf import OmegaConf

        try:
            config = compose_config(self.VERL, hydra_config_name(self.VERL, command[2]), command[5:])
        except ConfigCompositionException as exc:
            return 1, f"{exc}\n{exc.__cause__}\n".encode()
        return 0, ("ray init noise printed before the config\n" + OmegaConf.to_yaml(config)).encode()

    def _parse(self, command: list[str]) -> tuple[int, bytes]:
        with tempfile.TemporaryDirectory() as tmp:
            tree = standin_tree(Path(tmp) / "src")
            done = subprocess.run(
                [sys.executable, str(SMOKE_DIR / "openrlhf_args.py"), *command[2:]],
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                check=False,
            )
        return done.returncode, done.stdout + done.stderr

    def start(self, cid: str) -> None:
        pass

    def wait(self, cid: str, timeout: int) -> dict[str, int]:
        kind = self._kind(cid)
        if kind == "job" and self.job_hangs:
            time.sleep(timeout)
            raise requests.exceptions.ReadTimeout("read timed out")
        code = {"doctor": self.doctor_code, "job": self.job_code}.get(kind)
        return {"StatusCode": self._check(cid)[0] if code is None else code}

    def logs(self, cid: str, stream: bool = False, **kwargs: Any) -> Any:
        kind = self._kind(cid)
        if kind == "doctor":
            body = json.dumps({"outcome": "ready", "exit_code": self.doctor_code, "checks": []}).encode()
        elif kind == "check":
            body = self._check(cid)[1]
        else:
            body = self.job_log.read_bytes()
        return iter([body[:100], body[100:]]) if stream else body

    def kill(self, cid: str) -> None:
        pass

    def remove_container(self, cid: str, force: bool = False) -> None:
        self.removed.append(cid)

    def inspect_container(self, cid: str) -> dict[str, Any]:
        if cid in self.removed:  # as the engine answers for a container it removed
            raise docker.errors.NotFound(f"No such container: {cid}")
        return {"Id": cid}


def smoke_request(tmp_path: Path, **kwargs: Any) -> SmokeRequest:
    (tmp_path / "model").mkdir(exist_ok=True)
    settings: dict[str, Any] = {
        "sku_id": "a3",
        "sku": SKUS["a3"],
        "chip_id": "a3",
        "image": "ascendkit/verl:test",
        "out": tmp_path / "out",
        "model_path": tmp_path / "model",
        "host_root": npu_host(tmp_path, 16),
        "facts": JobFacts.of(load_matrix().matrix.compat),
        **kwargs,
    }
    return SmokeRequest(**settings)


def test_smoke_runs_as_the_images_user_with_the_devices_groups_or_as_root(tmp_path: Path) -> None:
    labels = {**VERL_LABELS, "io.ascendkit.user": "HwHiAiUser 1000:1000"}
    request = smoke_request(tmp_path)
    ascend_owned(tmp_path / "host")
    own(tmp_path / "host/dev/davinci3", 0, 1234, 0o660)
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=labels)
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("passed", 0), report.message
    _, doctor, job = engine.created
    assert [c["user"] for c in engine.created] == [None, None, None], "the image's own user"
    assert doctor["host_config"]["group_add"] == job["host_config"]["group_add"] == ["1234"]
    assert report.data["settings"]["user"] == "HwHiAiUser (1000:1000)" and report.data["settings"]["device_groups"] == [1234]
    assert (tmp_path / "out/data").stat().st_uid == 1000, "the job writes its generated data as the image's user"
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=labels)
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, as_root=True))
    assert report.exit_code == 0 and [c["user"] for c in engine.created] == ["root", "root", "root"]
    assert "group_add" not in engine.created[2]["host_config"] and report.data["settings"]["user"] == "root (0:0), --as-root"


def test_on_an_npu_host_doctor_then_the_job_run_with_the_skus_devices_and_pass(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log")
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path))
    assert (report.outcome, report.exit_code) == ("passed", 0), report.message
    check, doctor, job = engine.created
    assert check["command"][:5] == ["python3", "-m", "verl.trainer.main_ppo", "--cfg", "job"]
    assert check["command"][5:] == report.data["job"]["command"][3:], "the check runs the job's exact overrides"
    assert check["environment"]["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" and "devices" not in check["host_config"]
    host = str(tmp_path / "host")
    assert set(check["host_config"]["binds"]) == {host + f for f in A3_PATHS}, "the driver, read-only"
    assert "trainer.device=npu" in check["command"], "verl 0.6.1 does not detect NPUs itself"
    assert doctor["command"] == ["ascendkit", "doctor", "--json"]
    assert doctor["environment"] == {RUNTIME_ENV: "docker://20.10.24"}, "doctor judges this engine's zstd pulls"
    assert job["host_config"] == doctor["host_config"], "doctor sees exactly what the job sees"
    config = job["host_config"]
    assert len(config["devices"]) == 20 and config["network_mode"] == "host" and config["privileged"] is False
    assert config["binds"][str((tmp_path / "model").resolve())] == {"bind": MODEL_DIR, "mode": "ro"}
    assert config["binds"][str(SMOKE_DIR)] == {"bind": SMOKE_FILES, "mode": "ro"}
    script = job["command"][2]
    assert script.startswith(
        "set -e; python3 /opt/ascendkit-smoke/gsm8k_synth.py --out /smoke/out/data --train 256 --format verl-rl; "
        "exec python3 -m verl.trainer.main_ppo"
    )
    assert "trainer.n_gpus_per_node=16" in script and "data.train_files=/smoke/out/data/train.parquet" in script
    assert engine.removed == ["c1", "c2", "c3"]
    out = tmp_path / "out"
    assert "device: npu" in (out / "job-config.yaml").read_text() and report.data["config_check"]["passed"]
    assert (out / "job.log").read_bytes() == (LOGS / "npu_old_verl.log").read_bytes()
    data = json.loads((out / "report.json").read_text())
    assert data["job"]["steps_logged"] == 5 and data["files"]["plot"] == "report.png"
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_with_a_baseline_the_seeds_gate_decides(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log")
    baseline = parse_log((LOGS / "gpu_new_verl.log").read_text().splitlines())
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, baseline=baseline, baseline_name="gpu_new_verl.log"))
    assert report.outcome == "passed"
    comparison = report.data["comparison"]
    # rewards |0.5-0.52|+|0.6-0.58|+|0.7-0.71|+|0.8-0.79|+|0.81-0.8| = 0.07 over 5 steps
    assert comparison["metrics"]["critic/rewards/mean"]["mean_abs_error_pct"] == pytest.approx(1.4)
    # losses |0.01-0.012|+|-0.02+0.015|+|0.005-0.004|+|0.001-0.0015|+0 = 0.0085 over 5 steps
    assert comparison["metrics"]["actor/pg_loss"]["mean_abs_error_pct"] == pytest.approx(0.17)
    assert comparison["throughput_ratio"] == pytest.approx(1150 / 2100)
    strict = [StepMetrics(s.step, {**s.metrics, "critic/rewards/mean": s.metrics["critic/rewards/mean"] + 0.05}) for s in baseline]
    report = run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log")), smoke_request(tmp_path, baseline=strict))
    assert (report.outcome, report.exit_code) == ("failed", 1) and "baseline gate: critic/rewards/mean" in report.message


def test_the_job_is_judged_and_failures_keep_the_report(tmp_path: Path) -> None:
    short = run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log")), smoke_request(tmp_path, steps=8))
    assert short.outcome == "failed" and short.message == "failed: steps completed"
    crashed = run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log", job_code=137)), smoke_request(tmp_path))
    assert crashed.outcome == "failed" and "the job exited with 137" in crashed.message
    assert json.loads((tmp_path / "out" / "report.json").read_text())["outcome"] == "failed"


@pytest.mark.parametrize(
    ("doctor_code", "message"), [(1, "doctor failed in the image (exit 1)"), (10, "doctor sees none in the container")]
)
def test_a_failing_doctor_stops_the_run_before_the_job(tmp_path: Path, doctor_code: int, message: str) -> None:
    assert run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log")), smoke_request(tmp_path)).outcome == "passed"
    engine = FakeEngine(doctor_code, LOGS / "npu_old_verl.log")
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path))
    assert (report.outcome, report.exit_code) == ("failed", 1) and message in report.message
    assert len(engine.created) == 2 and engine.removed == ["c1", "c2"]
    out = tmp_path / "out"
    assert not (out / "job.log").exists() and not (out / "report.png").exists(), "nothing left from the earlier run"


def test_an_npu_host_needs_the_model(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--model-path is required"):
        run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log")), smoke_request(tmp_path, model_path=None))


def test_a_config_verl_refuses_stops_the_run_before_doctor(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log")
    request = smoke_request(tmp_path, overrides=("actor_rollout_ref.rollout.gpu_memory_utilisation=0.5",))
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert "config check: verl refused the job's config" in report.message and "gpu_memory_utilisation" in report.message
    assert len(engine.created) == 1 and engine.removed == ["c1"], "neither doctor nor the job ran"
    assert "## Config check (verl composes the job in the image): FAILED" in (tmp_path / "out" / "report.md").read_text()


class Verl091Engine(FakeEngine):
    VERL = "0.9.1"


def test_a_reward_function_named_by_a_key_the_images_verl_never_reads_stops_the_run_before_doctor(tmp_path: Path) -> None:
    """verl 0.9.1's Hydra takes custom_reward_function.path and nothing reads it: the job would train on verl's default
    reward. The check refuses it, naming the key verl reads; with that key the check passes and names the function."""
    labels = {**VERL_LABELS, "io.ascendkit.stack": "cann9.2", "io.ascendkit.version.verl": "0.9.1"}
    reward = "/opt/team/rewards/math.py"
    engine = Verl091Engine(0, LOGS / "npu_old_verl.log", labels=labels)
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, overrides=(f"custom_reward_function.path={reward}",)))
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert "reward function: verl 0.9.1 never reads the legacy reward keys" in report.message
    assert "custom_reward_function.path -> reward.custom_reward_function.path" in report.message
    assert len(engine.created) == 1, "neither doctor nor the job ran"
    engine = Verl091Engine(0, LOGS / "npu_old_verl.log", labels=labels)
    request = smoke_request(tmp_path, check_only=True, model_path=None, overrides=(f"reward.custom_reward_function.path={reward}",))
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("checked", 0), report.message
    checks = {c["name"]: c for c in report.data["config_check"]["checks"]}
    assert checks["reward function"]["status"] == "ok" and reward in checks["reward function"]["detail"]


def test_check_alone_needs_no_devices_and_trains_nothing(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log")
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, check_only=True, model_path=None, host_root=tmp_path))
    assert (report.outcome, report.exit_code) == ("checked", 0), report.message
    assert len(engine.created) == 1
    names = {c["name"]: c["status"] for c in report.data["config_check"]["checks"]}
    assert names == {"device": "ok", "batch split": "ok", "mini-batches": "ok", "rollout parallelism": "ok", "reward function": "ok"}


def test_a_job_that_never_steps_is_stopped_and_the_cause_named(tmp_path: Path) -> None:
    """verl 0.6 with trainer.device=cuda: Ray comes up, the placement group waits for GPUs forever."""
    log = tmp_path / "stuck.log"
    log.write_text(
        "2026-11-22 10:00:00,000 INFO worker.py:1888 -- Started a local Ray instance.\n"
        "(autoscaler +1m2s) Warning: The following resource request cannot be scheduled right now: {'GPU': 1.0, 'CPU': 1.0}.\n"
    )
    engine = FakeEngine(0, log, job_hangs=True)
    started = time.monotonic()
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, stall_after=0.5, timeout=120))
    assert time.monotonic() - started < 30, "stopped at the stall, long before --timeout"
    assert (report.outcome, report.exit_code) == ("stalled", 9)
    assert report.message.startswith("no step line for") and "trainer.device is cuda" in report.message
    stall = report.data["job"]["stall"]
    assert "GPU" in stall["last_lines"][-1] and engine.removed == ["c1", "c2", "c3"]
    assert "## Why the job stopped" in (tmp_path / "out" / "report.md").read_text()


def test_verls_sft_job_runs_torchrun_checked_by_the_sft_config_verl_composes(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_sft.log")
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, job="sft"))
    assert (report.outcome, report.exit_code) == ("passed", 0), report.message
    assert report.message == "5 verl SFT steps trained and passed every check"
    check, _, job = engine.created
    assert check["command"][:5] == ["python3", "-m", "verl.trainer.fsdp_sft_trainer", "--cfg", "job"]
    names = {c["name"]: c["status"] for c in report.data["config_check"]["checks"]}
    assert names == {"device": "ok", "batch split": "ok", "LoRA": "ok"}
    assert "--nproc_per_node=16 -m verl.trainer.fsdp_sft_trainer" in job["command"][2]
    assert "--format verl-sft" in job["command"][2] and "model.lora_rank=32" in job["command"][2]
    judged = {c["name"]: c["status"] for c in report.data["checks"]}
    assert judged == {"steps completed": "ok", "finite metrics": "ok", "loss logged": "ok"}, "an SFT run has no reward to judge"
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.startswith("# verl SFT smoke test: PASSED") and "## Config check (verl composes the job in the image): passed" in text


def test_a_misspelled_sft_key_is_refused_by_verls_own_sft_config(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_sft.log")
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path, job="sft", check_only=True, overrides=("model.lora_rnk=8",)))
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert "verl refused the job's config" in report.message and "lora_rnk" in report.message


def _openrlhf_request(tmp_path: Path, **kwargs: Any) -> SmokeRequest:
    return smoke_request(tmp_path, sku_id="a2-box16", sku=SKUS["a2-box16"], chip_id="a2", image="ascendkit/openrlhf:test", **kwargs)


def test_openrlhfs_grpo_job_is_checked_by_its_own_parser_then_runs_on_a_ray_head(tmp_path: Path) -> None:
    log = tmp_path / "openrlhf.log"
    log.write_text(openrlhf_log(5))
    engine = FakeEngine(0, log, labels=OPENRLHF_LABELS)
    report = run_smoke(cast(Any, engine), _openrlhf_request(tmp_path))
    assert (report.outcome, report.exit_code) == ("passed", 0), report.message
    assert report.message == "5 OpenRLHF GRPO steps trained and passed every check"
    check, _, job = engine.created
    assert check["command"][:3] == ["python3", ARGS_CHECK, "openrlhf.cli.train_ppo_ray"]
    assert check["host_config"]["binds"][str(SMOKE_DIR)] == {"bind": SMOKE_FILES, "mode": "ro"}, "the argument check script"
    names = {c["name"]: c["status"] for c in report.data["config_check"]["checks"]}
    assert names == {"hybrid engine": "ok", "colocation": "ok", "NPU placement": "ok", "batch split": "ok", "steps": "ok", "reward": "ok"}
    args = json.loads((tmp_path / "out" / "job-args.json").read_text())
    assert (
        args["vllm_num_engines"] == 8
        and args["actor_num_gpus_per_node"] == 8
        and args["remote_rm_url"] == ["/opt/ascendkit-smoke/gsm8k_reward.py"]
    ), "the arguments as OpenRLHF parsed them"
    script = job["command"][2]
    steps = script.removeprefix("set -e; ").split("; ")
    assert steps[0].endswith("--format openrlhf-rl") and steps[1].startswith("ray start --head --port=6379")
    assert steps[2].startswith("exec python3 -m openrlhf.cli.train_ppo_ray --pretrain=/smoke/model")
    judged = {c["name"]: c["status"] for c in report.data["checks"]}
    assert judged == {"steps completed": "ok", "finite metrics": "ok", "rewards in [0, 1]": "ok", "loss logged": "ok"}
    assert report.data["job"]["steps_logged"] == 5 and report.data["image"]["framework"] == "openrlhf"
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.startswith("# OpenRLHF GRPO smoke test: PASSED")
    assert "## Config check (OpenRLHF parses the job's flags in the image): passed" in text


def test_a_flag_openrlhf_does_not_know_fails_with_openrlhfs_own_message(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=OPENRLHF_LABELS)
    # (argparse takes an unambiguous prefix as the flag it begins: --vllm_num_engine is --vllm_num_engines)
    request = _openrlhf_request(tmp_path, check_only=True, model_path=None, host_root=tmp_path, overrides=("--vllm_num_engins=2",))
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert report.message.startswith("config check: OpenRLHF refused the job's arguments (exit 2): ")
    assert "train_ppo_ray.py: error: unrecognized arguments: --vllm_num_engins=2" in report.message
    assert len(engine.created) == 1, "no doctor, no job"


def test_openrlhfs_own_assertion_is_the_message(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=OPENRLHF_LABELS)
    request = _openrlhf_request(tmp_path, check_only=True, model_path=None, host_root=tmp_path, overrides=("--n_samples_per_prompt=1",))
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert "AssertionError: group_norm requires n_samples_per_prompt > 1" in report.message


def test_an_openrlhf_job_asking_for_more_npus_than_the_node_has_fails_before_ray(tmp_path: Path) -> None:
    """OpenRLHF itself would accept it and wait forever for the placement; ascendkit's check names it."""
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=OPENRLHF_LABELS)
    request = _openrlhf_request(tmp_path, check_only=True, model_path=None, host_root=tmp_path, overrides=("--vllm_num_engines=12",))
    report = run_smoke(cast(Any, engine), request)
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert "NPU placement: the job asks Ray for 20 NPUs (actor 8, vLLM 12) and 1 node(s) have 16" in report.message


def test_an_openrlhf_image_has_no_sft_job(tmp_path: Path) -> None:
    engine = FakeEngine(0, LOGS / "npu_old_verl.log", labels=OPENRLHF_LABELS)
    with pytest.raises(InputError, match="an OpenRLHF image has the grpo smoke job"):
        run_smoke(cast(Any, engine), _openrlhf_request(tmp_path, job="sft", check_only=True, model_path=None, host_root=tmp_path))
    with pytest.raises(InputError, match="this image runs OpenRLHF, whose arguments are flags"):
        run_smoke(cast(Any, engine), _openrlhf_request(tmp_path, check_only=True, model_path=None, host_root=tmp_path, overrides=("a=b",)))


def test_composition_errors_say_what_to_do() -> None:
    missing = "/usr/bin/python3: Error while finding module specification for 'verl.trainer.main_ppo' " + (
        "(ModuleNotFoundError: No module named 'verl')"
    )
    assert composition_error(missing, 1, "verl", "verl.trainer.main_ppo").startswith("verl is not installed in this image")
    cann = "Traceback (most recent call last):\n  File x\nImportError: libhccl.so: cannot open shared object file"
    assert composition_error(cann, 1, "verl", "verl.trainer.main_ppo").startswith(
        "torch_npu could not load the CANN or driver libraries (exit 1): ImportError"
    )
    hydra = (
        "Could not override 'actor_rollout_ref.actor.optim.lrr'.\n"
        "To append to your config use +actor_rollout_ref.actor.optim.lrr=1\n"
        "Key 'lrr' is not in struct"
    )
    message = composition_error(hydra, 1, "verl", "verl.trainer.main_ppo")
    assert message.startswith("verl refused the job's config (exit 1): Could not override 'actor_rollout_ref.actor.optim.lrr'.")
    assert "not in struct" in message


def test_a_failed_job_with_a_known_hccl_code_gets_its_explanation_in_the_report(tmp_path: Path) -> None:
    """The code, what it means and the first thing to check, from buildkit/doctor/error_codes.json."""
    engine = FakeEngine(0, LOGS / "npu_hccl_ei0006.log", job_code=1)
    report = run_smoke(cast(Any, engine), smoke_request(tmp_path))
    assert (report.outcome, report.exit_code) == ("failed", 1)
    assert report.message.startswith("the job exited with 1; see job.log; likely: HCCL reported errors")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Why the job stopped: the job exited with 1 at Ray came up" in text
    assert "- EI0006 (HCCL: get socket timeout): ranks could not connect to each other within HCCL_CONNECT_TIMEOUT" in text
    assert "First check: HCCL_IF_IP / HCCL_SOCKET_IFNAME name an interface the other nodes reach" in text
    assert "Source: CANN troubleshooting, HCCL Errors" in text
