"""The entries of a layer's tar as it streams past, with where each one's bytes start: the TOC of
a zTOC (:mod:`buildkit.ship.lazy.ztoc`).

Read the way Go's archive/tar reads a tar, since that is what soci's TOC records (a name with its
trailing slash, the mode field as written, PAX records as they came, the sizes and offsets its
reader reaches): USTAR and GNU headers, PAX extended headers ('x') and GNU long names ('L', 'K'),
octal and base-256 numbers. Python's tarfile answers other questions (it strips a directory's
slash, folds PAX records into its fields), so this reads the headers itself; it never holds more
than one header and the extended data before it. Entries Go's reader returns but soci refuses
(global PAX headers, sparse and contiguous files) raise :class:`UnsupportedTar`: such a layer gets
no zTOC and is pulled whole, as soci would have to.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field

BLOCK = 512
KINDS = {b"0": "reg", b"\0": "reg", b"1": "hardlink", b"2": "symlink", b"3": "char", b"4": "block", b"5": "dir", b"6": "fifo"}
HEADER_ONLY = {"hardlink", "symlink", "char", "block", "dir", "fifo"}  # their size field carries no data


class UnsupportedTar(ValueError):
    """A layer whose tar a SOCI snapshotter cannot index (or that is no tar at all)."""


@dataclass
class TarEntry:
    name: bytes
    kind: str
    offset: int  # of its first byte of data in the uncompressed stream
    size: int
    linkname: bytes = b""
    mode: int = 0
    uid: int = 0
    gid: int = 0
    uname: bytes = b""
    gname: bytes = b""
    mod_time: str = ""  # RFC 3339 in UTC with nanoseconds, as Go's time.MarshalText writes it
    devmajor: int = 0
    devminor: int = 0
    xattrs: dict[bytes, bytes] = field(default_factory=dict)  # every PAX record of the entry, as Go keeps them


def _string(field_: bytes) -> bytes:
    return field_.split(b"\0", 1)[0]


def _number(field_: bytes) -> int:
    """An octal field (spaces and NULs trimmed) or, with its top bit set, a base-256 one."""
    if field_ and field_[0] & 0x80:
        invert = 0xFF if field_[0] & 0x40 else 0
        value = 0
        for i, byte in enumerate(field_):
            byte ^= invert
            value = value << 8 | (byte & 0x7F if i == 0 else byte)
        return ~value if invert else value
    text = field_.strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise UnsupportedTar(f"a tar header field is not a number: {field_!r}") from None


def _go_time(seconds: int, nanos: int = 0) -> str:
    """``time.Unix(seconds, nanos).UTC().MarshalText()``; "" where Go cannot write the year."""
    try:
        moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    except OverflowError:
        return ""
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    return text + "Z"


def _pax_time(value: bytes) -> str:
    whole, _, fraction = value.decode(errors="replace").partition(".")
    seconds = int(whole)
    digits = (fraction[:9] if fraction.isdigit() else "").ljust(9, "0")
    nanos = int(digits)
    if whole.startswith("-") and nanos:  # Go's parsePAXTime: the fraction goes the same way as the seconds
        seconds, nanos = seconds - 1, 1_000_000_000 - nanos
    return _go_time(seconds, nanos)


def _pax_records(data: bytes) -> dict[bytes, bytes]:
    records: dict[bytes, bytes] = {}
    while data:
        length_text, space, _ = data.partition(b" ")
        try:
            length = int(length_text)
        except ValueError:
            raise UnsupportedTar("a PAX header record has no length") from None
        if not space or length < len(length_text) + 2 or length > len(data) or data[length - 1 : length] != b"\n":
            raise UnsupportedTar("a PAX header record is malformed")
        key, equals, value = data[len(length_text) + 1 : length - 1].partition(b"=")
        if not equals:
            raise UnsupportedTar("a PAX header record has no '='")
        records[key] = value
        data = data[length:]
    return records


class TarIndex:
    """Fed the uncompressed stream in pieces of any size; ``entries`` and ``archive_size`` after ``close``."""

    def __init__(self) -> None:
        self.entries: list[TarEntry] = []
        self.archive_size = 0
        self._position = 0  # of the next byte fed
        self._buffer = bytearray()
        self._skip = 0
        self._want = BLOCK
        self._extended_size = 0
        self._then: Callable[[bytes], None] = self._header
        self._pax: dict[bytes, bytes] = {}
        self._long_name: bytes | None = None
        self._long_link: bytes | None = None
        self._done = False

    def feed(self, data: bytes) -> None:
        if self._done:
            return
        view = memoryview(data)
        if self._skip:
            skipped = min(self._skip, len(view))
            self._skip -= skipped
            self._position += skipped
            view = view[skipped:]
        self._buffer += view
        while not self._done and len(self._buffer) >= self._want:
            piece = bytes(self._buffer[: self._want])
            del self._buffer[: self._want]
            self._position += len(piece)
            self._then(piece)
            if self._skip and self._buffer:
                skipped = min(self._skip, len(self._buffer))
                del self._buffer[:skipped]
                self._skip -= skipped
                self._position += skipped

    def close(self) -> None:
        """The stream ended: where Go's reader stopped is the archive's size."""
        if self._done:
            return
        # a bound method is made anew at each access: compared with ==, never `is`
        if self._skip or self._buffer or self._then not in (self._header, self._second_zero):
            raise UnsupportedTar("the layer's tar ends inside an entry")
        self.archive_size = self._position  # no (or one) end-of-archive block: Go stops at the end too

    # ---- the steps ---------------------------------------------------------------------------------

    def _read(self, size: int, then: Callable[[bytes], None]) -> None:
        """Collect ``size`` bytes of extended data (padded to a block) for ``then``."""
        self._want = -(-size // BLOCK) * BLOCK
        self._extended_size = size
        self._then = then
        if self._want == 0:
            then(b"")

    def _after_extended(self) -> None:
        self._want, self._then = BLOCK, self._header

    def _pax_data(self, data: bytes) -> None:
        self._pax = _pax_records(data[: self._extended_size])
        self._after_extended()

    def _long_name_data(self, data: bytes) -> None:
        self._long_name = _string(data[: self._extended_size])
        self._after_extended()

    def _long_link_data(self, data: bytes) -> None:
        self._long_link = _string(data[: self._extended_size])
        self._after_extended()

    def _second_zero(self, block: bytes) -> None:
        if block.count(0) != BLOCK:
            raise UnsupportedTar("a zero block in the layer's tar is followed by a header")
        self.archive_size = self._position
        self._done = True

    def _header(self, block: bytes) -> None:
        if block.count(0) == BLOCK:
            self._then = self._second_zero
            return
        checksum = _number(block[148:156])
        unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
        signed = sum(b - 256 if b > 127 else b for b in block[:148] + b" " * 8 + block[156:])
        if checksum not in (unsigned, signed):
            raise UnsupportedTar("a tar header's checksum does not match: not a tar, or a damaged one")
        flag = block[156:157]
        size = _number(block[124:136])
        if flag == b"x":
            return self._read(size, self._pax_data)
        if flag == b"L":
            return self._read(size, self._long_name_data)
        if flag == b"K":
            return self._read(size, self._long_link_data)
        kind = KINDS.get(flag)
        if kind is None:
            what = "a global PAX header" if flag == b"g" else f"an entry of type {flag!r}"
            raise UnsupportedTar(f"the layer's tar holds {what}, which a SOCI snapshotter does not index")
        self._entry(block, kind, size)

    def _entry(self, block: bytes, kind: str, size: int) -> None:
        magic = block[257:263]
        name = _string(block[0:100])
        if magic == b"ustar\0":  # USTAR or PAX (star's prefix is shorter: its last bytes hold times)
            prefix = _string(block[345:476] if block[508:512] == b"tar\0" else block[345:500])
            name = prefix + b"/" + name if prefix else name
        entry = TarEntry(name=name, kind=kind, offset=0, size=size, linkname=_string(block[157:257]), mode=_number(block[100:108]))
        entry.uid, entry.gid = _number(block[108:116]), _number(block[116:124])
        entry.mod_time = _go_time(_number(block[136:148]))
        if magic in (b"ustar\0", b"ustar "):
            entry.uname, entry.gname = _string(block[265:297]), _string(block[297:329])
            entry.devmajor, entry.devminor = _number(block[329:337]), _number(block[337:345])
        self._merge(entry)
        if block[156:157] == b"\0" and entry.name.endswith(b"/"):  # pre-POSIX: Go reads it as a directory
            entry.kind = "dir"
        entry.offset = self._position
        self.entries.append(entry)
        self._skip = 0 if entry.kind in HEADER_ONLY else -(-entry.size // BLOCK) * BLOCK
        self._pax, self._long_name, self._long_link = {}, None, None

    def _merge(self, entry: TarEntry) -> None:
        """Go's mergePAX, then its GNU long names; the records stay as they came."""
        for key, value in self._pax.items():
            if not value:
                continue  # Go keeps the header's own value
            try:
                if key == b"path":
                    entry.name = value
                elif key == b"linkpath":
                    entry.linkname = value
                elif key == b"uname":
                    entry.uname = value
                elif key == b"gname":
                    entry.gname = value
                elif key in (b"uid", b"gid", b"size"):
                    setattr(entry, key.decode(), int(value))
                elif key == b"mtime":
                    entry.mod_time = _pax_time(value)
            except ValueError:
                raise UnsupportedTar(f"the PAX record {key.decode(errors='replace')} is not a number") from None
        entry.xattrs = dict(self._pax)
        if self._long_name:
            entry.name = self._long_name
        if self._long_link:
            entry.linkname = self._long_link
