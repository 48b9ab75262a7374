"""The file policy every command shares: regular files only, atomic, all or nothing, no leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buildkit.errors import InputError, OutputError
from buildkit.fsio import output_dir, read_input_text, write_all_atomic, write_atomic, write_output


def test_write_all_atomic_changes_nothing_when_one_target_is_refused(tmp_path: Path) -> None:
    first, blocked = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("old\n")
    blocked.mkdir()
    with pytest.raises(OutputError, match=r"b\.txt: is a directory"):
        write_all_atomic([(first, "new\n"), (blocked, "x")])
    assert first.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"], "no temporary file left"


def test_write_atomic_keeps_the_mode_and_never_follows_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "script.sh"
    target.write_text("old\n")
    target.chmod(0o750)
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and target.stat().st_mode & 0o777 == 0o750
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OutputError, match="symlink"):
        write_atomic(tmp_path / "link", "through the link")
    assert target.read_text() == "new\n"


def test_fifo_and_device_are_refused_both_ways(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InputError, match="a FIFO"):
        read_input_text(tmp_path / "pipe", "matrix file")
    with pytest.raises(OutputError, match="a FIFO"):
        write_atomic(tmp_path / "pipe", "x")
    with pytest.raises(OutputError, match="a character device"):
        write_atomic(Path("/dev/null"), "x")


def test_dash_is_stdout(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert write_output(Path("-"), "to stdout\n") is False
    assert capsys.readouterr().out == "to stdout\n"
    assert write_output(tmp_path / "f", "to a file\n") is True


def test_output_dir_removes_what_it_created_when_the_command_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), output_dir(tmp_path / "a" / "b", "report directory"):
        raise RuntimeError("the command failed")
    assert list(tmp_path.iterdir()) == []
    with output_dir(tmp_path / "kept", "report directory") as made:
        (made / "report.md").write_text("x")
    assert (tmp_path / "kept" / "report.md").is_file()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(RuntimeError), output_dir(existing, "report directory"):
        raise RuntimeError("failed")
    assert existing.is_dir(), "a directory that was there before stays"
