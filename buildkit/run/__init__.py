"""Run a built image: the in-image doctor, the GRPO smoke job, its devices, config check and report."""

from typing import Literal

SmokeJob = Literal["grpo", "sft"]  # the smoke jobs `smoke --job` runs (verl has both, OpenRLHF grpo)
