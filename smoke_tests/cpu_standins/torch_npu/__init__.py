"""ascendkit's CPU-run stand-in for torch_npu: NOT torch_npu, and it provides no device.

torch_npu needs CANN's runtime and the host's NPU driver to load, so a CPU run (``ascendkit smoke --cpu``,
``make cpu-run``) cannot import the real one. The Ascend fork of OpenRLHF decides its whole code path at
import time by whether ``torch_npu`` can be found (``openrlhf/__init__.py``: ``ACCELERATOR_TYPE = "NPU"``,
then ``import torch_npu`` and ``from torch_npu.contrib import transfer_to_npu``); without one it takes its
CUDA path and imports flash_attn, which its NPU images do not have. This stand-in, first on PYTHONPATH
during a CPU run only, lets the fork take the path its image takes. It patches nothing: torch.npu does not
exist, so anything that would need the device fails as it would on a host without one. The CPU report
lists torch_npu as replaced by this stand-in.
"""

ASCENDKIT_STANDIN = True
__version__ = "0+ascendkit.cpu.standin"
