"""The training schedule of ``model.token_reduction`` (EViT's keep-rate warm-up) as a Lightning callback.

Paper: Liang et al., "Not All Patches are What You Need: Expediting Vision Transformers via Token
Reorganizations", ICLR 2022, https://arxiv.org/abs/2202.07800 (the keep rate warms up from 1 to its target);
the schedule itself is :meth:`vitzoo.layers.reduction_options.EViTConfig.rate_at`.
"""
from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl

from vitzoo.layers.token_reduction import set_training_progress


class TokenReductionSchedule(pl.Callback):
    """Moves the schedules of ``model.token_reduction`` before every training step, outside ``forward``.

    The position is :func:`training_epochs`, read from the trainer's global step, so a resumed run goes on
    where its checkpoint stopped and the callback keeps no state. :class:`~vitzoo.training.VitModule` adds it
    to every fit (``configure_callbacks``), whatever the ``callbacks`` config holds.
    """

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        set_training_progress(pl_module.net, training_epochs(trainer))


def training_epochs(trainer: pl.Trainer) -> float:
    """Epochs of training done before the current step: ``global_step`` over the optimizer steps of an epoch
    (``⌈batches / accumulate_grad_batches⌉``); the epoch count where an epoch's length is unknown.

    Args:
        trainer: the fitting trainer.
    """
    batches = trainer.num_training_batches
    if not math.isfinite(batches) or batches <= 0:
        return float(trainer.current_epoch)
    return trainer.global_step / math.ceil(batches / trainer.accumulate_grad_batches)


__all__ = ["TokenReductionSchedule", "training_epochs"]
