"""What the stand-in base leaves out (tests/harness/standin.py, SLIMMED): documentation, manual pages,
translations, GCC's LTO dump tool, the sanitizers' runtimes and Python's static libraries, with the
links to them, and nothing a build or a test uses (Python's shared library and headers, the compilers,
libstdc++, time zones, dpkg's records). A root laid out as Debian 12's, amd64 and arm64."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.standin import slim

GONE = [
    "usr/share/doc/gcc-12-base/copyright",
    "usr/share/doc/gcc-12-base/sanitizer/changelog.gz",
    "usr/share/man/man1/gcc.1.gz",
    "usr/share/info/gcc.info.gz",
    "usr/share/locale/de/LC_MESSAGES/gcc.mo",
    "usr/share/locale/locale.alias",
    "usr/bin/{triplet}-lto-dump-12",
    "usr/lib/{triplet}/libasan.so.8.0.0",
    "usr/lib/{triplet}/libtsan.so.2.0.0",
    "usr/lib/{triplet}/libhwasan.so.0.0.0",
    "usr/lib/gcc/{triplet}/12/libasan.a",
    "usr/lib/gcc/{triplet}/12/libasan_preinit.o",
    "usr/lib/gcc/{triplet}/12/libsanitizer.spec",
    "usr/lib/python3.11/config-3.11-{triplet}/libpython3.11.a",
    "usr/lib/python3.11/config-3.11-{triplet}/libpython3.11-pic.a",
]
GONE_LINKS = {
    "usr/bin/lto-dump-12": "{triplet}-lto-dump-12",
    "usr/lib/{triplet}/libasan.so.8": "libasan.so.8.0.0",
    "usr/lib/gcc/{triplet}/12/libasan.so": "../../../{triplet}/libasan.so.8",
    "usr/lib/{triplet}/libpython3.11.a": "../python3.11/config-3.11-{triplet}/libpython3.11.a",
}
KEPT = [
    "usr/lib/{triplet}/libpython3.11.so.1.0",
    "usr/lib/python3.11/config-3.11-{triplet}/Makefile",
    "usr/include/python3.11/Python.h",
    "usr/lib/gcc/{triplet}/12/cc1",
    "usr/lib/gcc/{triplet}/12/lto1",
    "usr/lib/gcc/{triplet}/12/include/sanitizer/asan_interface.h",
    "usr/lib/{triplet}/libstdc++.so.6.0.30",
    "usr/lib/{triplet}/libsndfile.so.1.0.35",
    "usr/share/zoneinfo/UTC",
    "usr/share/perl5/Debconf/Config.pm",
    "var/lib/dpkg/info/gcc-12.list",
]


@pytest.mark.parametrize("triplet", ["x86_64-linux-gnu", "aarch64-linux-gnu"])
def test_the_stand_in_leaves_out_what_nothing_uses_and_keeps_the_rest(tmp_path: Path, triplet: str) -> None:
    def at(name: str) -> Path:
        return tmp_path / name.format(triplet=triplet)

    for name in [*GONE, *KEPT]:
        at(name).parent.mkdir(parents=True, exist_ok=True)
        at(name).write_text(name)
    for name, target in GONE_LINKS.items():
        at(name).parent.mkdir(parents=True, exist_ok=True)
        at(name).symlink_to(target.format(triplet=triplet))
    slim(tmp_path)
    assert [n for n in [*GONE, *GONE_LINKS] if at(n).exists() or at(n).is_symlink()] == []
    assert [n for n in KEPT if not at(n).is_file()] == []
    for directory in ("usr/share/doc", "usr/share/man", "usr/share/locale"):
        assert at(directory).is_dir() and not any(at(directory).iterdir()), "emptied, as dpkg's path-exclude leaves them"
    assert [p for p in tmp_path.rglob("*") if p.is_symlink() and not p.exists()] == [], "no link left pointing at what went"
