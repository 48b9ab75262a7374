"""What makes two clean builds of the same inputs publish the same bytes, on any engine: every time a
layer's tar headers carry clamped to the image's epoch, the config's times with them, and each layer
written as its changes alone, whichever differ wrote it.

The engine writes each file's mtime as the moment the build wrote it; no engine users run clamps it
(Docker 26's BuildKit refuses ``rewrite-timestamp`` with the containerd store and ignores it with
overlay2; the classic builder has no such option). Publishing already streams every layer out of the
engine into its compressors, so the clamp happens there, on every engine and builder alike: each
header's mtime (and a PAX record's mtime, atime, ctime) later than the epoch becomes the epoch, its
checksum is written again. The base's own layers are never touched (they keep the digests every
image of that base shares). The config follows: its DiffIDs are the clamped layers', its times are
clamped, and what the classic builder records of its build container (``container``,
``container_config``, the parent image in ``config.Image``) is dropped.

The engines' differs write the same change two ways. moby's overlay2 differ tars a step's upper
directory: every file the step opened for writing and left as it was (a lock file, a file chmod'ed
to its own mode), every directory a mount point passed through, and whiteouts as hard links to the
first one. containerd's writes what changed, its parent directories, and whiteouts as empty files.
So a layer above the base is published without the entries that leave the filesystem as the layers
below left it (:func:`unchanged_entries`, judged on every layer's listing), and its whiteouts
written one way (:mod:`buildkit.ship.layers.layertar`). What extracts is the same, a directory's time aside; nothing else
changes: not a name, a mode, an owner, an xattr, a file's bytes or the order.

What the build itself must make the same (the bytes of files: hash-based pycs, no installer
timestamps, no logs) is the template's job (templates/partials/, buildkit/image/files/build-env.sh).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from buildkit.plan.layers import EPOCH_LABEL
from buildkit.ship.layers.layertar import OPAQUE, WHITEOUT, Entry, Listing

# Bump when what is clamped changes: it keys the compression cache, so an older rule is never served.
RULES = 2

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
            "builder's container, container_config and config.Image dropped; every whiteout written one way (an empty file, "
            "mode 0, owner 0:0, time 0); a file left exactly as the layers below had it (contents too) or a directory left so "
            "(its time aside), with nothing "
            "changed beneath it, left out (what moby's overlay2 differ copies up and containerd's does not write); modes "
            "without the file type's bits (Docker 20.10 writes them). Nothing else: the names, permissions, owners, xattrs, "
            "contents and order of every other entry are the engine's",
        }


def epoch_of(labels: dict[str, str]) -> int | None:
    """The epoch an image was built with, from its label; None for an image built without one."""
    value = labels.get(EPOCH_LABEL, "")
    return int(value) if value.isdigit() else None


# ---- what a layer leaves as it was ------------------------------------------------------------------


def unchanged_entries(listings: Sequence[Listing | None], keep: int) -> list[frozenset[str]]:
    """For each layer, the entries that leave the filesystem as the layers below left it: a directory
    or a regular file whose every field (and its contents) is what the layers below gave that path (a
    directory's time aside), with nothing kept beneath it in its own layer. moby's overlay2 differ
    writes such entries (a file opened for writing and left as it was, a directory a build step's
    mount point passed through); containerd's does not, so publishing leaves them out. None for the
    base's layers (kept as they are) and for every layer above a layer whose listing is unknown
    (nothing can be judged there)."""
    tree = _Tree()
    result: list[frozenset[str]] = []
    known = True
    for index, listing in enumerate(listings):
        if listing is None:
            known = False
        if index < keep or not known or listing is None:
            result.append(frozenset())
        else:
            candidates = {name for name, entry in listing if _unchanged(entry, tree.entries.get(name))}
            needed: set[str] = set()
            for name, _ in listing:
                if name in candidates:
                    continue
                parent = name.rpartition("/")[0]
                while parent and parent not in needed:
                    needed.add(parent)
                    parent = parent.rpartition("/")[0]
            result.append(frozenset(candidates - needed))
        mine: set[str] = set()
        for name, entry in listing or ():
            tree.apply(name, entry, mine)
    return result


def _unchanged(entry: Entry, below: Entry | None) -> bool:
    """A regular file with every field (its contents too) as below, or a directory with every field
    but its time: a directory's time moves when a step creates and removes something in it, which
    leaves nothing to publish (containerd's differ writes no such directory)."""
    if below is None:
        return False
    if entry[0] == "5":
        return entry[:4] + entry[5:] == below[:4] + below[5:]
    return entry[0] == "0" and entry == below


class _Tree:
    """The filesystem the layers so far leave: each path's entry, and each directory's children (a
    whiteout removes a whole subtree without a walk over every path)."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.children: dict[str, set[str]] = {}

    def apply(self, name: str, entry: Entry, mine: set[str]) -> None:
        """``name`` of one layer; ``mine``: the names that layer wrote before it."""
        parent, _, base = name.rpartition("/")
        if base == OPAQUE:  # the directory's lower contents are gone; what its own layer wrote stays
            for child in [c for c in self.children.get(parent, ()) if c not in mine]:
                self.remove(child)
        elif base.startswith(WHITEOUT):
            self.remove((parent + "/" if parent else "") + base[len(WHITEOUT) :])
        else:
            self.entries[name] = entry
            self.children.setdefault(parent, set()).add(name)
            mine.add(name)

    def remove(self, path: str) -> None:
        """``path`` and everything beneath it."""
        parent = path.rpartition("/")[0]
        self.children.get(parent, set()).discard(path)
        pending = [path]
        while pending:
            current = pending.pop()
            self.entries.pop(current, None)
            pending.extend(self.children.pop(current, ()))


def drop_key(drop: frozenset[str]) -> str:
    """What names a layer's dropped entries in cache keys ("" when none)."""
    return hashlib.sha256("\n".join(sorted(drop)).encode()).hexdigest()[:16] if drop else ""


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
