"""Does the data pipeline keep up? Training images/s of an experiment's model fed by its DataModule (the uint8
cache, batched augmentation on the device) against the same model fed in-memory tensors already on the device.

Both arms run the same training step (forward, cross entropy, backward, AdamW) at the same batch size in one
process, in alternating blocks (A B B A …) so that clock boosts, thermal state and other load hit both alike;
the median block of each arm gives its images/s. ``ratio`` = pipeline / in-memory (goal: at least 0.95).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf

from vitzoo.measure.timing import time_fns
from vitzoo.registry import ConfigError


@dataclass
class SpeedResult:
    """Images/s of the two arms (median block) and their ratio."""

    pipeline_images_per_s: float  # the DataModule: loader batches, transfer, device augmentation
    tensor_images_per_s: float  # random normalised tensors already on the device
    ratio: float  # pipeline / tensors (goal >= 0.95)
    batch_size: int  # images per step in both arms
    device: str  # where the model ran


def compose_experiment(experiment: str, overrides: Sequence[str]) -> Any:
    """The composed ``train`` config of ``experiment=<experiment>`` with ``overrides`` (Hydra syntax)."""
    from hydra import compose, initialize_config_dir

    from vitzoo.configs import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}", *overrides])
    cfg.paths.output_dir = "."  # nothing is written; the interpolation needs a value outside a Hydra run
    return cfg


def endless(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def measure(experiment: str = "cifar10_vit", overrides: Sequence[str] = (), blocks: int = 6, steps: int = 50,
            warmup: int = 10, device: str = "auto", amp: str = "none") -> SpeedResult:
    """Alternate ``blocks`` blocks of ``steps`` training steps per arm; return the median images/s of each.

    Args:
        experiment: a ``configs/experiment/`` name (its data and model).
        overrides: more Hydra overrides, e.g. ``["data.batch_size=256"]``.
        blocks: timed blocks per arm (alternating).
        steps: training steps per block.
        warmup: untimed steps per arm first (cudnn autotune, allocator, lazy init).
        device: ``auto`` (CUDA if available), ``cpu`` or ``cuda``.
        amp: ``bf16`` autocast or ``none``.
    """
    from vitzoo.training.train import build_datamodule, build_module

    if blocks < 1 or steps < 1:
        raise ConfigError(f"--blocks and --steps must be >= 1 (got {blocks}, {steps})")
    if amp not in ("none", "bf16"):
        raise ConfigError(f"--amp must be none or bf16 (got {amp!r})")
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    )
    cfg = compose_experiment(experiment, overrides)
    dm = build_datamodule(cfg.data)
    module = build_module(OmegaConf.to_container(cfg, resolve=True), dm).to(dev).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    autocast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if amp == "bf16" else contextlib.nullcontext
    batch_size = dm.batch_size

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with autocast():
            loss = module.criterion(module.net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    batches = endless(dm.train_dataloader())

    def pipeline_step() -> None:
        batch = move_data_to_device(next(batches), dev)  # what Lightning does before on_after_batch_transfer
        step(*(dm.device_batch(batch, train=True) if dm.device_augment else batch))

    x = torch.randn(batch_size, 3, dm.img_size, dm.img_size, device=dev)
    y = torch.randint(0, dm.num_classes, (batch_size,), device=dev)
    arms = {"pipeline": pipeline_step, "tensors": lambda: step(x, y)}
    timings = time_fns(arms, dev, warmup=warmup, repeats=blocks, max_time=0, iters=steps)  # alternating (ABBA)
    pipeline, tensors = (batch_size / timings[n].median for n in ("pipeline", "tensors"))
    return SpeedResult(pipeline, tensors, pipeline / tensors, batch_size, str(dev))
