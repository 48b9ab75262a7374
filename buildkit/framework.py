"""What an RL framework is to ascendkit, and where each one's plug-in is found.

A framework (verl, OpenRLHF, ...) is one package of :mod:`buildkit.frameworks` whose ``FRAMEWORK``
is an instance of :class:`Framework`: its stack stanza (``verl: {version}``, ``openrlhf: {repo, ref,
...}``), its matrix rules, its smoke jobs and how their arguments look, how its job is checked in
the image before it trains, and the gate its logs are judged by. Everything else in ascendkit asks
this registry; no other module decides anything by a framework's name. Adding one is a package under
``buildkit/frameworks/``, its job files in ``smoke_tests/`` and its stanzas in the matrix.

The registry imports the plug-ins by name when first asked (a plug-in builds on the layers below
it, which ask for it back only through this interface: the usual plug-in inversion).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from buildkit.errors import InputError
from buildkit.violation import Violation

if TYPE_CHECKING:  # type-only: a plug-in's hooks take the matrix's and doctor's types
    from collections.abc import Callable, Iterator

    from buildkit.doctor.base import Check
    from buildkit.matrix.model import Compat, Matrix, Stack

PLUGINS = "buildkit.frameworks"
Install = Literal["index", "checkout"]  # a release from the package index, or a git checkout built in the image
Arguments = Literal["hydra", "flags"]  # Hydra overrides KEY=VALUE, or the entry point's own --flags
CheckStyle = Literal["hydra", "parser"]  # Hydra composes the config (--cfg job), or the framework's parser runs
UNLABELLED = "verl"  # the framework of images built before they carried the framework label: their only one then


@dataclass(frozen=True)
class Gate:
    """What one framework's job logs, and what it is held to against a baseline run."""

    job: str  # "<framework> <job>": "verl grpo", "openrlhf grpo", "verl sft"
    reward: str | None  # judged in [0, 1]; None for jobs without a reward
    losses: tuple[str, ...]  # its loss metric; the first both runs have
    throughput: str | None
    reward_tolerance: float
    loss_tolerance: float

    @property
    def marker(self) -> str:
        """The metric that tells this job's log from the others'."""
        return self.reward or self.losses[0]


@dataclass(frozen=True)
class CheckContext:
    """What a framework's config check knows of the job besides what the framework printed."""

    job: str
    version: str | None  # the framework's release in the image, when known
    compat: Compat
    npus_per_node: int
    nnodes: int
    steps: int


class ReplayUnavailable(InputError):
    """A framework, or this release of it, cannot replay rollouts (or not the way asked); the message says why."""


@dataclass(frozen=True)
class ReplayEvidence:
    """What a run's log says it did at each rollout: read a dump, or generate its own."""

    loaded: tuple[str, ...]  # where each read came from (a path, or a step)
    missed: tuple[str, ...]

    def verdict(self, steps: int) -> str | None:
        """None when every step replayed; else what went wrong, in words."""
        if self.missed:
            return f"the run found no dump for {len(self.missed)} rollout(s) ({', '.join(self.missed[:3])}) and generated its own"
        if len(self.loaded) < steps:
            return f"the run read a dump for {len(self.loaded)} of {steps} steps; the rest never reached replay"
        return None


class Replay:
    """How one release of a framework dumps a run's rollouts and replays them in another run (docs/smoke.md,
    "Precision alignment"). Both runs append the same :meth:`overrides`; each side sets :meth:`env`."""

    def steps(self, steps: int | None) -> int:
        """The steps a replay runs: ``steps`` (None: the release's default), or refused (ReplayUnavailable) beyond
        what the release replays soundly."""
        return 5 if steps is None else steps

    def overrides(self, steps: int, dump_dir: str) -> tuple[str, ...]:
        raise NotImplementedError

    def env(self, side: Literal["gpu", "npu"], expansion_mode: str | None) -> dict[str, str]:
        """The deterministic environment of ``side`` (``expansion_mode``: the image's HCCL_OP_EXPANSION_MODE)."""
        raise NotImplementedError

    def evidence(self, lines: list[str]) -> ReplayEvidence:
        """Where the log says the run read a dump and where it generated instead."""
        raise NotImplementedError


