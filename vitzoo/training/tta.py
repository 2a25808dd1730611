"""Flip test-time augmentation: validation top-1 of the mean logits of each image and its mirror image.

Reported as ``val/acc_tta`` beside the plain ``val/acc`` (which stays the model's own figure): the recipe's
headline accuracy never mixes the two. airbench (Jordan, "94% on CIFAR-10 in 3.29 seconds on a single GPU",
https://arxiv.org/abs/2404.00498) evaluates this way.
"""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torchmetrics.classification import MulticlassAccuracy


class FlipTTA(pl.Callback):
    """Validation top-1 of ``(f(x) + f(flip(x))) / 2``, logged as ``val/acc_tta`` once per validation.

    The mirrored forward runs under the trainer's precision (the same autocast as the validation step), on the
    same weights the validation step used (the EMA weights when the EMA callback swaps them in).
    """

    def __init__(self) -> None:
        self.metric: Any = None

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.metric = MulticlassAccuracy(pl_module.net.cfg.num_classes, top_k=1, average="micro").to(pl_module.device)

    @torch.no_grad()
    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        x, y = batch
        with trainer.precision_plugin.forward_context():
            logits = pl_module.run_net(x).float() + pl_module.run_net(torch.flip(x, dims=[-1])).float()
        self.metric.update(logits, y)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.metric is not None and self.metric.update_count:
            pl_module.log("val/acc_tta", self.metric.compute(), sync_dist=True)
