"""Run a built image: the in-image doctor, the GRPO smoke job, its devices, config check and report."""
