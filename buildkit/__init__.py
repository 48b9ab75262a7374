"""ascendkit: build, verify and ship verl-on-Ascend container images from one compatibility matrix."""

__version__ = "0.1.0"
