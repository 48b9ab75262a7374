"""A layer's tar as a stream: read header by header as it leaves the engine, written out again with its
times clamped, its whiteouts written one way and the entries publishing leaves out left out
(:class:`TarClamp`), and what each entry was kept on the way (its listing). Only headers are
rewritten; file contents pass through as views of what came in. :mod:`buildkit.ship.layers.normalize` says why."""

from __future__ import annotations

import json
from collections.abc import Callable

from zlib_ng import zlib_ng

BLOCK = 512


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
    """A PAX header's records with every time later than ``epoch`` clamped and no owner's name (the
    ids say who owns a file; the names are what the build container's passwd had); the rest as it was."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        pos += length
        key, _, value = record.rstrip(b"\n").partition(b"=")
        if key in (b"uname", b"gname"):
            continue
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


# What a layer's listing holds of each entry, as the engine wrote it (before any clamp): its kind
# (the tar type flag), mode, owner, mtime (a PAX record's text where there is one), size, link
# target, extended attributes and, for a regular file, a checksum of its contents: CRC-32 and
# Adler-32, 64 bits (zlib-ng's, 20x sha256's speed: a cold publish from overlay2 lists every byte of
# the base). Two entries with the same fields extract to the same thing. The checksum is compared
# only between two entries of one path that agree in every other field, size and mtime included, and
# the match leaves an entry out (the layer below's file stays what extracts), never adds one; nothing
# an image's author could gain from a forged match that owning the base would not already give.
Entry = tuple[str, int, int, int, str, int, str, str, str]
LISTING_FORMAT = 2  # bump when what an Entry holds changes: listings are cached under it (1: sha256 contents)
Listing = list[tuple[str, Entry]]

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DATALESS = (b"1", b"2", b"3", b"4", b"5", b"6")
_EXTENDED = (b"x", b"L", b"K")  # headers that describe the entry after them (PAX, GNU long name and link)
_XATTR = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")  # the PAX records of extended attributes


def entry_name(raw: str) -> str:
    """A member's name as layers compare it: no leading ``./`` or ``/``, no trailing ``/``."""
    name = raw
    while name.startswith(("./", "/")):
        name = name[2:] if name.startswith("./") else name[1:]
    return name.rstrip("/")


def _text(field: bytes | bytearray) -> str:
    return bytes(field).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space] or b"0")
        if length <= 0:
            break
        key, _, value = data[space + 1 : pos + length].rstrip(b"\n").partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _pax_block(header: bytearray, records: dict[str, str]) -> bytes:
    """A PAX header block from ``header`` (its first block) holding ``records`` only."""
    body = bytearray()
    for key, value in records.items():
        line = f" {key}={value}\n".encode("utf-8", "surrogateescape")
        size = len(line) + 1
        while len(str(size)) + len(line) != size:
            size = len(str(size)) + len(line)
        body += str(size).encode() + line
    first = bytearray(header[:BLOCK])
    first[124:136] = b"%011o\0" % len(body)
    return _checksummed(first) + bytes(body) + b"\0" * (-len(body) % BLOCK)


