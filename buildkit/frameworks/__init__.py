"""The RL frameworks ascendkit builds images for, one plug-in package each (see :mod:`buildkit.framework`)."""
