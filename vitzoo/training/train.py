"""``train(cfg)``: what ``python train.py …`` runs (configs/train.yaml).

Order: results.json (status running) -> data (checked) -> model (checked) -> FLOPs table -> fit ->
validate the best checkpoint -> export -> inference throughput -> results.json (finished). Any
error before fit is a one-line ConfigError, so nothing trains on a bad config.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from vitzoo.data.datamodules import ImageDataModule
from vitzoo.export import export_model
from vitzoo.fileio import atomic_write_text
from vitzoo.flops import count_flops
from vitzoo.flops.mfu import matmul_peak, mfu, precision_dtype
from vitzoo.measure.environment import git_commit
from vitzoo.measure.memory import PeakMemory
from vitzoo.measure.predicted import amp_dtype, predicted_memory
from vitzoo.registry import ConfigError
from vitzoo.training.callbacks import ImagesPerSecond
from vitzoo.training.history import ValHistory
from vitzoo.training.module import VitModule
from vitzoo.training.records import check_record_dir, existing_record, save_record
from vitzoo.training.resume import (
    AtomicCheckpointIO,
    ResumableCSVLogger,
    RngState,
    StopOnNonFinite,
    interrupted,
    previous_status,
    resolve_ckpt_path,
    say,
)
from vitzoo.training.run_checks import check_run_options
from vitzoo.training.run_log import keep_csv, run_console
from vitzoo.training.run_overrides import (
    RunOverrides,
    check_same_run,
    hydra_overrides,
    resolved_sections,
    resume_command,
    resume_source,
)
from vitzoo.training.safe_load import instantiate_group, safe_instantiate
from vitzoo.training.segments import ElapsedTime, TrainingPeakMemory
from vitzoo.training.utils import (
    ResultsFile,
    benchmark_config,
    console,
    flops_table,
    make_run_folder,
    one_line,
    read_checkpoint,
    trainer_throughput,
    unwrap_worker_error,
    write_traceback,
)


def build_datamodule(data_cfg: Any) -> ImageDataModule:
    """Instantiate the ``data`` config and load it (errors are one-line ConfigErrors naming ``data.*``)."""
    dm = safe_instantiate(data_cfg, "data", "data")
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
    if module.mixup is not None and dm.batch_size % 2:  # timm's Mixup pairs each image with its mirror in the batch
        raise ConfigError(f"optim.mixup_alpha/cutmix_alpha need an even data.batch_size (got {dm.batch_size})")
    compile_net = container.get("compile", False)
    if not isinstance(compile_net, bool):
        raise ConfigError(f"compile must be true or false (got {compile_net!r})")
    module.compile_net = compile_net  # torch.compile(net) in configure_model
    return module


def validated_images(trainer: pl.Trainer, dm: ImageDataModule) -> Optional[int]:
    """How many validation images the last validation saw (``trainer.limit_val_batches`` may cap it)."""
    if dm.val_set is None or not trainer.num_val_batches:
        return None
    return min(len(dm.val_set), int(trainer.num_val_batches[0]) * dm.batch_size)


def instantiate_all(group: Optional[DictConfig], kind: str) -> list[Any]:
    """Instantiate every ``_target_`` entry of a ``callbacks``/``logger`` group (null entries skipped; allow-listed)."""
    return instantiate_group(group, kind)


def fit(cfg: DictConfig) -> tuple[dict[str, Any], VitModule]:
    """Train as configured; return the final ``results.json`` content and the trained module (best weights).

    Raises the error after recording ``status: failed`` and a one-line ``error`` in results.json.
    """
    out_dir = make_run_folder(Path(cfg.paths.output_dir))
    ckpt_path, previous = resolve_ckpt_path(cfg.get("ckpt_path"), out_dir)
    if ckpt_path:  # the same run, or refused in one line before any file of the run changes
        source = resume_source(out_dir, cfg.get("ckpt_path"))
        check_same_run(resolved_sections(cfg, cfg), saved_config(ckpt_path), source)
    before = (out_dir / "results.json").read_text() if previous else None
    kept = before if previous == "finished" else None  # a finished run's results survive any later attempt
    kept_on_failure = before if previous == "finished" or ckpt_path else None  # and a failed resume changes none
    results = ResultsFile(
        out_dir / "results.json",
        status="running",
        model=cfg.model.name,
        attention=cfg.attention.name,
        data=cfg.data.name,
        resumed_from=ckpt_path,
        previous_status=previous,
    )
    try:
        return _fit(cfg, out_dir, results, ckpt_path)
    except BaseException as e:
        if interrupted(e):
            message = f"interrupted; resume with: {resume_command(out_dir)}"
            keep_finished(results, kept, status="interrupted", error=message)
            raise SystemExit(message) from None
        keep_finished(results, kept_on_failure, status="failed", error=one_line(e))
        if not isinstance(e, ConfigError):
            write_traceback(e, out_dir)
        clean = unwrap_worker_error(e)  # a DataLoader worker's own one-line message (naming the file)
        if clean is not e:
            raise clean from None
        raise


def saved_config(ckpt_path: str) -> Optional[dict[str, Any]]:
    """The run config saved in a checkpoint; None when it holds none or cannot be read (that error is the fit's
    to report)."""
    try:
        return read_checkpoint(ckpt_path).get("config")
    except ConfigError:
        return None


def keep_finished(results: ResultsFile, kept: Optional[str], **failure: Any) -> None:
    """Record a failure in results.json, unless the folder's results from before this run are to be kept
    (``kept``: a finished run's, or those of the run a failed resume went on): those are put back, and the failure
    is only printed.

    Args:
        results: the run's results file.
        kept: the ``results.json`` text from before this run to put back (None: record the failure).
        failure: ``status`` and ``error`` of this run.
    """
    if kept is None:
        results.update(**failure)
        return
    if rank_zero_only.rank == 0:
        atomic_write_text(results.path, kept)
    say(f"{results.path} kept as it was (this run: {failure['status']}: {failure['error']})")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train as configured (see :func:`fit`); return the content of ``results.json``.

    With ``skip_finished=true`` a run folder whose ``results.json`` says ``finished`` is not trained again (its
    results are returned): re-running a sweep into the same ``hydra.sweep.dir`` skips the finished jobs, and with
    ``ckpt_path=auto`` resumes the interrupted ones.
    """
    out_dir = Path(cfg.paths.output_dir)
    run = OmegaConf.to_container(cfg, resolve=True)
    record = existing_record(cfg.get("record_dir"), run)
    if record is not None:
        say(f"record_dir: {record} exists; not training this job again (delete the record to rerun it)")
        return json.loads(record.read_text())
    if cfg.get("skip_finished", False) and previous_status(out_dir) == "finished":
        say(f"skip_finished: {out_dir / 'results.json'} says finished; not training again")
        return json.loads((out_dir / "results.json").read_text())
    with run_console(out_dir):  # <run>/train.log holds the console; whole lines without a terminal
        results = fit(cfg)[0]
    if cfg.get("record_dir") and rank_zero_only.rank == 0:  # a record that cannot be written fails the job
        say(f"record_dir: wrote {save_record(cfg.record_dir, results, run, out_dir / 'results.json', job_command())}")
    return results


def job_command() -> Optional[str]:
    """The command line that re-runs this job alone: ``python train.py`` and the job's own overrides (in a
    multirun, the swept values of this job), each quoted for a POSIX shell; None outside a Hydra run."""
    if not HydraConfig.initialized():
        return None
    overrides = HydraConfig.get().overrides.task
    return " ".join(["python train.py", *(shlex.quote(o) for o in overrides)])


def _fit(
    cfg: DictConfig, out_dir: Path, results: ResultsFile, ckpt_path: Optional[str]
) -> tuple[dict[str, Any], VitModule]:
    clock = ElapsedTime()  # wall time, summed over resumes through the checkpoints
    container = OmegaConf.to_container(cfg, resolve=True)
    check_run_options(container)
    if container.get("record_dir"):
        check_record_dir(container["record_dir"])  # before any training: the record must be writable
    pl.seed_everything(container["seed"], workers=True, verbose=False)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # per run, also within a multirun
    # resume: fail now, in one line, if it is missing or not a checkpoint
    resume_step = int(read_checkpoint(ckpt_path).get("global_step") or 0) if ckpt_path else None
    bench = benchmark_config(container.get("benchmark"))
    dm = build_datamodule(cfg.data)
    module = build_module(container, dm)

    report = count_flops(module.net)
    if rank_zero_only.rank == 0:
        console.print(flops_table(report, f"{cfg.model.name} + attention={cfg.attention.name}"))
    results.update(params=report.params, gmacs=report.measured / 1e9, gmacs_analytic=report.analytic / 1e9,
                   commit=git_commit())  # the code this run trained with (a record names it, not the tree at its end)

    loggers = keep_csv(instantiate_all(cfg.get("logger"), "logger"), out_dir)  # metrics.csv beside any other logger
    for logger in loggers:
        if isinstance(logger, ResumableCSVLogger):
            logger.resume_step = resume_step  # rows the killed run logged after the checkpoint are dropped
    speed, peak = ImagesPerSecond(clock.clock), TrainingPeakMemory()  # both carried across resumes, like clock
    history = ValHistory()  # the validation curve, over resumes
    callbacks = instantiate_all(cfg.get("callbacks"), "callbacks") + [speed, peak, StopOnNonFinite(), RngState(), clock,
                                                                       history]
    callbacks.append(RunOverrides(hydra_overrides()))  # saved in every checkpoint: a resume restores them
    trainer: pl.Trainer = safe_instantiate(
        cfg.trainer,
        "trainer",
        "trainer",
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
    )
    # the training peak over the resident size before fit (CPU: VmHWM reset here). In a CPU multirun later jobs
    # start with memory the allocator kept from earlier ones: memory tables run one process per job
    memory = PeakMemory(trainer.strategy.root_device)
    memory.start()
    peak.this_process = memory.peak_mb
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    train_peak_mb = peak.peak_mb()  # the largest of every segment's
    # beside it, the analytic prediction: parameters, gradients, optimizer state and model.memory()'s activations
    predicted = predicted_memory(module.net, dm.batch_size, amp_dtype(cfg.trainer.get("precision")),
                                 optimizer=trainer.optimizers[0] if trainer.optimizers else None)

    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    trainer.loggers = []  # the final validation of the best weights is reported in results.json, not as an epoch
    metrics = trainer.validate(module, datamodule=dm, ckpt_path=best, verbose=False, weights_only=True)[
        0
    ]  # loads the best weights

    export_dir = out_dir / "export" if cfg.get("export", True) else None
    if export_dir is not None and rank_zero_only.rank == 0:
        try:  # all files or none (export_model stages them); a full disk is one line
            export_model(module.net, export_dir, data=dm.describe(), replace=True)
        except ConfigError as e:
            raise ConfigError(f"{e}; export=false skips the export (the checkpoints are kept)") from None
    infer = trainer_throughput(trainer, module.net, bench)
    # MFU: analytic MACs x 3 (forward + backward) per training image over the machine's cached matmul peak
    peak = matmul_peak(trainer.strategy.root_device, precision_dtype(cfg.trainer.get("precision")))
    final = results.update(
        status="finished",
        best_val_acc=float(metrics["val/acc"]),
        best_val_acc5=float(metrics["val/acc5"]),
        best_val_acc_tta=float(metrics["val/acc_tta"]) if "val/acc_tta" in metrics else None,
        val_loss=float(metrics["val/loss"]),
        train_images_per_s=speed.images_per_s,
        infer_images_per_s=infer,
        train_mfu=mfu(report.analytic * 3 * (speed.images_per_s or 0), 1.0, peak),
        matmul_peak_gmacs_s=peak / 1e9,
        peak_memory_mb=train_peak_mb,
        **predicted,
        epochs=trainer.current_epoch,
        steps=trainer.global_step,
        best_ckpt=best,
        val_images=validated_images(trainer, dm),
        export_dir=str(export_dir) if export_dir else None,
        wall_s=clock.seconds(),
        val_acc_per_epoch=history.acc,
        val_acc_tta_per_epoch=history.acc_tta or None,
        segments=clock.segments,
        output_dir=str(out_dir),
    )
    if rank_zero_only.rank == 0:
        console.print(
            f"[bold]{cfg.model.name} + {cfg.attention.name} on {cfg.data.name}[/]: val acc {final['best_val_acc']:.4f} "
            f"(top-5 {final['best_val_acc5']:.4f}), train {final['train_images_per_s'] or 0:.0f} img/s, "
            f"inference {infer:.0f} img/s, {final['wall_s']:.0f} s -> {out_dir / 'results.json'}"
        )
    return final, module
