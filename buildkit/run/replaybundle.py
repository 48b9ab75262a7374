"""A replay bundle: the GPU side of a deterministic replay, as a directory that travels to the NPU host.

``ascendkit baseline replay`` writes its plan (``replay.json``: the stack, SKU and verl release it is for, the names
both runs share, the GPU command and environment) and ``run.sh``, the exact GPU run: it needs bash and the GPU
machine's verl, nothing of ascendkit. The run leaves, beside them, verl's composed config (``config.yaml``), the
versions it ran with (``versions.json``: verl, vLLM, torch, transformers, the GPUs), its log (``run.log``), the data
it trained on (``data/``) and verl's rollout dumps (``dump/``). ``ascendkit baseline seal`` checks all of that and
writes ``manifest.json``, the sha256 of every file; ``smoke --baseline BUNDLE`` refuses a bundle whose files are not
the ones sealed. No secret is in any of it: the environment is the composed one, and the model is named by path.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from buildkit.accuracy.metrics import StepMetrics, parse_log
from buildkit.errors import InputError
from buildkit.fsio import output_dir, read_input_text, sha256_of, write_all_atomic, write_atomic
from buildkit.resources import SMOKE_DIR
from buildkit.run.replay import NAME_KEYS, ReplaySides, dump_names

BUNDLE_FORMAT = "ascendkit-replay/1"
PLAN, SCRIPT, MANIFEST = "replay.json", "run.sh", "manifest.json"
LOG, CONFIG, VERSIONS = "run.log", "config.yaml", "versions.json"
DUMP, DATA, TOOLS = "dump", "data", "tools"
GENERATOR = "gsm8k_synth.py"
HERE, MODEL = "@BUNDLE@", "@MODEL@"  # in the composed GPU command; run.sh makes them shell variables
RUN_FILES = (CONFIG, VERSIONS, LOG)


@dataclass(frozen=True)
class ReplayPlan:
    framework: str
    version: str
    stack: str
    sku: str
    gpus: int
    steps: int
    names: dict[str, str]
    command: tuple[str, ...]  # launcher and module
    overrides: tuple[str, ...]  # with @BUNDLE@ and @MODEL@ where the GPU machine's paths go
    env: dict[str, str]
    train_rows: int
    data_format: str

    @classmethod
    def of(cls, sides: ReplaySides, *, stack: str, sku: str, version: str) -> ReplayPlan:
        gpu = sides.gpu
        return cls(
            gpu.framework, version, stack, sku, sides.gpus, sides.steps, dump_names(gpu), gpu.command, gpu.overrides, dict(gpu.env),
            gpu.train_rows, gpu.data_format,
        )  # fmt: skip

    def document(self) -> dict[str, Any]:
        return {"format": BUNDLE_FORMAT, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}}

    @classmethod
    def read(cls, path: Path) -> ReplayPlan:
        try:
            data = json.loads(read_input_text(path, "replay plan"))
        except ValueError as exc:
            raise InputError(f"{path}: not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
            raise InputError(f"{path}: not an ascendkit replay plan (format {BUNDLE_FORMAT!r})")
        try:
            plan = cls(
                str(data["framework"]), str(data["version"]), str(data["stack"]), str(data["sku"]), int(data["gpus"]), int(data["steps"]),
                {str(k): str(v) for k, v in data["names"].items()}, tuple(map(str, data["command"])), tuple(map(str, data["overrides"])),
                {str(k): str(v) for k, v in data["env"].items()}, int(data["train_rows"]), str(data["data_format"]),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{path}: a field is missing or of the wrong type: {exc}") from None
        if set(plan.names) != set(NAME_KEYS):
            raise InputError(f"{path}: names: expected {', '.join(NAME_KEYS)}")
        return plan


def _shell_word(text: str) -> str:
    """One shell word, the bundle's and the model's paths left to the script's variables."""
    quoted = shlex.quote(text)
    for sentinel, variable in ((HERE, "$BUNDLE"), (MODEL, "$MODEL")):
        if sentinel in text:
            quoted = quoted.replace(sentinel, f"'\"{variable}\"'") if quoted.startswith("'") else quoted.replace(sentinel, f'"{variable}"')
    return quoted


