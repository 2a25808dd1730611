"""``train(cfg)``: what ``python train.py …`` runs (configs/train.yaml).

Order: results.json (status running) -> data (checked) -> model (checked) -> FLOPs table -> fit ->
validate the best checkpoint -> export -> inference throughput -> results.json (finished). Any
error before fit is a one-line ConfigError, so nothing trains on a bad config.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from vitzoo.export import export_model
from vitzoo.flops import count_flops
from vitzoo.registry import ConfigError
from vitzoo.training.callbacks import ImagesPerSecond
from vitzoo.training.data import ImageDataModule
from vitzoo.training.module import VitModule
from vitzoo.training.utils import (ResultsFile, benchmark_config, console, flops_table, one_line, peak_memory_mb,
                                   read_checkpoint, trainer_throughput, write_traceback)


def build_datamodule(data_cfg: Any) -> ImageDataModule:
    """Instantiate the ``data`` config and load it (errors are one-line ConfigErrors naming ``data.*``)."""
    dm = instantiate(data_cfg)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def model_options(model_cfg: dict[str, Any], num_classes: int) -> dict[str, Any]:
    """``model`` config with ``num_classes`` taken from the data (null) or checked against it."""
    options = dict(model_cfg)
    if options.get("num_classes") is None:
        options["num_classes"] = num_classes
    elif int(options["num_classes"]) != num_classes:
        raise ConfigError(f"model.num_classes={options['num_classes']} but the data has {num_classes} classes; "
                          f"drop the override (it follows data.num_classes)")
    return options


def build_module(container: dict[str, Any], dm: ImageDataModule) -> VitModule:
    """The LightningModule for a resolved run config (``num_classes`` from the data)."""
    module = VitModule(model=model_options(container["model"], dm.num_classes), attention=container["attention"],
                       optim=container.get("optim"), data=dm.describe())
    module.run_config = container  # saved into every checkpoint under "config"
    return module


def instantiate_all(group: Optional[DictConfig]) -> list[Any]:
    """Instantiate every ``_target_`` entry of a ``callbacks``/``logger`` group (null entries skipped)."""
    return [instantiate(c) for c in (group or {}).values() if c is not None and "_target_" in c]


def fit(cfg: DictConfig) -> tuple[dict[str, Any], VitModule]:
    """Train as configured; return the final ``results.json`` content and the trained module (best weights).

    Raises the error after recording ``status: failed`` and a one-line ``error`` in results.json.
    """
    out_dir = Path(cfg.paths.output_dir)
    results = ResultsFile(out_dir / "results.json", status="running", model=cfg.model.name, attention=cfg.attention.name,
                          data=cfg.data.name)
    try:
        return _fit(cfg, out_dir, results)
    except BaseException as e:
        results.update(status="failed", error=one_line(e))
        if not isinstance(e, ConfigError):
            write_traceback(e, out_dir)
        raise


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train as configured (see :func:`fit`); return the content of ``results.json``."""
    return fit(cfg)[0]


def _fit(cfg: DictConfig, out_dir: Path, results: ResultsFile) -> tuple[dict[str, Any], VitModule]:
    start = time.perf_counter()
    container = OmegaConf.to_container(cfg, resolve=True)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # per run, also within a multirun
    if cfg.get("ckpt_path"):
        read_checkpoint(cfg.ckpt_path)  # resume: fail now, in one line, if it is missing or not a checkpoint
    bench = benchmark_config(container.get("benchmark"))
    dm = build_datamodule(cfg.data)
    module = build_module(container, dm)

    report = count_flops(module.net)
    if rank_zero_only.rank == 0:
        console.print(flops_table(report, f"{cfg.model.name} + attention={cfg.attention.name}"))
    results.update(params=report.params, gmacs=report.measured / 1e9, gmacs_analytic=report.analytic / 1e9)

    speed = ImagesPerSecond()
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=instantiate_all(cfg.get("callbacks")) + [speed],
                                      logger=instantiate_all(cfg.get("logger")) or False)
    trainer.fit(module, datamodule=dm, ckpt_path=cfg.get("ckpt_path"))

    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    metrics = trainer.validate(module, datamodule=dm, ckpt_path=best, verbose=False)[0]  # loads the best weights

    export_dir = out_dir / "export" if cfg.get("export", True) else None
    if export_dir is not None and rank_zero_only.rank == 0:
        export_model(module.net, export_dir, data=dm.describe())
    infer = trainer_throughput(trainer, module.net, bench)
    final = results.update(
        status="finished", best_val_acc=float(metrics["val/acc"]), best_val_acc5=float(metrics["val/acc5"]),
        val_loss=float(metrics["val/loss"]), train_images_per_s=speed.images_per_s, infer_images_per_s=infer,
        peak_memory_mb=peak_memory_mb(trainer.strategy.root_device), epochs=trainer.current_epoch, best_ckpt=best,
        export_dir=str(export_dir) if export_dir else None, wall_s=time.perf_counter() - start, output_dir=str(out_dir))
    if rank_zero_only.rank == 0:
        console.print(f"[bold]{cfg.model.name} + {cfg.attention.name} on {cfg.data.name}[/]: val acc {final['best_val_acc']:.4f} "
                      f"(top-5 {final['best_val_acc5']:.4f}), train {final['train_images_per_s'] or 0:.0f} img/s, "
                      f"inference {infer:.0f} img/s, {final['wall_s']:.0f} s -> {out_dir / 'results.json'}")
    return final, module
