"""The run's validation curve: top-1 (and flip-TTA top-1 where measured) after every epoch, over all segments."""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from vitzoo.training.segments import FitState


class ValHistory(FitState):
    """Validation top-1 after each training epoch, kept in every checkpoint so a resumed run reports the whole
    curve (``results.json``: ``val_acc_per_epoch``; the result record: ``top1_per_epoch``). Sanity checks and the
    final ``trainer.validate`` of the best weights are not epochs and are not recorded."""

    def __init__(self) -> None:
        self.acc: list[float] = []
        self.acc_tta: list[float] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        metrics = trainer.callback_metrics
        if "val/acc" in metrics:
            self.acc.append(float(metrics["val/acc"]))
        if "val/acc_tta" in metrics:
            self.acc_tta.append(float(metrics["val/acc_tta"]))

    def state_dict(self) -> dict[str, Any]:
        return {"acc": list(self.acc), "acc_tta": list(self.acc_tta)}

    def restore(self, state_dict: dict[str, Any]) -> None:
        self.acc = [float(a) for a in state_dict.get("acc", [])]
        self.acc_tta = [float(a) for a in state_dict.get("acc_tta", [])]