def run_script(plan: ReplayPlan) -> str:
    """The GPU run, as bash: the environment, the data, verl's composed config, the versions, then the run itself."""
    args = " \\\n  ".join(_shell_word(o) for o in plan.overrides)
    command = " ".join(shlex.quote(c) for c in plan.command)
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    return f"""#!/usr/bin/env bash
# The GPU side of an ascendkit replay (written by `ascendkit baseline replay`; do not edit: the NPU run is composed to
# match it). verl {plan.version}, {plan.gpus} GPU(s) per node, {plan.steps} step(s), for stack {plan.stack} on {plan.sku}.
# Run it on the GPU machine, with verl {plan.version} installed:   MODEL=/path/to/the/model bash run.sh
# Then, anywhere:   ascendkit baseline seal THIS_DIRECTORY --model /path/to/the/model
set -euo pipefail
BUNDLE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
MODEL="${{MODEL:?set MODEL to the model directory (the NPU run must use the same weights)}}"
{exports}
if [ ! -f "$BUNDLE/{DATA}/train.parquet" ]; then
  python3 "$BUNDLE/{TOOLS}/{GENERATOR}" --out "$BUNDLE/{DATA}" --train {plan.train_rows} --format {plan.data_format}
fi
ARGS=(
  {args}
)
{command} --cfg job "${{ARGS[@]}}" > "$BUNDLE/{CONFIG}"
python3 - > "$BUNDLE/{VERSIONS}" <<'PY'
import importlib.metadata as metadata, json, subprocess
found = {{}}
for name in ("verl", "vllm", "torch", "transformers", "sglang"):
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
try:
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    found["gpus"] = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()
except (OSError, subprocess.CalledProcessError):
    found["gpus"] = []
print(json.dumps(found, indent=2, sort_keys=True))
PY
{command} "${{ARGS[@]}}" 2>&1 | tee "$BUNDLE/{LOG}"
"""


