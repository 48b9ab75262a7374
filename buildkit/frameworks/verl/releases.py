"""Which verl release does what by itself: the facts of ``compat`` that decide a job's file and arguments."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

DEVICE_OVERRIDE = "trainer.device=npu"


def older(version: str | None, than: str) -> bool:
    """An unknown or unparsable release counts as older: the override it gets is what a newer one
    would choose by itself, so passing it is never wrong on an Ascend node."""
    if version is None:
        return True
    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return True


def needs_device_override(verl: str | None, first_autodetect: str) -> bool:
    """True unless the image's verl switches ``trainer.device`` to npu by itself."""
    return older(verl, first_autodetect)
