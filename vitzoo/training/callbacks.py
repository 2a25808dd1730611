"""Callbacks: training throughput and an EMA of the weights (Lightning),
a sweep summary at the end of a multirun (Hydra)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig
from pytorch_lightning.callbacks import EMAWeightAveraging

from vitzoo.fileio import read_regular_text
from vitzoo.training.segments import Clock, FitState, wall_clock


class ImagesPerSecond(FitState):
    """Training throughput in images/s: from the end of one step to the end of the next (data loading
    included); the first step of an epoch or after validation counts from its own start. The first step of
    each process (lazy initialisation) is not timed. Logs ``train/images_per_s`` once per epoch;
    :attr:`images_per_s` is the average over the whole run, all its segments: every checkpoint holds the images
    and seconds timed up to its writing, and a resumed fit counts on from them.

    Args:
        clock: seconds of a monotonic clock (None: :func:`vitzoo.training.segments.wall_clock`).
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self.clock = clock or wall_clock
        self.images, self.seconds, self.steps = 0, 0.0, 0
        self._epoch_images, self._epoch_seconds = 0, 0.0
        self._last: Optional[float] = None
        self._start = 0.0

    @property
    def images_per_s(self) -> Optional[float]:
        images, seconds = self.images + self._epoch_images, self.seconds + self._epoch_seconds
        return images / seconds if seconds > 0 else None

    def state_dict(self) -> dict[str, Any]:
        return {"images": self.images + self._epoch_images, "seconds": self.seconds + self._epoch_seconds}

    def restore(self, state_dict: dict[str, Any]) -> None:
        self.images, self.seconds = int(state_dict.get("images", 0)), float(state_dict.get("seconds", 0.0))
        self._epoch_images, self._epoch_seconds = 0, 0.0

    def _now(self, pl_module: pl.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return self.clock()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last, self._epoch_images, self._epoch_seconds = None, 0, 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = None  # validation time is not training time

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = self._now(pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self._now(pl_module)
        if self.steps > 0:
            self._epoch_images += len(batch[0]) * trainer.world_size
            self._epoch_seconds += now - (self._last if self._last is not None else self._start)
        self.steps += 1
        self._last = now

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        images, seconds = self._epoch_images, self._epoch_seconds
        self.images, self.seconds = self.images + images, self.seconds + seconds
        self._epoch_images, self._epoch_seconds = 0, 0.0
        if seconds > 0:
            pl_module.log("train/images_per_s", images / seconds, on_epoch=True, sync_dist=True)


class EMA(EMAWeightAveraging):
    """Lightning's ``EMAWeightAveraging``: validation and checkpoints use the exponential moving average of
    the weights, and the module holds it after training. Once training ends the average is dropped, so the
    final ``trainer.validate(ckpt_path=best)`` evaluates the best checkpoint's (EMA) weights as loaded
    instead of swapping in the last average.

    Args:
        decay: weight of the running average per update (0.999: a horizon of about 1,000 steps).
        update_every_n_steps: average every N optimizer steps.
        update_starting_at_step: first step averaged (None: from the start).
    """

    def __init__(
        self, decay: float = 0.999, update_every_n_steps: int = 1, update_starting_at_step: Optional[int] = None
    ):
        super().__init__(
            decay=decay, update_every_n_steps=update_every_n_steps, update_starting_at_step=update_starting_at_step
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._average_model = None

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average_model is not None:  # resuming a fit; outside it the state_dict already is the average
            super().on_load_checkpoint(trainer, pl_module, checkpoint)


def _job_results(path: Path) -> dict[str, Any]:
    """A job's ``results.json`` for the sweep summary: read only if it is a regular file (a FIFO planted there is
    refused, never opened for a blocking read), its numbers kept only where they are finite numbers; anything
    else is a row whose status names the problem."""
    try:
        data = json.loads(read_regular_text(path, 1 << 20))
    except (OSError, ValueError) as e:
        return {"status": f"unreadable results.json ({getattr(e, 'strerror', None) or type(e).__name__})"}
    if not isinstance(data, dict):
        return {"status": "invalid results.json"}
    for key in ("best_val_acc", "train_images_per_s", "gmacs"):
        value = data.get(key)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
            data[key] = None
    numbers = ("best_val_acc", "train_images_per_s", "gmacs")
    return {k: v if k in numbers or v is None or isinstance(v, str) else str(v) for k, v in data.items()}


class SweepSummary(HydraCallback):
    """Hydra callback: before a multirun's first job, check that ``record_dir`` is writable and the data is
    present (one ``error:`` line and no job started otherwise); after it, print one line per job from its
    ``results.json`` and exit non-zero when any job failed (the failed jobs do not stop the sweep; see
    ``run_entry``)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from vitzoo.registry import ConfigError
        from vitzoo.training.records import check_record_dir
        from vitzoo.training.safe_load import safe_instantiate

        swept = _swept_keys(config)
        try:
            if config.get("record_dir") and "record_dir" not in swept:
                check_record_dir(config.record_dir)
            if config.get("data") is not None and not swept & {"data", "experiment"}:
                safe_instantiate(config.data, "data", "data").prepare_data()  # data.root present (or downloaded)
        except ConfigError as e:
            raise SystemExit(f"error: {e}; no job of the sweep started") from None
        except Exception:  # noqa: BLE001 - a config only a job can build (its interpolations): each job checks it
            pass

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rich.console import Console
        from rich.table import Table

        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = sorted(sweep_dir.glob("*/results.json"), key=_job_order)
        rows = [_job_results(p) | {"dir": p.parent.name} for p in jobs]
        if not rows:
            return
        table = Table(title=f"sweep {sweep_dir}")
        for col in ("job", "status", "model", "attention", "data", "val acc", "train img/s", "GMACs"):
            table.add_column(col, no_wrap=True)
        for r in rows:
            acc, ips, gmacs = r.get("best_val_acc"), r.get("train_images_per_s"), r.get("gmacs")
            table.add_row(
                r["dir"],
                r.get("status", "?"),
                str(r.get("model")),
                str(r.get("attention")),
                str(r.get("data")),
                f"{acc:.4f}" if acc is not None else "-",
                f"{ips:.0f}" if ips else "-",
                f"{gmacs:.3f}" if gmacs is not None else "-",
            )
        console = Console()
        console.print(table)
        for r in rows:
            if r.get("error"):
                console.print(f"{r['dir']}: {r['error']}", soft_wrap=True)
        failed = [r["dir"] for r in rows if r.get("status") != "finished"]
        if failed:
            raise SystemExit(f"{len(failed)} of {len(rows)} jobs failed: {', '.join(failed)} (see their results.json)")


class RunFolderLinks(HydraCallback):
    """Hydra callback: every file of a run folder is written as a file, never through a symbolic link left there:
    before Hydra writes ``.hydra/`` and the job log, :func:`vitzoo.training.run_log.clear_links` runs on the run
    folder (or on each existing job folder of a sweep: a rerun into the same sweep folder)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._clear([Path(str(config.hydra.run.dir))], config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        if sweep.is_dir() and not sweep.is_symlink():
            self._clear([p for p in sorted(sweep.iterdir()) if p.is_dir() and not p.is_symlink()], config)

    @staticmethod
    def _clear(folders: list[Path], config: DictConfig) -> None:
        from vitzoo.registry import ConfigError
        from vitzoo.training.run_log import RUN_FILES, clear_links

        try:
            for folder in folders:
                if folder.is_dir() and not folder.is_symlink():
                    clear_links(folder, (*RUN_FILES, f"{config.hydra.job.name}.log"))
        except (ConfigError, OSError) as e:
            raise SystemExit(f"error: {e}") from None


def _swept_keys(config: DictConfig) -> set[str]:
    """The top-level keys a multirun sweeps (``data=a,b``, ``data.root=x,y``, ``hydra.sweeper.params``): their
    value in ``config`` is not what the jobs get, so the checks before the first job leave them alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = config.get("hydra") or {}
    task = list((hydra.get("overrides") or {}).get("task") or [])
    keys = {o.key_or_group for o in OverridesParser.create().parse_overrides(task) if o.is_sweep_override()}
    keys |= set((hydra.get("sweeper") or {}).get("params") or {})
    return {k.lstrip("+~").split(".")[0].split("@")[0] for k in keys}


def _job_order(path: Path) -> tuple[int, str]:
    """Job folders ``<num>_<name>`` in job-number order (2 before 10)."""
    num = path.parent.name.split("_")[0]
    return (int(num) if num.isdigit() else -1, path.parent.name)
