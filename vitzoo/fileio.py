"""Files written atomically and never through a symbolic link; files read only when they are regular files.

Every file vitzoo writes for a user (run files, checkpoints, result records, rankings, charts) goes through
:func:`atomic_path` (:func:`atomic_write_bytes` / :func:`atomic_write_text` for content in memory; an export's
files are staged and renamed together by :func:`vitzoo.untrusted.write_folder`), and files that others may have
left in a folder (result records, ``results.json`` of a sweep, benchmark tables, Markdown pages) are read with
:func:`read_regular_text`, which refuses FIFOs, devices and sockets instead of blocking on them. Only the
standard library is imported here, so every layer may use it.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Iterator, Optional, Union

from vitzoo.registry import ConfigError

PathLike = Union[str, Path]
MAX_READ_BYTES = 64 * 1024 * 1024  # default limit of read_regular_bytes: larger files are refused, never read
KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))  # what a path is when it is no regular file


class NotRegularFile(OSError):
    """Raised by :func:`read_regular_bytes` for a path that is not a regular file (FIFO, device, socket, folder)
    or is larger than the limit; ``strerror`` says which."""


def open_new(path: PathLike) -> int:
    """A file descriptor for writing a file that does not exist yet: created exclusively, never through a
    symbolic link, mode 0644 less the user's umask.

    Args:
        path: the file to create (its folder must exist).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o644)


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """The atomic write every vitzoo file goes through: a fresh temporary file beside ``path`` to fill inside the
    ``with`` block, renamed over ``path`` when the block ends and removed when it raises.

    The temporary file (``.<name>.<pid>.<random>.tmp``) is created empty, exclusively and without following links,
    before the block runs; a writer that opens files by name (Lightning's checkpoint writer) writes into it. A
    reader of ``path`` sees the old file or the new one, never half of either. A symbolic link at ``path`` is
    replaced by the file; its target is left alone.

    Args:
        path: the file to write (its folder must exist).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    os.close(open_new(tmp))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_path`: atomically and never through a symbolic link.

    Args:
        path: the file to write (its folder must exist).
        data: its content.
    """
    with atomic_path(path) as tmp:
        flags = os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)  # the file just created, never a link
        with os.fdopen(os.open(tmp, flags), "wb") as f:
            f.write(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8.

    Args:
        path: the file to write (its folder must exist).
        text: its content.
    """
    return atomic_write_bytes(path, text.encode("utf-8"))


def file_kind(mode: int) -> Optional[str]:
    """What a ``st_mode`` describes when it is not a regular file (``"a FIFO"``, ...); None for a regular file.

    Args:
        mode: ``os.stat(...).st_mode``.
    """
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def read_regular_bytes(path: PathLike, limit: int = MAX_READ_BYTES) -> bytes:
    """The content of ``path`` if it is a regular file of at most ``limit`` bytes (a link to one is followed).

    The file is opened without blocking and checked on the open descriptor, so a FIFO, a device or a socket
    planted under the expected name raises :class:`NotRegularFile` at once instead of hanging the reader.

    Args:
        path: the file to read.
        limit: the largest size read, in bytes.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:
            raise NotRegularFile(0, f"{kind}, not a regular file", str(path))
        if st.st_size > limit:
            raise NotRegularFile(0, f"{st.st_size} bytes, more than the {limit} read", str(path))
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise NotRegularFile(0, f"more than the {limit} bytes read", str(path))
    return data


def read_regular_text(path: PathLike, limit: int = MAX_READ_BYTES) -> str:
    """:func:`read_regular_bytes` decoded as UTF-8 (``UnicodeDecodeError`` for other bytes).

    Args:
        path: the file to read.
        limit: the largest size read, in bytes.
    """
    return read_regular_bytes(path, limit).decode("utf-8")


def splice_block(content: str, text: str, begin: str, end: str, where: object) -> str:
    """``content`` with what lies between the marker lines ``begin`` and ``end`` replaced by ``text`` (the
    generated blocks of the docs). ``content`` must hold each marker once, begin before end, and ``text``
    neither; else a one-line :class:`~vitzoo.registry.ConfigError` naming ``where``. The same ``text`` gives
    ``content`` back byte for byte.

    Args:
        content: the document; text: the block's new content, its own first and last newline included;
        begin, end: the marker comments; where: how the error names the document.
    """
    if begin in text or end in text:
        raise ConfigError(f"{where}: the generated text holds a block marker; nothing written")
    if content.count(begin) != 1 or content.count(end) != 1 or content.index(begin) > content.index(end):
        raise ConfigError(f"{where}: needs one '{begin}' followed by one '{end}' (found "
                          f"{content.count(begin)} and {content.count(end)})")
    head, rest = content.split(begin)
    return f"{head}{begin}{text}{end}{rest.split(end)[1]}"
