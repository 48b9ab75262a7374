"""What makes two clean builds of the same inputs publish the same bytes: every time a layer's tar
headers carry, clamped to the image's epoch, and the config's times with them.

The engine writes each file's mtime as the moment the build wrote it; no engine users run clamps it
(Docker 26's BuildKit refuses ``rewrite-timestamp`` with the containerd store and ignores it with
overlay2; the classic builder has no such option). Publishing already streams every layer out of the
engine into its compressors, so the clamp happens there, on every engine and builder alike: each
header's mtime (and a PAX record's mtime, atime, ctime) later than the epoch becomes the epoch, its
checksum is written again, and nothing else changes: not a name, a mode, an owner, an xattr, a
file's bytes or the order. The base's own layers are never touched (they keep the digests every
image of that base shares). The config follows: its DiffIDs are the clamped layers', its times are
clamped, and what the classic builder records of its build container (``container``,
``container_config``, the parent image in ``config.Image``) is dropped.

What the build itself must make the same (the bytes of files: hash-based pycs, no installer
timestamps, no logs) is the template's job (templates/partials/, buildkit/image/files/build-env.sh).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from buildkit.plan.layers import EPOCH_LABEL

# Bump when what is clamped changes: it keys the compression cache, so an older rule is never served.
RULES = 1
BLOCK = 512

# The classic builder's record of its build container: its ID and hostname, and the parent image (an
# intermediate image whose ID depends on the layers before it). BuildKit writes none of them.
DROPPED_CONFIG_KEYS = ("container", "container_config")


@dataclass(frozen=True)
class Normalization:
    """Clamp times to ``epoch`` in every layer after the first ``keep`` (the base's)."""

    epoch: int
    keep: int

    @property
    def key(self) -> str:
        return f"repro{RULES}-{self.epoch}"

    @property
    def created(self) -> str:
        return datetime.fromtimestamp(self.epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def describe(self) -> dict[str, Any]:
        return {
            "source_date_epoch": self.epoch,
            "created": self.created,
            "base_layers_kept": self.keep,
            "rules": RULES,
            "changed": "file mtimes (and PAX atime/ctime) later than the epoch clamped in every layer above the base; the "
            "config's created and history times clamped, its layers' DiffIDs those of the clamped layers, and the classic "
            "builder's container, container_config and config.Image dropped. Nothing else: names, modes, owners, xattrs, "
            "contents and order are the engine's",
        }


def epoch_of(labels: dict[str, str]) -> int | None:
    """The epoch an image was built with, from its label; None for an image built without one."""
    value = labels.get(EPOCH_LABEL, "")
    return int(value) if value.isdigit() else None


# ---- a layer's tar, streamed ------------------------------------------------------------------------


def _number(field: bytes) -> int:
    """A tar header's numeric field: octal text, or GNU base-256 (first byte's high bit set)."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
        return value - (1 << (8 * len(field) - 1)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _checksummed(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _pax_records(data: bytes, epoch: int) -> bytes:
    """A PAX header's records with every time later than ``epoch`` clamped; the rest as it was."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        pos += length
        key, _, value = record.rstrip(b"\n").partition(b"=")
        if key in (b"mtime", b"atime", b"ctime"):
            seconds = value.split(b".", 1)[0]
            if seconds.lstrip(b"-").isdigit() and (int(seconds) > epoch or (int(seconds) == epoch and value != seconds)):
                value = str(epoch).encode()
        body = b" " + key + b"=" + value + b"\n"
        size = len(body) + 1
        while len(str(size)) + len(body) != size:  # the length counts its own digits
            size = len(str(size)) + len(body)
        out += str(size).encode() + body
    return bytes(out)


class TarClamp:
    """A layer's tar in, pieces of any size; the same tar out with its times clamped, into ``out``.
    File contents pass through untouched (as views of what came in); only headers are rewritten."""

    def __init__(self, epoch: int, out: Callable[[bytes | memoryview], None]) -> None:
        self.epoch, self.out = epoch, out
        self.head = bytearray()  # a header being gathered (a PAX header: with its records)
        self.need = BLOCK
        self.passthrough = 0  # bytes of file data (with padding) to pass as they are
        self.clamped = 0  # headers whose times were clamped

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self.passthrough:
                n = min(self.passthrough, end - pos)
                self.out(view[pos : pos + n])
                pos += n
                self.passthrough -= n
                continue
            take = min(self.need - len(self.head), end - pos)
            self.head += view[pos : pos + take]
            pos += take
            if len(self.head) == self.need:
                self._header()

    def _header(self) -> None:
        header = self.head
        if self.need == BLOCK and not any(header):  # an end-of-archive block
            self.out(bytes(header))
            self.head = bytearray()
            return
        size = _number(bytes(header[124:136]))
        padded = -(-size // BLOCK) * BLOCK
        kind = bytes(header[156:157])
        if kind in (b"x", b"g"):
            if self.need == BLOCK:  # gather its records first
                self.need = BLOCK + padded
                if padded:
                    return
            records = _pax_records(bytes(header[BLOCK : BLOCK + size]), self.epoch)
            first = bytearray(header[:BLOCK])
            if records != bytes(header[BLOCK : BLOCK + size]):
                self.clamped += 1
                first[124:136] = b"%011o\0" % len(records)
            self._mtime(first)
            self.out(_checksummed(first) + records + b"\0" * (-len(records) % BLOCK))
            self.head, self.need = bytearray(), BLOCK
            return
        first = bytearray(header)
        if self._mtime(first):
            self.clamped += 1
        self.out(_checksummed(first))
        self.head = bytearray()
        self.passthrough = padded if kind not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0

    def _mtime(self, header: bytearray) -> bool:
        if _number(bytes(header[136:148])) <= self.epoch:
            return False
        header[136:148] = b"%011o\0" % self.epoch
        return True

    def close(self) -> None:
        """Whatever followed the archive (nothing, in a layer) goes out as it came."""
        if self.head:
            self.out(bytes(self.head))
            self.head = bytearray()


def clamp_tar(data: bytes, epoch: int) -> bytes:
    """A whole tar's bytes, clamped (tests and small layers)."""
    parts: list[bytes] = []
    clamp = TarClamp(epoch, lambda piece: parts.append(bytes(piece)))
    clamp.write(data)
    clamp.close()
    return b"".join(parts)


# ---- the config -------------------------------------------------------------------------------------


_TIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def _seconds(value: str) -> float | None:
    """An RFC 3339 time as Go writes it (nanoseconds, Z or an offset) in seconds since the epoch."""
    found = _TIME.match(value)
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in found.groups()[:6])
    zone = found.group(8) or "Z"
    offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc).timestamp() - offset
    return moment + float(found.group(7) or 0)


def _clamped_time(value: object, normalization: Normalization) -> object:
    if not isinstance(value, str):
        return value
    seconds = _seconds(value)
    if seconds is None or seconds > normalization.epoch:  # an unreadable time says nothing worth keeping
        return normalization.created
    return value


def normalize_config(config: bytes, diff_ids: Sequence[str], normalization: Normalization) -> bytes:
    """The engine's config with the clamped layers' DiffIDs and times, without the classic builder's
    record of its container; written compactly, keys in the engine's order."""
    data = json.loads(config)
    for key in DROPPED_CONFIG_KEYS:
        data.pop(key, None)
    inner = data.get("config")
    if isinstance(inner, dict) and inner.get("Image"):
        inner["Image"] = ""
    if "created" in data:
        data["created"] = _clamped_time(data["created"], normalization)
    for entry in data.get("history") or []:
        if isinstance(entry, dict) and "created" in entry:
            entry["created"] = _clamped_time(entry["created"], normalization)
    data.setdefault("rootfs", {})["diff_ids"] = list(diff_ids)
    return json.dumps(data, separators=(",", ":")).encode()
