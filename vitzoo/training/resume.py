"""Crash-safe training: ``ckpt_path=auto`` resume, atomic checkpoints, a CSV log that survives a resume,
RNG state in checkpoints, a stop on non-finite loss and interrupt status.

Each piece plugs into what Lightning already does (a ``CheckpointIO`` plugin, ``Callback`` state,
a ``CSVLogger`` subclass) instead of replacing it.
"""
from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from vitzoo.fileio import atomic_path, atomic_write_text
from vitzoo.registry import ConfigError
from vitzoo.training.utils import read_checkpoint

AUTO = "auto"  # ckpt_path=auto: the run folder's latest checkpoint, or a fresh start


def say(message: str) -> None:
    """Print one line on rank 0."""
    if rank_zero_only.rank == 0:
        print(message, flush=True)


def checkpoints_newest_first(out_dir: Path) -> list[Path]:
    """The run folder's ``checkpoints/*.ckpt`` (symlinks left out), newest first (``last.ckpt`` first on a tie)."""
    folder = Path(out_dir) / "checkpoints"
    if not folder.is_dir() or folder.is_symlink():
        return []
    found = [p for p in folder.glob("*.ckpt") if p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"), reverse=True)


def latest_checkpoint(out_dir: Path) -> Optional[Path]:
    """The newest readable checkpoint of the run folder: ``last.ckpt`` normally; when it is truncated or
    corrupt, the next newest (e.g. ``best-epoch003.ckpt``), each skipped file named in one line."""
    for path in checkpoints_newest_first(out_dir):
        try:
            read_checkpoint(path)
            return path
        except ConfigError as e:
            say(f"ckpt_path=auto: skipping {path.name}: {e}")
    return None


def previous_status(out_dir: Path) -> Optional[str]:
    """The ``status`` in an existing ``results.json`` of the run folder (None if there is none)."""
    try:
        return json.loads((Path(out_dir) / "results.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def check_fresh_folder(out_dir: Path, status: Optional[str]) -> None:
    """A fresh run needs a folder without another run's results (``results.json`` of a run that trained, or
    checkpoints): one line naming ``ckpt_path=auto`` (resume that run) and a new folder (start over).

    Args:
        out_dir: the run folder.
        status: the previous ``results.json`` status (None if there is none).
    """
    if rank_zero_only.rank != 0:  # the other processes of a launched job (DDP) find rank 0's fresh results.json
        return
    has_ckpts = bool(checkpoints_newest_first(out_dir))
    if status in ("finished", "interrupted", "running") or has_ckpts:
        held = f"results.json says {status}" if status else "it holds checkpoints"
        raise ConfigError(
            f"{out_dir} belongs to another run ({held}); resume it with ckpt_path=auto, or start over "
            f"in a new folder (hydra.run.dir=<new folder>)"
        )


def resolve_ckpt_path(ckpt_path: Any, out_dir: Path) -> tuple[Optional[str], Optional[str]]:
    """``(checkpoint to resume from or None, status of the previous run)``; ``auto`` picks the run's latest.

    A previous ``results.json`` that still says ``running`` belongs to a killed run (SIGKILL, power
    loss): it is reported, and treated, as ``interrupted``.

    Args:
        ckpt_path: the ``ckpt_path`` option: null, ``auto`` or a file.
        out_dir: the run folder (``hydra.run.dir``).
    """
    status = previous_status(out_dir)
    if status == "running":
        status = "interrupted"
        say(f"{out_dir}/results.json said 'running': the previous run was killed; treating it as interrupted")
    if not ckpt_path:
        check_fresh_folder(out_dir, status)
        return None, status
    if str(ckpt_path) != AUTO:
        return str(ckpt_path), status
    found = latest_checkpoint(out_dir)
    if found is None:
        say(f"ckpt_path=auto: no checkpoint in {Path(out_dir) / 'checkpoints'}; starting fresh")
        return None, status
    say(f"ckpt_path=auto: resuming from {found}")
    return str(found), status


def interrupted(exc: BaseException) -> bool:
    """True for SIGTERM (Lightning's SIGTERMException) and SIGINT (KeyboardInterrupt, or Lightning's exit after it)."""
    return isinstance(exc, (KeyboardInterrupt, SIGTERMException)) or isinstance(exc.__context__, KeyboardInterrupt)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but a crash mid-write never leaves a truncated ``.ckpt``: Lightning writes
    into the fresh temporary file of :func:`vitzoo.fileio.atomic_path`, which is then renamed over the target. A
    folder in the way (e.g. a ``last.ckpt/`` made by hand) is replaced by the checkpoint."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)


class Checkpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (best by a metric) that rewrites ``last.ckpt`` after every epoch (Lightning
    2.6 does only when the epoch is a new best) and every ``every_n_train_steps`` optimizer steps, so a crash
    loses at most that many steps. A file name is always the one configured (no ``last-v1.ckpt``): a stale,
    broken or empty file of that name is replaced. A run folder that was moved or copied resumes in place: the
    checkpoint paths the resumed state holds are taken to be in this folder, so ``last.ckpt`` stays the newest
    state and the older best checkpoints are pruned as usual.

    Args:
        dirpath: folder of the ``.ckpt`` files.
        filename: name pattern of the best checkpoint, e.g. ``best-epoch{epoch:03d}``.
        monitor: metric that picks the best checkpoint (e.g. ``val/acc``).
        mode: ``max`` or ``min`` for ``monitor``.
        save_top_k: how many best checkpoints to keep.
        save_last: also keep ``last.ckpt`` (needed for ``ckpt_path=auto``).
        auto_insert_metric_name: let Lightning add ``monitor=value`` to the file name.
        every_n_epochs: save after every N epochs' validation.
        every_n_train_steps: also rewrite ``last.ckpt`` every N steps (None: epochs only).
    """

    def __init__(self, dirpath: str, filename: str, monitor: str, mode: str = "max", save_top_k: int = 1,
                 save_last: bool = True, auto_insert_metric_name: bool = False, every_n_epochs: int = 1,
                 every_n_train_steps: Optional[int] = None):
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            mode=mode,
            save_top_k=save_top_k,
            save_last=save_last,
            auto_insert_metric_name=auto_insert_metric_name,
            every_n_epochs=every_n_epochs,
            enable_version_counter=False,
        )
        if every_n_train_steps is not None and int(every_n_train_steps) <= 0:
            raise ConfigError(
                f"callbacks.model_checkpoint.every_n_train_steps must be a positive integer or null "
                f"(got {every_n_train_steps})"
            )
        self.every_steps = int(every_n_train_steps) if every_n_train_steps else 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("dirpath")
        if saved and self.dirpath and os.path.normpath(str(saved)) != os.path.normpath(self.dirpath):
            state_dict = moved_checkpoint_state(state_dict, self.dirpath)
        super().load_state_dict(state_dict)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        last_of_epoch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch  # the epoch-end save follows
        if (
            self.every_steps
            and self.save_last
            and trainer.global_step % self.every_steps == 0
            and not last_of_epoch
            and not self._should_skip_saving_checkpoint(trainer)
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last(trainer)

    def _save_last(self, trainer: pl.Trainer) -> None:
        """``last.ckpt`` after every epoch (Lightning writes it only when the epoch also saved a new best)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def moved_checkpoint_state(state: dict[str, Any], dirpath: str) -> dict[str, Any]:
    """``ModelCheckpoint`` state saved in another folder (the run folder was moved or copied), with every
    checkpoint path in that folder put into ``dirpath``.

    Args:
        state: the saved state (``dirpath``, ``best_model_path``, ``best_k_models``, ...).
        dirpath: the checkpoint folder of this run.
    """
    old = os.path.normpath(str(state["dirpath"]))

    def here(path: Any) -> Any:
        if isinstance(path, str) and path and os.path.normpath(os.path.dirname(path)) == old:
            return os.path.join(dirpath, os.path.basename(path))
        return path

    moved = {k: here(state.get(k)) for k in ("best_model_path", "kth_best_model_path", "last_model_path")}
    best_k = {here(k): v for k, v in (state.get("best_k_models") or {}).items()}
    return {**state, **moved, "best_k_models": best_k, "dirpath": dirpath}


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer that keeps an existing ``metrics.csv`` and its columns (a resumed run appends)."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                header = f.readline().strip()
            self.metrics_keys = sorted(k for k in header.split(",") if k)


def drop_rows_from(metrics_file: Path, step: int) -> None:
    """Remove the rows of ``metrics.csv`` logged at ``step`` or later (those of the part of a killed run that the
    resumed checkpoint does not hold), so each step and epoch appears once.

    Args:
        metrics_file: the CSV file (nothing happens if it does not exist).
        step: the resumed checkpoint's ``global_step``.
    """
    if not metrics_file.is_file() or metrics_file.is_symlink():
        return
    with open(metrics_file, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "step" not in rows[0]:
        return
    col = rows[0].index("step")
    kept = [rows[0]] + [r for r in rows[1:] if len(r) > col and r[col] and int(float(r[col])) < step]
    if len(kept) < len(rows):
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(kept)
        atomic_write_text(metrics_file, out.getvalue())


class ResumableCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger``; a resumed run appends to ``metrics.csv`` (new columns are merged into the
    header) instead of crashing with "dict contains fields not in fieldnames". With ``resume_step`` set (the
    resumed checkpoint's global step), the rows the killed run logged after that checkpoint are dropped first."""

    resume_step: Optional[int] = None

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None and rank_zero_only.rank == 0:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            if self.resume_step is not None:
                drop_rows_from(Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE, self.resume_step)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment if self._experiment is not None else super().experiment


class TrainingDiverged(ConfigError):
    """The loss became NaN or infinite (one line, naming the step and the options to change)."""


class StopOnNonFinite(pl.Callback):
    """Stop before the update when the loss or a gradient is NaN/inf on any rank: the weights and the checkpoints
    on disk stay those of the last good step. Raises :class:`TrainingDiverged`, one line naming the step, the loss
    or the first parameter whose gradient is non-finite, and the last checkpoint. Under a float16 gradient scaler
    non-finite gradients are the scaler's to skip, so only the loss is watched there."""

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        bad = trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss.detach()).all()), all=False)
        if bad:
            self._stop(trainer, f"train/loss is {loss.item()}")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        name = first_non_finite_grad(pl_module)
        if trainer.strategy.reduce_boolean_decision(name is not None, all=False):
            self._stop(trainer, f"the gradient of {name or 'a parameter on another rank'} is not finite")

    @staticmethod
    def _stop(trainer: pl.Trainer, what: str) -> None:
        ckpt = trainer.checkpoint_callback
        last = (ckpt.last_model_path or ckpt.best_model_path) if ckpt is not None else ""
        raise TrainingDiverged(
            f"{what} at step {trainer.global_step} (epoch {trainer.current_epoch}); stopped before the update, "
            f"last good checkpoint: {last or 'none'}; lower optim.lr or raise optim.warmup_epochs"
        )


def first_non_finite_grad(module: torch.nn.Module) -> Optional[str]:
    """The name of the first parameter (in ``named_parameters`` order) whose gradient holds a NaN or inf, or None.
    One largest-magnitude reduction per gradient (no overflow, NaN propagates) and one host sync when all are finite.

    Args:
        module: the model.
    """
    named = [(n, p.grad) for n, p in module.named_parameters() if p.grad is not None]
    if not named:
        return None
    peaks = torch._foreach_norm([g.detach() for _, g in named], float("inf"))
    finite = torch.stack([t.float() for t in peaks]).isfinite()
    if bool(finite.all()):
        return None
    return named[int((~finite).nonzero()[0])][0]


class RngState(pl.Callback):
    """Saves the torch, numpy and Python RNG states in every checkpoint and restores them on resume, so a run
    resumed at an epoch boundary draws the same dropout/augmentation numbers as an uninterrupted one."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        version, state, gauss = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
            "numpy": [str(kind), int(pos), int(has_gauss), float(cached)],
            "python": [version, list(state), gauss],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        kind, pos, has_gauss, cached = state_dict["numpy"]
        np.random.set_state((kind, state_dict["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
        version, state, gauss = state_dict["python"]
        random.setstate((version, tuple(state), gauss))


def fsdp_strategy(
    sharding_strategy: str = "FULL_SHARD",
    state_dict_type: str = "full",
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
) -> Any:
    """Lightning's ``FSDPStrategy`` wrapping every transformer block (ViT and Swin) in its own FSDP unit.

    Args:
        sharding_strategy: ``FULL_SHARD`` (parameters, gradients, optimizer state), ``SHARD_GRAD_OP`` or ``NO_SHARD``.
        state_dict_type: ``full`` (one ordinary ``.ckpt`` that eval.py and resume read) or ``sharded``.
        activation_checkpointing: recompute block activations in backward (less memory, ~30% slower).
        cpu_offload: keep sharded parameters on the CPU between uses.
    """
    from pytorch_lightning.strategies import FSDPStrategy

    from vitzoo.layers.block import Block

    return FSDPStrategy(
        auto_wrap_policy={Block},
        sharding_strategy=sharding_strategy,
        state_dict_type=state_dict_type,
        activation_checkpointing_policy={Block} if activation_checkpointing else None,
        cpu_offload=cpu_offload,
    )
