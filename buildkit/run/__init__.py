"""Run a built image: the in-image doctor, the GRPO smoke job, its devices, config check and report."""

from typing import Literal

SmokeJob = Literal["grpo", "sft"]  # the smoke jobs `smoke --job` runs (verl has both, OpenRLHF grpo)
# Bounds on numbers: far past any real run, near enough that a typo is caught rather than obeyed.
MAX_STEPS = 100_000
MAX_SECONDS = 30 * 24 * 3600
