"""``evaluate(cfg)``: what ``python eval.py ckpt_path=…`` runs (configs/eval.yaml).

The model is rebuilt from the checkpoint's own hyper-parameters; the data is the checkpoint's
training data config unless ``data=<group>`` picks another (``+data.key=value`` changes one option
of the checkpoint's data). Reports top-1, top-5, loss, inference images/s, params and GMACs,
prints them and writes ``eval.json`` into the eval run's own folder (``paths.output_dir``), printing its
path. A report never replaces another one (``-2``, ``-3`` … are added to the name) and is never written
through a symlink. :func:`load_trained` is how the commands that run a trained model (``scripts/export.py``,
``scripts/predict.py``) read a checkpoint or an export folder.

Preprocessing belongs to the model: the mean, std and image size saved with the checkpoint (the
``data`` hyper-parameter) are used whatever data group supplies the images; a different value given
explicitly on the command line (``data.mean=[...]``) is used and printed as a warning line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from rich.table import Table
from torch import nn

from vitzoo.export import load_model
from vitzoo.flops import count_flops
from vitzoo.measure.memory import PeakMemory
from vitzoo.models import attention_spec
from vitzoo.registry import ConfigError
from vitzoo.training.module import load_checkpoint_net, module_from_checkpoint
from vitzoo.training.run_checks import check_img_size
from vitzoo.training.safe_load import checkpoint_hparams, safe_instantiate, saved_data_config
from vitzoo.training.train import build_datamodule
from vitzoo.training.utils import (
    benchmark_config,
    console,
    flops_table,
    read_checkpoint,
    trainer_throughput,
    write_traceback,
)
from vitzoo.untrusted import free_path, write_new

PREPROCESSING = ("img_size", "mean", "std")  # data options that belong to the model


def command_line_keys(cfg: DictConfig) -> set[str]:
    """The ``data.*`` options set on the command line (``data.mean=...``, ``+data.std=...``, ``++data.img_size=...``).

    Args:
        cfg: the composed eval config (its Hydra overrides come from ``hydra.overrides.task`` or the running Hydra).
    """
    from hydra.core.hydra_config import HydraConfig

    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if overrides is None:
        overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    keys = {str(o).split("=", 1)[0].lstrip("+~") for o in overrides if "=" in str(o)}
    return {k[len("data."):] for k in keys if k.startswith("data.")}


def model_preprocessing(data: dict[str, Any], saved: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """``data`` with the checkpoint's ``img_size``/``mean``/``std`` (``saved``) unless ``explicit`` names them.

    An explicit value that differs from the checkpoint's is kept and printed as a ``warning:`` line.

    Args:
        data: the resolved data config to evaluate on.
        saved: the checkpoint's ``data`` hyper-parameter (``VitModule``'s ``data``: name, img_size, mean, std).
        explicit: data options given on the command line.
    """
    out = dict(data)
    for key in PREPROCESSING:
        if saved.get(key) is None:
            continue
        model_value = saved[key] if key == "img_size" else [float(v) for v in saved[key]]
        given = out.get(key)
        given = [float(v) for v in given] if isinstance(given, (list, tuple)) else given
        if key in explicit and given is not None and given != model_value:
            console.print(f"warning: data.{key}={given} differs from the checkpoint's {model_value} "
                          f"(the model was trained with it)", soft_wrap=True, markup=False)
            continue
        out[key] = model_value
    return out


def data_config(cfg: DictConfig, ckpt: dict[str, Any]) -> DictConfig:
    """The data config to evaluate on: ``data=<group>`` if given, else the checkpoint's, with ``+data.*`` on top."""
    chosen = OmegaConf.to_container(cfg.data, resolve=False) if cfg.get("data") is not None else {}
    source = f"ckpt_path={cfg.ckpt_path}"
    saved = saved_data_config(ckpt.get("config"), source)  # plain data naming a vitzoo data module (or None)
    if "_target_" not in chosen and saved is None:
        raise ConfigError("the checkpoint has no saved data config; choose one with data=<digits|cifar10|...>")
    base = {} if "_target_" in chosen else saved
    # `${model.img_size}` in the data group resolves against the checkpoint's model
    scope = OmegaConf.create({"model": checkpoint_hparams(ckpt, source)["model"], "data": base})
    merged = OmegaConf.to_container(OmegaConf.merge(scope, {"data": chosen}), resolve=True)  # resolved here, in scope
    saved_pre = checkpoint_hparams(ckpt, source).get("data") or {}
    return OmegaConf.create(model_preprocessing(merged["data"], dict(saved_pre), command_line_keys(cfg)))