class TarClamp:
    """A layer's tar in, pieces of any size; the same tar out with its times clamped, into ``out``.
    File contents pass through untouched (as views of what came in); only headers are rewritten.

    More rules make the engines' differs agree (each writes a layer's changes its own way): a
    mode is its permission bits alone (Docker 20.10 adds the file type's) and an owner is its ids
    alone (Docker 20.10 adds the build container's names for them);
    every whiteout is written one way (an empty regular file, mode 0, owner 0:0, time 0, no link:
    moby's overlay2 differ writes them as hard links to the first one, mode 0600; containerd's as
    empty files), and the entries named in ``drop`` (an unchanged directory or file the
    overlay2 differ copied up: :func:`unchanged_entries`) are left out. With ``listing``, each
    entry's fields as the engine wrote them are kept in :attr:`listing`; with no ``out``, that is all
    it does (no header is rewritten: a layer read for its listing alone)."""

    def __init__(
        self,
        epoch: int,
        out: Callable[[bytes | memoryview], None] | None,
        *,
        drop: frozenset[str] = frozenset(),
        listing: bool = False,
    ) -> None:
        self.epoch, self.drop = epoch, drop
        self.quiet = out is None
        self.out: Callable[[bytes | memoryview], None] = out or _nowhere
        self.head = bytearray()  # a header being gathered (a PAX header: with its records)
        self.need = BLOCK
        self.passthrough = 0  # bytes of file data (with padding) to pass as they are
        self.skipping = 0  # bytes of a dropped entry's data to leave out
        self.hashing = 0  # bytes of a listed file's contents still to checksum
        self.crc, self.adler = 0, 1
        self.ended = False
        self.pending: list[bytes] = []  # the extended headers of the entry to come, as they will go out
        self.extended: dict[str, str] = {}  # their records, as the engine wrote them
        self.pax_path: str | None = None  # the name a PAX header among them gives
        self.clamped = 0  # headers whose times were clamped
        self.listing: Listing | None = [] if listing else None

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self.passthrough:
                n = min(self.passthrough, end - pos)
                if self.hashing:
                    self._hash(view[pos : pos + n])
                if not self.quiet:
                    self.out(view[pos : pos + n])
                pos += n
                self.passthrough -= n
                continue
            if self.ended:  # whatever padding the writer added (a record's worth, Python's tarfile) is left out
                return
            if self.skipping:
                n = min(self.skipping, end - pos)
                if self.hashing:
                    self._hash(view[pos : pos + n])
                pos += n
                self.skipping -= n
                continue
            take = min(self.need - len(self.head), end - pos)
            self.head += view[pos : pos + take]
            pos += take
            if len(self.head) == self.need:
                self._header()

    def _header(self) -> None:
        header = self.head
        if self.need == BLOCK and not any(header):  # the end: two zero blocks, and nothing after them
            self._flush()
            self.out(bytes(2 * BLOCK))
            self.head, self.ended = bytearray(), True
            return
        size = _number(bytes(header[124:136]))
        padded = -(-size // BLOCK) * BLOCK
        kind = bytes(header[156:157])
        if kind in _EXTENDED or kind == b"g":
            if self.need == BLOCK:  # gather its records first
                self.need = BLOCK + padded
                if padded:
                    return
            data = bytes(header[BLOCK : BLOCK + size])
            if self.quiet:
                self._read_extended(kind, data)
                self.head, self.need = bytearray(), BLOCK
                return
            first = bytearray(header[:BLOCK])
            if kind in (b"x", b"g"):
                records = _pax_records(data, self.epoch)
                if records != data:
                    self.clamped += 1
                    first[124:136] = b"%011o\0" % len(records)
                self._mtime(first)
                block = _checksummed(first) + records + b"\0" * (-len(records) % BLOCK)
            else:
                block = bytes(header)
            if kind == b"g":
                self._flush()
                self.out(block)
            else:
                if kind != b"x" or records:  # a PAX header left with nothing to say goes, but is listed
                    self.pending.append(block)
                self._read_extended(kind, data)
            self.head, self.need = bytearray(), BLOCK
            return
        self.head = bytearray()
        name = self._name(header)
        if self.listing is not None:
            self.listing.append((name, self._entry(header, kind, size)))
            if kind in (b"0", b"\0", b"7"):
                self.hashing, self.crc, self.adler = size, 0, 1
                if not size:
                    self._hash(memoryview(b""))
        if name in self.drop:
            self.pending, self.extended, self.pax_path = [], {}, None
            self.skipping = padded if kind not in _DATALESS else 0
            return
        if self.quiet:
            self.extended, self.pax_path = {}, None
            self.passthrough = padded if kind not in _DATALESS else 0
            return
        first = bytearray(header)
        if name.rpartition("/")[2].startswith(WHITEOUT):
            self._whiteout(first)
        else:
            if self._mtime(first):
                self.clamped += 1
            if bytes(first[257:263]) == b"ustar\0":
                first[265:329] = b"\0" * 64  # the owner's names (Docker 20.10 writes them; BuildKit does not)
            mode = _number(bytes(first[100:108]))
            if mode & ~0o7777:  # the file type's bits, which Docker 20.10 writes and the type flag says already
                first[100:108] = b"%07o\0" % (mode & 0o7777)
        self._flush()
        self.out(_checksummed(first))
        self.passthrough = padded if kind not in _DATALESS else 0

    def _read_extended(self, kind: bytes, data: bytes) -> None:
        """What an extended header says of the entry after it, taken (as :meth:`_header` takes it) without writing it."""
        if kind == b"g":
            self.extended, self.pax_path = {}, None
        elif kind == b"x":
            parsed = _parse_pax(data)
            self.extended.update(parsed)
            self.pax_path = parsed.get("path", self.pax_path)
        else:
            self.extended["path" if kind == b"L" else "linkpath"] = _text(data)

    def _hash(self, piece: memoryview) -> None:
        """A listed file's contents (its padding aside); their checksum completes its entry."""
        take = min(self.hashing, len(piece))
        if take:
            self.crc, self.adler = zlib_ng.crc32(piece[:take], self.crc), zlib_ng.adler32(piece[:take], self.adler)
        self.hashing -= take
        if not self.hashing and self.listing:
            name, entry = self.listing[-1]
            self.listing[-1] = (name, (*entry[:8], f"{self.crc:08x}{self.adler:08x}"))

    def _name(self, header: bytearray) -> str:
        if "path" in self.extended:
            return entry_name(self.extended["path"])
        name = _text(header[0:100])
        if bytes(header[257:263]) == b"ustar\0" and header[345]:
            name = _text(header[345:500]) + "/" + name
        return entry_name(name)

    def _entry(self, header: bytearray, kind: bytes, size: int) -> Entry:
        pax = self.extended
        found = [(k, v) for k, v in pax.items() if k.startswith(_XATTR)] if pax else []
        xattrs = json.dumps(sorted(found)) if found else "[]"
        return (
            "0" if kind == b"\0" else kind.decode("latin-1"),
            _number(bytes(header[100:108])) & 0o7777,  # Docker 20.10 writes the file type's bits too
            int(pax["uid"]) if pax.get("uid", "").isdigit() else _number(bytes(header[108:116])),
            int(pax["gid"]) if pax.get("gid", "").isdigit() else _number(bytes(header[116:124])),
            pax.get("mtime", "").split(".", 1)[0] or str(_number(bytes(header[136:148]))),  # whole seconds, as moby writes
            int(pax["size"]) if pax.get("size", "").isdigit() else size,
            pax.get("linkpath") or _text(header[157:257]),
            xattrs,
            "",
        )

    def _whiteout(self, header: bytearray) -> None:
        """A whiteout as every engine will publish it: its name and nothing else."""
        long_names = [block for block in self.pending if block[156:157] == b"L"]
        pax = [block for block in self.pending if block[156:157] == b"x"]
        path = self.pax_path
        self.pending = long_names + ([_pax_block(bytearray(pax[0][:BLOCK]), {"path": path})] if pax and path is not None else [])
        for start, end in ((100, 108), (108, 116), (116, 124), (329, 337), (337, 345)):
            header[start:end] = b"%07o\0" % 0
        header[124:136] = b"%011o\0" % 0
        header[136:148] = b"%011o\0" % 0
        header[156:157] = b"0"
        header[157:257] = b"\0" * 100
        if bytes(header[257:263]) == b"ustar\0":
            header[265:329] = b"\0" * 64

    def _flush(self) -> None:
        for block in self.pending:
            self.out(block)
        self.pending, self.extended, self.pax_path = [], {}, None

    def _mtime(self, header: bytearray) -> bool:
        if _number(bytes(header[136:148])) <= self.epoch:
            return False
        header[136:148] = b"%011o\0" % self.epoch
        return True

    def close(self) -> None:
        """A tar cut short goes out as it came (its DiffID then says so)."""
        self._flush()
        if self.head and not self.ended:
            self.out(bytes(self.head))
            self.head = bytearray()


def _nowhere(_: bytes | memoryview) -> None:
    """Where a listing-only reader's output would go."""


def clamp_tar(data: bytes, epoch: int) -> bytes:
    """A whole tar's bytes, clamped (tests and small layers)."""
    parts: list[bytes] = []
    clamp = TarClamp(epoch, lambda piece: parts.append(bytes(piece)))
    clamp.write(data)
    clamp.close()
    return b"".join(parts)
