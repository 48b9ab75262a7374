"""Part of ascendkit's CPU-run stand-in for torch_npu (see torch_npu/__init__.py).

The real module redirects torch.cuda calls to torch.npu; with no NPU there is nothing to redirect to,
so this one does nothing, and a CUDA call made before the boundary fails as it would without a device.
"""