def write_report(report: dict[str, Any], folder: Path) -> Path:
    """Write the report as a new ``eval.json`` (``eval-2.json`` … when taken) in the eval run's folder.

    Args:
        report: the eval report.
        folder: the eval run's own folder (``paths.output_dir``).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return write_new(free_path(folder / "eval.json"), json.dumps(report, indent=2) + "\n")
    except OSError as e:
        raise ConfigError(f"cannot write the eval report into {folder} ({e.strerror}); "
                          f"choose a writable hydra.run.dir") from None


def load_trained(path: Union[str, Path]) -> tuple[nn.Module, dict[str, Any]]:
    """The network (eval mode) of a training checkpoint or an export folder, and the preprocessing saved with it.

    Args:
        path: a ``.ckpt`` written by vitzoo training, or an export folder (or a file in it).
    """
    p = Path(path).expanduser()
    if p.suffix == ".ckpt":
        return load_checkpoint_net(p)
    model = load_model(p)
    return model, dict(model.export_config.get("data") or {})


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate a checkpoint as configured; return (and write) the report."""
    try:
        return _evaluate(cfg)
    except Exception as e:
        if not isinstance(e, ConfigError) and cfg.get("paths"):
            write_traceback(e, Path(cfg.paths.output_dir))
        raise


def _evaluate(cfg: DictConfig) -> dict[str, Any]:
    pl.seed_everything(cfg.get("seed", 0), verbose=False)
    bench = benchmark_config(cfg.get("benchmark"))
    ckpt = read_checkpoint(cfg.get("ckpt_path"))
    path = Path(str(cfg.ckpt_path)).expanduser().resolve()
    data = data_config(cfg, ckpt)
    check_img_size(data.get("img_size"), "data.img_size")  # the checkpoint's preprocessing is read from a file
    dm = build_datamodule(data)
    module = module_from_checkpoint(ckpt, f"ckpt_path={cfg.ckpt_path}")  # plain data -> registries, then the weights
    if dm.num_classes != module.net.cfg.num_classes:
        raise ConfigError(f"data={dm.name} has {dm.num_classes} classes but the checkpoint's model has "
                          f"{module.net.cfg.num_classes}; choose matching data")
    model_name, attention_name = module.hparams.model["name"], attention_spec(module.net)["name"]
    report = count_flops(module.net)
    console.print(flops_table(report, f"{model_name} + attention={attention_name}"))

    trainer = safe_instantiate(
        cfg.trainer,
        "trainer",
        "trainer",
        logger=False,
        callbacks=[],
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    memory = PeakMemory(trainer.strategy.root_device)  # the same measure as training's peak_memory_mb
    memory.start()
    metrics = trainer.validate(module, datamodule=dm, verbose=False)[0]
    infer = trainer_throughput(trainer, module.net, bench)
    peak_mb = memory.peak_mb()
    out = {
        "ckpt_path": str(path),
        "model": model_name,
        "attention": attention_name,
        "data": dm.name,
        "num_val_images": len(dm.val_set),
        "preprocessing": {"img_size": dm.img_size, "mean": list(dm.mean), "std": list(dm.std)},
        "val_acc": float(metrics["val/acc"]),
        "val_acc5": float(metrics["val/acc5"]),
        "val_loss": float(metrics["val/loss"]),
        "infer_images_per_s": infer,
        "infer_batch_size": bench.batch_size,
        "peak_memory_mb": peak_mb,
        "params": report.params,
        "gmacs": report.measured / 1e9,
        "gmacs_analytic": report.analytic / 1e9,
    }
    report_path = write_report(out, Path(cfg.paths.output_dir) if cfg.get("paths") else Path.cwd())
    out["report_path"] = str(report_path)

    table = Table(title=f"eval {path.name} on {dm.name} ({out['num_val_images']} images)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("val_acc", "val_acc5", "val_loss", "infer_images_per_s", "params", "gmacs", "gmacs_analytic"):
        v = out[key]
        table.add_row(key, f"{v:.4f}" if isinstance(v, float) else str(v))
    console.print(table)
    console.print(f"report -> {report_path}")
    return out


__all__ = ["data_config", "evaluate", "load_trained"]
