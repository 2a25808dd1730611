"""The atomic writer and the regular-file reader every command shares (vitzoo.fileio)."""
from __future__ import annotations

import os
import socket

import pytest

from vitzoo.fileio import (
    NotRegularFile,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    read_regular_bytes,
    read_regular_text,
)


def test_atomic_write_replaces_a_symlink_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "out.md")
    atomic_write_text(tmp_path / "out.md", "table")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out.md").is_symlink() and (tmp_path / "out.md").read_text() == "table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.md", "victim.txt"]  # no temporary file left


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "ranking.csv"
    path.write_text("old")

    with pytest.raises(TypeError):
        atomic_write_bytes(path, 123)  # the temporary file is created, then the write fails
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["ranking.csv"]


def test_atomic_path_gives_a_writer_by_name_a_fresh_file_and_keeps_the_old_one_when_it_fails(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_text("old")
    with pytest.raises(OSError, match="crash mid-write"), atomic_path(path) as tmp:
        assert tmp.parent == tmp_path and not tmp.is_symlink() and tmp.read_bytes() == b""
        tmp.write_text("half")
        raise OSError("crash mid-write")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
        assert path.read_text() == "old"  # a reader sees the old file until the block ends
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_read_regular_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "seed0.json"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="a FIFO"):
        read_regular_text(fifo)


def test_read_regular_refuses_a_device_a_folder_and_a_large_file(tmp_path):
    with pytest.raises(NotRegularFile, match="character device"):
        read_regular_bytes("/dev/zero")
    with pytest.raises(NotRegularFile, match="a folder"):
        read_regular_bytes(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 101)
    with pytest.raises(NotRegularFile, match="101 bytes"):
        read_regular_bytes(big, limit=100)
    assert read_regular_bytes(big, limit=101) == b"x" * 101


def test_read_regular_refuses_a_socket(tmp_path):
    path = tmp_path / "s.json"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(OSError):  # opening a socket file fails at once (ENXIO)
            read_regular_bytes(path)