def write_bundle(out: Path, plan: ReplayPlan, data: Path | None = None) -> list[Path]:
    """The bundle's first files, in a new (or empty) directory: the plan, the script, and the data or its generator."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"{out}: a bundle goes into a new or empty directory (nothing of what is there is overwritten)")
    written = [out / PLAN, out / SCRIPT]
    with output_dir(out, "bundle directory"):
        files: list[tuple[Path, str | bytes]] = [
            (out / PLAN, json.dumps(plan.document(), indent=2, sort_keys=True) + "\n"),
            (out / SCRIPT, run_script(plan)),
        ]
        if data is None:
            (out / TOOLS).mkdir(exist_ok=True)
            files.append((out / TOOLS / GENERATOR, (SMOKE_DIR / GENERATOR).read_bytes()))
        else:
            (out / DATA).mkdir(exist_ok=True)
            files += [(out / DATA / name, (data / name).read_bytes()) for name in ("train.parquet", "test.parquet")]
        write_all_atomic(files)
        (out / SCRIPT).chmod(0o755)
    return written + [path for path, _ in files[2:]]


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def _model_hashes(model: Path) -> dict[str, str]:
    if not model.is_dir():
        raise InputError(f"--model {model}: not a directory")
    return {p.relative_to(model).as_posix(): sha256_of(p) for p in sorted(model.rglob("*")) if p.is_file()}


def seal(bundle: Path, model: Path | None = None) -> dict[str, Any]:
    """Check a run's bundle and write its manifest; returns it. Every refusal names what is missing or wrong."""
    plan = ReplayPlan.read(bundle / PLAN)
    missing = [name for name in (*RUN_FILES, f"{DATA}/train.parquet") if not (bundle / name).is_file()]
    if missing:
        raise InputError(f"{bundle}: no {', '.join(missing)}: has run.sh run there to its end?")
    steps = parse_log(read_input_text(bundle / LOG, "run log", errors="replace").splitlines())
    if len(steps) < plan.steps:
        raise InputError(f"{bundle / LOG}: {len(steps)} step line(s) of the {plan.steps} the run was to log (did it stop early?)")
    dumped = [f for f in _files(bundle) if f.startswith(f"{DUMP}/")]
    if not dumped:
        raise InputError(f"{bundle / DUMP}: verl wrote no rollout dump there (the run must run with the plan's replay keys)")
    composed = _names_in(_printed_config(bundle / CONFIG))
    wrong = [f"{k}: composed {composed.get(k)!r}, planned {v!r}" for k, v in plan.names.items() if composed.get(k) not in (v, None)]
    if wrong:
        raise InputError(f"{bundle / CONFIG}: verl composed other names than the plan's: {'; '.join(wrong)}")
    try:
        versions = json.loads((bundle / VERSIONS).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"{bundle / VERSIONS}: not JSON: {exc}") from None
    if versions.get("verl") not in (plan.version, None):
        raise InputError(f"{bundle / VERSIONS}: the GPU run had verl {versions.get('verl')}, the plan is for {plan.version}")
    manifest = {
        "format": BUNDLE_FORMAT,
        "steps": len(steps),
        "versions": versions,
        "files": {name: sha256_of(bundle / name) for name in _files(bundle)},
        "model": _model_hashes(model) if model is not None else None,
    }
    write_atomic(bundle / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _printed_config(path: Path) -> Any:
    """The config verl printed with --cfg job (import noise before it skipped)."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_][A-Za-z0-9_]*:( |$)", line)), None)
    if start is None:
        raise InputError(f"{path}: verl printed no config (run.sh runs `--cfg job` first; did it fail?)")
    try:
        return yaml.safe_load("\n".join(lines[start:])) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not the YAML verl prints: {exc}") from None


def _names_in(config: Any) -> dict[str, str]:
    """The plan's names as verl composed them (config.yaml: its printed config, after any noise before it)."""
    found: dict[str, str] = {}
    for name, key in NAME_KEYS.items():
        node = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            found[name] = str(node)
    return found


@dataclass(frozen=True)
class Bundle:
    root: Path
    plan: ReplayPlan
    steps: list[StepMetrics]
    manifest: dict[str, Any]

    @property
    def dump(self) -> Path:
        return self.root / DUMP

    @property
    def data(self) -> Path:
        return self.root / DATA


def is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / PLAN).is_file()


def load_bundle(root: Path) -> Bundle:
    """A sealed bundle, every file checked against its manifest (none missing, none changed, none added)."""
    plan = ReplayPlan.read(root / PLAN)
    if not (root / MANIFEST).is_file():
        raise InputError(f"{root}: not sealed (no {MANIFEST}): run `ascendkit baseline seal {root}` after the GPU run")
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"{root / MANIFEST}: not JSON: {exc}") from None
    recorded: dict[str, str] = manifest.get("files", {})
    present = _files(root)
    problems = [f"{name}: missing" for name in sorted(set(recorded) - set(present))]
    problems += [f"{name}: not in the manifest" for name in sorted(set(present) - set(recorded))]
    changed = [name for name in sorted(set(recorded) & set(present)) if sha256_of(root / name) != recorded[name]]
    problems += [f"{name}: changed since it was sealed" for name in changed]
    if problems:
        raise InputError(f"{root}: the bundle is not as sealed: " + "; ".join(problems[:5]))
    steps = parse_log((root / LOG).read_text(encoding="utf-8", errors="replace").splitlines())
    return Bundle(root, plan, steps, manifest)


def model_mismatch(bundle: Bundle, model: Path) -> str | None:
    """Why ``model`` is not the weights the GPU run used, or None (also when the bundle recorded none)."""
    recorded = bundle.manifest.get("model")
    if not recorded:
        return None
    here = _model_hashes(model)
    differing = sorted(k for k in set(recorded) | set(here) if recorded.get(k) != here.get(k))
    return f"--model-path {model}: not the GPU run's weights ({', '.join(differing[:3])} differ)" if differing else None