class Framework:
    """One RL framework. A plug-in subclasses this, sets the class attributes and overrides the hooks
    whose default does not fit."""

    name: ClassVar[str]  # the stack's key in the matrix, its images' label, tag prefix and repository
    title: ClassVar[str]  # as people write it: "verl", "OpenRLHF"
    install: ClassVar[Install]  # the stanza: an index pin {version, ...} or a checkout {repo, ref, version, requirements}
    jobs: ClassVar[tuple[str, ...]]  # its smoke jobs (smoke --job), each with a job file in smoke_tests/
    arguments: ClassVar[Arguments]  # how --override values look
    check_style: ClassVar[CheckStyle]  # how the config check runs in the image
    rollouts: ClassVar[tuple[str, ...]] = ("vllm", "sglang")  # the rollout engines its images may carry
    splits_nodes: ClassVar[bool] = False  # its GRPO job puts the actor on a share of each node (the job file's actor_share)
    gates: ClassVar[tuple[Gate, ...]]  # one per job

    def job_file(self, job: str, version: str | None, compat: Compat) -> str:
        """The file of ``smoke_tests/`` that serves ``job`` in an image of this release."""
        return f"{self.name}_{job}_smoke.yaml"

    def job_overrides(self, job: str, version: str | None, compat: Compat) -> tuple[str, ...]:
        """What the job appends for this release before the user's overrides (verl: the NPU device)."""
        return ()

    def override_error(self, item: str) -> str | None:
        """Why ``--override item`` is not an argument of this framework, or None."""
        if self.arguments == "flags" and not (item.startswith("--") and len(item) > 2):
            return f"this image runs {self.title}, whose arguments are flags: e.g. --override=--seed=7"
        if self.arguments == "hydra" and ("=" not in item or item.startswith("-")):
            return f"this image runs {self.title}, whose arguments are Hydra overrides KEY=VALUE"
        return None

    def check_argv(self, module: str, arguments: tuple[str, ...]) -> list[str]:
        """The job's module and arguments run only as far as the framework's own checks go (in the
        ``hydra`` style, Hydra composes the config and prints it: ``--cfg job``)."""
        if self.check_style != "hydra":
            raise NotImplementedError(f"{self.name}: a {self.check_style!r} config check names its own command")
        return ["python3", "-m", module, "--cfg", "job", *arguments]

    def refusal(self, lines: list[str], code: int) -> str:
        """Why the config check exited ``code``, from the framework's own last words."""
        return f"{self.title} refused the job (exit {code}): " + (" | ".join(lines[-3:]) or "no output")

    def config_checks(self, printed: str, context: CheckContext) -> tuple[list[Check], str] | str:
        """The checks of what the config check printed, and the text to keep; or why nothing usable was printed."""
        return [], printed

    def rules(self) -> dict[str, Callable[[Matrix], Iterator[Violation]]]:
        """Its matrix rules by rule id (run after the matrix's own), each over the stacks of this framework."""
        return {}

    def gate(self, job: str) -> Gate:
        return next(g for g in self.gates if g.job == f"{self.name} {job}")

    def replay(self, version: str | None) -> Replay:
        """How this release replays rollouts; refused (ReplayUnavailable), with the reason, where it cannot."""
        raise ReplayUnavailable(f"{self.title} has no rollout replay: compare its runs by the seeds' rule or against an earlier NPU run")


@functools.cache
def frameworks() -> dict[str, Framework]:
    """Every plug-in by name: the packages of :mod:`buildkit.frameworks`, in name order."""
    package = importlib.import_module(PLUGINS)
    found: dict[str, Framework] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{PLUGINS}.{info.name}")
        found[info.name] = checked(getattr(module, "FRAMEWORK", None), f"{module.__name__}.FRAMEWORK", info.name)
    return found


def checked(plugin: object, where: str, name: str) -> Framework:
    """A plug-in as the registry takes it: a Framework named for its package, with a gate for every
    smoke job (found when ascendkit starts, not after a job trained and had nothing to be judged by)."""
    if not isinstance(plugin, Framework) or plugin.name != name:
        raise TypeError(f"{where} must be a Framework named {name!r}")
    ungated = [job for job in plugin.jobs if not any(g.job == f"{name} {job}" for g in plugin.gates)]
    if ungated:
        raise TypeError(
            f"{where}: no gate for its {', '.join(ungated)} smoke job (gates: {', '.join(g.job for g in plugin.gates) or 'none'})"
        )
    return plugin


def framework(name: str) -> Framework:
    """The plug-in named ``name``; an unknown name is the user's input, refused with the names there are."""
    known = frameworks()
    plugin = known.get(name)
    if plugin is None:
        close = difflib.get_close_matches(name, known, n=1)
        raise InputError(
            f"no framework {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + f"; frameworks: {', '.join(known)}"
        )
    return plugin


def title_of(name: str) -> str:
    """What people call the framework ``name``; the name itself when no plug-in has it (an image's label)."""
    plugin = frameworks().get(name)
    return plugin.title if plugin is not None else name


def all_gates() -> tuple[Gate, ...]:
    """Every job's gate, the frameworks in name order."""
    return tuple(g for plugin in frameworks().values() for g in plugin.gates)


def framework_of(stack: Stack) -> Framework:
    """The plug-in of the framework a stack's images carry."""
    return framework(stack.framework)
