"""Part of ascendkit's CPU-run stand-in for torch_npu (see torch_npu/__init__.py): empty."""
