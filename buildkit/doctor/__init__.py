"""`ascendkit doctor`: is this image (or host) ready to train on its Ascend NPUs?

Standard library only, so it runs inside every image without adding packages to the training
environment: the image carries this package as a directory (``python3 /usr/local/lib/ascendkit/doctor``,
behind a small `ascendkit` wrapper) and its modules import one another relatively, never the rest of
``buildkit``. torch and torch_npu are imported only when NPUs are present. The rooms:

    base       the Check type, where doctor looks (Environment) and the paths and exit codes others import
    software   what the image installed: exact pins, the CANN environment, torch_npu and a matmul
    host       what the node brings: driver and firmware, device access, NPU links and hccn.conf, zstd pulls
    codes      the HCCL, HCCP and ACL error-code explainer (error_codes.json beside it)
    report     every check in order, the report and the command line

Exit codes:

    0   every check passed (NPUs present and working)
    1   a check failed
    10  no Ascend devices here: the preflight checks passed, the NPU checks were not run
"""
