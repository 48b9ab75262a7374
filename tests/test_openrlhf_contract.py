"""OpenRLHF's smoke job against the OpenRLHF each stack pins: the fork's own argument parser and
start-up assertions at the pinned commit (vendored verbatim, its hash checked), the real Ray, the
real tqdm, vllm-ascend's real source for the patch, verl's own gsm8k scorer for the reward.

For every OpenRLHF stack x SKU, the job is filled exactly as ``ascendkit smoke`` fills it and as
``ascendkit k8s render`` writes it (parsed back out of the manifests: the Job on one node, the
RayJob and the Volcano Job on two), and run through ``smoke_tests/openrlhf_args.py``: the fork's
``train_ppo_ray`` as ``__main__`` up to ``ray.init``, what the config check runs in the image.
Everything that file imports from ``openrlhf.*`` is the labelled stand-in of
tests/fixtures/openrlhf-standin (the rest of the fork needs torch, DeepSpeed and vLLM).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildkit.frameworks.openrlhf import args as openrlhfargs
from buildkit.frameworks.openrlhf.args import check_args, parse_printed_args
from buildkit.k8s.render import as_documents, render
from buildkit.k8s.request import K8sRequest
from buildkit.matrix.load import load_matrix
from buildkit.resources import SMOKE_DIR
from buildkit.run.job import REWARD_FILE, ImageJob, Job, JobFacts, build_job, spec_for
from tests.conftest import MATRIX, TEST_MATRIX
from tests.harness.openrlhf_standin import UPSTREAM, fork_archive, standin_repository, standin_tree, vendored
from tests.harness.upstream import sdist_member, verl_importable
from tests.test_smoke import gsm8k_generator

SHIPPED = load_matrix(MATRIX)
FACTS = JobFacts.of(SHIPPED.matrix.compat)
OPENRLHF_STACKS = {s: st for s, st in SHIPPED.matrix.stacks.items() if st.framework == "openrlhf"}
STACK_SKUS = [(s, sku) for s, st in OPENRLHF_STACKS.items() for sku in st.skus]
DIGEST = "127.0.0.1:5000/ascendkit/openrlhf@sha256:" + "cd" * 32
MODULE = "openrlhf.cli.train_ppo_ray"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin_tree(tmp_path_factory.mktemp("openrlhf") / "src")


def parse(standin: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    """The config check's own command, on this host: smoke_tests/openrlhf_args.py MODULE FLAGS..."""
    return subprocess.run(
        [sys.executable, str(SMOKE_DIR / "openrlhf_args.py"), MODULE, *flags],
        env={"PYTHONPATH": str(standin), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _image(stack_id: str) -> ImageJob:
    st = OPENRLHF_STACKS[stack_id]
    return ImageJob.of(stack_id, st)


def _smoke_job(stack_id: str, sku_id: str, nodes: int = 1, extra: tuple[str, ...] = ()) -> Job:
    image = _image(stack_id)
    return build_job(spec_for(image, "grpo", FACTS), SHIPPED.matrix.skus[sku_id], image, facts=FACTS, steps=5, nnodes=nodes, extra=extra)


def _k8s_argv(stack_id: str, sku_id: str, nodes: int, kind: str) -> list[str]:
    request = K8sRequest(
        sku_id=sku_id,
        sku=SHIPPED.matrix.skus[sku_id],
        image=DIGEST,
        nodes=nodes,
        image_job=_image(stack_id),
        facts=FACTS,
        scheduler="volcano" if kind == "volcano" else "default",
        kuberay=kind != "volcano",
    )
    (workload,) = [d for d in as_documents(render(request).text) if d["kind"] != "ConfigMap"]
    if request.kind == "Job":
        args = workload["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["bash", "-c"] and args[2].startswith("ray start --head") and args[3] == "ray-head"
        argv = args[4:]
    elif request.kind == "RayJob":
        argv = shlex.split(workload["spec"]["entrypoint"])
    else:
        head = workload["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["args"]
        argv = head[4:]
    assert argv[:3] == ["python3", "-m", MODULE]
    return [str(a) for a in argv[3:]]


# ---- the vendored upstream file ------------------------------------------------------------------------


@pytest.mark.parametrize("entry", [e for e in vendored() if "members" not in e], ids=lambda e: e["file"])
def test_each_vendored_file_is_the_recorded_upstream_file(entry: dict[str, Any]) -> None:
    data = (UPSTREAM / entry["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{entry['file']} changed: re-vendor it from {entry['repository']}"
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == entry["blob"], "git's own id of the file at that commit"
    assert len(entry["commit"]) == 40 and entry["repository"] == "https://github.com/zhuo97/OpenRLHF"


def test_the_vendored_fork_archive_holds_the_recorded_blobs_of_the_pinned_commit() -> None:
    """The archive the CPU run installs: its sha256, and each member is git's blob of that path at the commit."""
    archive = fork_archive()
    entry = next(e for e in vendored() if "members" in e)
    assert archive.name == entry["file"] and "openrlhf/cli/train_ppo_ray.py" in entry["members"]
    single = next(e for e in vendored() if e["path"] == "openrlhf/cli/train_ppo_ray.py")
    assert entry["members"]["openrlhf/cli/train_ppo_ray.py"] == single["blob"], "the archive and the vendored parser agree"


def test_the_vendored_commit_is_the_one_every_openrlhf_stack_pins() -> None:
    commits = {e["commit"] for e in vendored()}
    assert OPENRLHF_STACKS and {st.framework_source.ref for st in OPENRLHF_STACKS.values() if st.framework_source} == commits
    assert all(
        SHIPPED.matrix.repos[st.framework_source.repo].path == "zhuo97/OpenRLHF.git"
        for st in OPENRLHF_STACKS.values()
        if st.framework_source
    )


def test_the_test_stacks_source_is_made_of_that_file(tmp_path: Path) -> None:
    """The OpenRLHF-shaped test image runs this very parser: its pinned commit is the stand-in tree with the vendored file."""
    (source,) = [st.framework_source for st in load_matrix(TEST_MATRIX).matrix.stacks.values() if st.framework == "openrlhf"]
    assert source is not None
    made = standin_repository(tmp_path)
    assert source.ref == made, "tests/fixtures/test_matrix.yaml pins the commit tests/harness/openrlhf_standin.py makes"


def test_the_argument_marks_agree() -> None:
    spec = importlib.util.spec_from_file_location("openrlhf_args", SMOKE_DIR / "openrlhf_args.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.MARK == openrlhfargs.MARK


# ---- the job against the fork's parser ----------------------------------------------------------------


def _parsed(standin: Path, flags: list[str]) -> dict[str, Any]:
    done = parse(standin, flags)
    assert done.returncode == 0, done.stderr[-3000:]
    args = parse_printed_args(done.stdout)
    assert args is not None, done.stdout[-2000:]
    return args


def _assert_passes(args: dict[str, Any], sku_id: str, nodes: int) -> None:
    checks = check_args(args, npus_per_node=SHIPPED.matrix.skus[sku_id].npus_per_node, nnodes=nodes, steps=5)
    failed = [f"{c.name}: {c.detail}" for c in checks if c.status != "ok"]
    assert not failed, failed
    placed = {c.name: c.detail for c in checks}["NPU placement"]
    assert placed.startswith(f"{SHIPPED.matrix.skus[sku_id].npus_per_node * nodes} of the "), "every NPU of the job is used"


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
def test_the_smoke_job_parses_with_the_forks_own_parser(standin: Path, stack_id: str, sku_id: str) -> None:
    job = _smoke_job(stack_id, sku_id)
    args = _parsed(standin, list(job.overrides))
    _assert_passes(args, sku_id, 1)
    npus = SHIPPED.matrix.skus[sku_id].npus_per_node
    assert args["advantage_estimator"] == "group_norm" and args["n_samples_per_prompt"] == 2
    assert args["actor_num_gpus_per_node"] + args["vllm_num_engines"] * args["vllm_tensor_parallel_size"] == npus
    assert args["remote_rm_url"] == [REWARD_FILE], "OpenRLHF split the URL list itself"
    assert args["critic_pretrain"] is None, "group_norm: OpenRLHF drops the critic"
    assert args["pretrain"] == "/smoke/model" and args["use_kl_loss"] and args["colocate_actor_ref"]
    assert job.ray_npus == npus
    assert args["seed"] == 42 and args["full_determinism"] is True, "what OpenRLHF has for comparable runs (no replay)"


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
@pytest.mark.parametrize(("nodes", "kind"), [(1, "job"), (2, "kuberay"), (2, "volcano")])
def test_the_k8s_job_parses_with_the_forks_own_parser(standin: Path, stack_id: str, sku_id: str, nodes: int, kind: str) -> None:
    flags = _k8s_argv(stack_id, sku_id, nodes, kind)
    args = _parsed(standin, flags)
    _assert_passes(args, sku_id, nodes)
    assert args["actor_num_nodes"] == args["ref_num_nodes"] == nodes
    assert flags == list(_smoke_job(stack_id, sku_id, nodes).overrides), "Kubernetes runs exactly what smoke would on as many nodes"


def test_an_unknown_flag_is_refused_with_argparses_message(standin: Path) -> None:
    job = _smoke_job("openrlhf-cann8.1", "a2-box16", extra=("--vllm_num_engins=2",))
    done = parse(standin, list(job.overrides))
    assert done.returncode == 2
    assert done.stderr.rstrip().splitlines()[-1] == "train_ppo_ray.py: error: unrecognized arguments: --vllm_num_engins=2"


def test_upstreams_dotted_flags_are_not_the_forks(standin: Path) -> None:
    """From upstream 0.10.2 the flags are dotted (--algo.advantage.estimator); the fork's 0.7.5 parser knows only flat ones."""
    done = parse(standin, [*_smoke_job("openrlhf-cann8.1", "a2-box16").overrides, "--algo.advantage.estimator=group_norm"])
    assert done.returncode == 2 and "unrecognized arguments: --algo.advantage.estimator=group_norm" in done.stderr


def test_the_forks_own_assertion_speaks(standin: Path) -> None:
    done = parse(standin, [*_smoke_job("openrlhf-cann8.1", "a2-box16").overrides, "--n_samples_per_prompt=1"])
    assert done.returncode == 1
    assert "AssertionError: group_norm requires n_samples_per_prompt > 1" in done.stderr
    done = parse(standin, [*_smoke_job("openrlhf-cann8.1", "a2-box16").overrides, "--micro_rollout_batch_size=64"])
    assert done.returncode == 1 and "The number of sample batches must be greater than or equal to" in done.stderr


def test_what_only_ray_would_find_is_found_before_it(standin: Path) -> None:
    """Accepted by the parser, refused by ascendkit's checks: each would have held the NPUs for nothing."""
    base = list(_smoke_job("openrlhf-cann8.1", "900-podc").overrides)
    cases = {
        "--vllm_num_engines=8": "NPU placement",  # 4 + 8 > 8 NPUs: the placement group waits forever
        "--colocate_all_models": "hybrid engine",  # not supported on NPU by the fork
        "--micro_train_batch_size=3": "batch split",  # DeepSpeed refuses 16 = 3 x 4 x ...
        "--ref_num_gpus_per_node=2": "colocation",  # train() asserts it after ray.init
        "--max_samples=100": "steps",  # 100 // 8 = 12 steps, not 5
    }
    for flag, failing in cases.items():
        checks = check_args(_parsed(standin, [*base, flag]), npus_per_node=8, nnodes=1, steps=5)
        assert [c.name for c in checks if c.status == "error"] == [failing], (flag, checks)


# ---- the data the job reads, the reward it is scored with ---------------------------------------------


def test_the_generated_columns_are_the_ones_the_parsed_job_reads(standin: Path) -> None:
    args = _parsed(standin, list(_smoke_job("openrlhf-cann8.1", "a2-box16").overrides))
    job = _smoke_job("openrlhf-cann8.1", "a2-box16")
    row = gsm8k_generator().rows("train", 1, 0, job.data_format)[0]
    chat = row[args["input_key"]]
    assert args["apply_chat_template"] and [m["role"] for m in chat] == ["user"], "a chat the tokenizer's template takes"
    assert isinstance(row[args["label_key"]], str) and row[args["label_key"]].lstrip("-").isdigit()
    assert args["prompt_data"].endswith(".parquet"), "OpenRLHF loads a local file by its extension"


def _reward() -> Any:
    spec = importlib.util.spec_from_file_location("gsm8k_reward", SMOKE_DIR / "gsm8k_reward.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _qwen_query(question: str, response: str) -> tuple[str, str]:
    """(query, prompt) as OpenRLHF hands them to reward_func: Qwen's chat template, left padding, special tokens kept."""
    prompt = f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return "<|endoftext|>" * 3 + prompt + response + "<|im_end|>", prompt


def test_the_reward_scores_as_verls_gsm8k_rule_does() -> None:
    """Worked answers 1, a wrong final number 0, no answer 0: the verdicts of verl's own gsm8k scorer."""
    reward = _reward()
    rows = gsm8k_generator().rows("train", 64, 0, "openrlhf-rl")
    answers = gsm8k_generator().rows("train", 64, 0)
    with verl_importable("0.6.1"):
        gsm8k = importlib.import_module("verl.utils.reward_score.gsm8k")
        for row, worked in zip(rows, answers, strict=True):
            answer, label = worked["extra_info"]["answer"], row["label"]
            for response in (answer, answer.rsplit("####", 1)[0] + f"#### {int(label) + 1}", "I do not know."):
                query, prompt = _qwen_query(row["prompt"][0]["content"], response)
                ours = reward.score(query, prompt, label)
                assert ours == float(gsm8k.compute_score(response, label)), (response, label)
            assert reward.score(*_qwen_query(row["prompt"][0]["content"], answer), label) == 1.0
    query, prompt = _qwen_query("Q", "#### 1,234")
    assert reward.score(query, prompt, "1234") == 1.0, "thousands separators dropped, as gsm8k's preprocessing drops them"
    # a short right answer in a micro-batch with a long response: OpenRLHF right-pads it, special tokens kept
    query, prompt = _qwen_query("Q", "#### 42")
    assert reward.score(query + "<|endoftext|>" * 900, prompt, "42") == 1.0, "the padding after a response is not its tail"
    # the prompt itself names "####": only the response counts
    assert reward.score(*_qwen_query('output the final answer after "#### 5"', "no answer"), "5") == 0.0


# ---- the patch against the source it changes ----------------------------------------------------------


@pytest.mark.parametrize(("stack_id", "index"), [(s, i) for s, st in OPENRLHF_STACKS.items() for i in range(len(st.patches))])
def test_each_patch_line_stands_once_in_the_pinned_source(stack_id: str, index: int) -> None:
    """The line the matrix comments out is in the pinned release exactly once (the file of the
    release's sdist from PyPI, vendored: tests/harness/upstream.py)."""
    stack = OPENRLHF_STACKS[stack_id]
    patch = stack.patches[index]
    pin = next(p for c, p in stack.pins().items() if (p.package or c.replace("_", "-")) == patch.package)
    lines = sdist_member(patch.package, pin.version, patch.file).splitlines()
    assert [line.strip() for line in lines].count(patch.comment_out.strip()) == 1


def test_the_k8s_pods_carry_the_reward_file_the_job_names() -> None:
    request = K8sRequest(
        sku_id="a2-box16", sku=SHIPPED.matrix.skus["a2-box16"], image=DIGEST, nodes=2, image_job=_image("openrlhf-cann8.1"), facts=FACTS
    )
    configmap, _ = as_documents(render(request).text)
    assert configmap["data"]["gsm8k_reward.py"] == (SMOKE_DIR / "gsm8k_reward.py").read_text()
    assert json.dumps(configmap).count("gsm8k_synth.py") >= 1
