"""What a training run shows and keeps: ``train.log`` with the run's console, whole paths without a terminal,
a progress bar that counts epochs from 1, and the CSV logger kept beside any other logger.

:func:`run_console` copies everything the run prints (Rich tables, progress lines, Lightning's messages,
warnings, the one-line error) into ``<run>/train.log``, without colours; a live progress bar is copied once,
as it looks when it stops. Without a terminal, Rich draws at :data:`WIDE` columns, so a path is never split.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from pytorch_lightning.callbacks import RichProgressBar
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from vitzoo.fileio import file_kind
from vitzoo.registry import ConfigError
from vitzoo.training.resume import ResumableCSVLogger
from vitzoo.training.utils import console, one_line

WIDE = 1000  # Rich's width when stdout is not a terminal: long lines (paths) are never wrapped
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour and cursor sequences
_CURSOR = re.compile(r"\x1b\[[0-9]*[AK]|\x1b\[\?25l")  # cursor up / erase line / hide cursor: a live display


RUN_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "csv/metrics.csv",
             "csv/hparams.yaml")  # files of a run folder that Hydra and Lightning open by name and write


def clear_links(folder: Path, names: Sequence[str]) -> None:
    """Before a writer that opens files by name (Hydra, Lightning's CSV logger) writes ``names`` in ``folder``: a
    symbolic link there is removed, its target left alone, so the file is written in its place; a FIFO, device or
    socket there is one line naming it.

    Args:
        folder: the run folder (or the CSV logger's folder).
        names: the files, relative to ``folder``.
    """
    for name in names:
        path = Path(folder) / name
        if path.is_symlink():
            path.unlink()
        elif os.path.lexists(path) and (kind := file_kind(path.lstat().st_mode)):
            raise ConfigError(f"{path} is {kind}, not a regular file; remove it (the run writes that file)")


def open_log(path: Path) -> TextIO:
    """``path`` opened for appending as a regular file, never through a symbolic link: a link there is removed
    first (its target left alone), and a FIFO, device or socket is an ``OSError`` instead of a blocking open.

    Args:
        path: the log file.
    """
    if path.is_symlink():
        path.unlink()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    if kind := file_kind(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, f"{kind}, not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


class _RunLog:
    """``train.log``, written only once the run is under way: text before that is held, and dropped if the run
    stops first (a refused resume or a bad option changes no file of the run folder).

    Args:
        path: the log file (opened for appending when the run starts).
    """

    def __init__(self, path: Path):
        self.path, self.file, self.held = path, None, []

    def start(self) -> None:
        if self.file is None:
            self.file = open_log(self.path)
            self.write("".join(self.held))
            self.held = []

    def write(self, text: str) -> None:
        if self.file is None:
            self.held.append(text)
        elif text:
            self.file.write(text)
            self.file.flush()

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _StartOnRecord(logging.Handler):
    """Copies Lightning's log lines into the run log; the first one (the Trainer is built, every check of the run
    passed) starts the log."""

    def __init__(self, log: _RunLog):
        super().__init__()
        self.log = log
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):  # an unwritable folder: the console alone
            self.log.start()
            self.log.write(self.format(record) + "\n")


class _Tee:
    """A text stream that writes to ``stream`` and, without colours, to ``log``; the frames of a live display
    (cursor movements) go to the log once, the last frame when the display ends (the cursor is shown again).

    Args:
        stream: the terminal or pipe (``sys.stdout`` / ``sys.stderr`` as they were).
        log: the run's ``train.log``.
    """

    def __init__(self, stream: TextIO, log: _RunLog):
        self.stream, self.log = stream, log
        self.frame = ""  # the latest frame of a live display, not yet in the log

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        live = bool(_CURSOR.search(text))
        if "\x1b[?25h" in text:  # a live display ends: its last frame goes to the log
            before, _, after = text.partition("\x1b[?25h")
            self._keep(self.frame if not _CURSOR.search(before) else before, live=True)
            self.frame = ""
            self._keep(after, live=False)
        elif live:
            self.frame = text
        else:
            self._keep(text, live=False)
        return n

    def _keep(self, text: str, live: bool) -> None:
        plain = _ANSI.sub("", text).replace("\r", "")
        if live:
            plain = "\n".join(ln.rstrip() for ln in plain.splitlines() if ln.strip()) + "\n" if plain.strip() else ""
        if plain:
            self.log.write(plain)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, errors, ... of the real stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def run_console(out_dir: Path, name: str = "train.log") -> Iterator[None]:
    """Copy the run's console into ``<out_dir>/<name>`` (rank 0) and draw Rich output at :data:`WIDE` columns
    when stdout is not a terminal. The log starts when the Trainer is built (what was printed before is copied
    then) or when the run ends; an error after that is written there as one line. A run stopped before (a bad
    option, a refused resume) leaves the file as it was.

    Args:
        out_dir: the run folder.
        name: the log file (Hydra's job log of ``vitzoo-train``).
    """
    wide = not sys.stdout.isatty()
    old_width, old_columns = console.width, os.environ.get("COLUMNS")
    if wide:
        console.width = WIDE
        os.environ["COLUMNS"] = str(WIDE)  # consoles made during the run (the progress bar's) read it
    log = _RunLog(Path(out_dir) / name) if rank_zero_only.rank == 0 else None
    handler = _StartOnRecord(log) if log is not None else None
    lightning = [logging.getLogger(n) for n in LIGHTNING_LOGGERS] if handler is not None else []
    for logger in lightning:
        logger.addHandler(handler)
    out, err = sys.stdout, sys.stderr
    if log is not None:
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
    try:
        yield
        if log is not None:
            with contextlib.suppress(OSError):
                log.start()
    except BaseException as e:
        if log is not None and log.file is not None:
            text = str(e) if isinstance(e, SystemExit) and isinstance(e.code, str) else f"error: {one_line(e)}"
            log.write(text + "\n")
        raise
    finally:
        sys.stdout, sys.stderr = out, err
        for logger in lightning:
            logger.removeHandler(handler)
        if log is not None:
            log.close()
        _restore_width(old_width, old_columns, wide)


def _restore_width(width: int, columns: str | None, wide: bool) -> None:
    if not wide:
        return
    console.width = width
    if columns is None:
        os.environ.pop("COLUMNS", None)
    else:
        os.environ["COLUMNS"] = columns


class ProgressBar(RichProgressBar):
    """Lightning's Rich progress bar with epochs counted from 1 (``Epoch 1/12`` … ``Epoch 12/12``); each
    epoch's bar stops once its validation is in, so the last epoch is drawn once, with its own numbers.

    Args:
        **kwargs: :class:`~pytorch_lightning.callbacks.RichProgressBar`'s options (``leave``, ``theme``, ...).
    """

    def _get_train_description(self, current_epoch: int) -> str:
        total = self.trainer.max_epochs
        text = f"Epoch {current_epoch + 1}" + (f"/{total}" if total is not None and total > 0 else "")
        return f"{text:{len(self.validation_description)}}"

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
        last_step = trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps
        if last_epoch or last_step or trainer.should_stop:
            self._stop_progress()  # before Lightning's "fit stopped" line, which would otherwise split the bar


def keep_csv(loggers: list[Any], out_dir: Path) -> list[Any]:
    """``loggers`` with the CSV logger first: added (``<out_dir>/csv/metrics.csv``, as ``logger=csv`` writes it)
    when the configured loggers (``logger=wandb``, ``logger=[tensorboard]``) have none. A symbolic link at the CSV
    logger's ``metrics.csv`` or ``hparams.yaml`` is removed first (:func:`clear_links`).

    Args:
        loggers: the instantiated ``logger`` group.
        out_dir: the run folder.
    """
    if not any(isinstance(lg, CSVLogger) for lg in loggers):
        loggers = [ResumableCSVLogger(save_dir=str(out_dir), name="csv", version=""), *loggers]
    for lg in loggers:
        if isinstance(lg, CSVLogger):  # its files are written in place of a symbolic link, never through it
            clear_links(Path(lg.log_dir), ("metrics.csv", "hparams.yaml"))
    return list(loggers)
