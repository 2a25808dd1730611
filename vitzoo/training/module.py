"""The LightningModule: a vitzoo backbone built from plain config data, trained with cross entropy.

Everything needed to rebuild the network is in the module's hyper-parameters (plain dicts saved by
``save_hyperparameters``), so ``VitModule.load_from_checkpoint(path)`` needs no extra arguments.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import pytorch_lightning as pl
import torch
from timm.optim import create_optimizer_v2, param_groups_layer_decay, param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from vitzoo.models import create_model, model_kwargs
from vitzoo.registry import ConfigError

OPTIM_DEFAULTS: dict[str, Any] = dict(lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999), label_smoothing=0.1,
                                      warmup_epochs=1.0, warmup_lr_ratio=1e-3, min_lr_ratio=0.01,
                                      layer_decay=None)
NO_WEIGHT_DECAY = ("pos_embed", "cls_token")  # besides biases and norms (1-d), as DeiT


class VitModule(pl.LightningModule):
    """Image classification with a vitzoo backbone.

    Args:
        model: ``{"name": "vit_cifar", **options}``: a variant and any field of its config dataclass.
        attention: ``{"name": "window", **options}``: the token mixer of every block.
        optim: ``lr``, ``weight_decay``, ``betas``, ``label_smoothing``, ``warmup_epochs`` (linear
            warm-up, may be fractional), ``warmup_lr_ratio`` (warm-up start / lr), ``min_lr_ratio``
            (cosine floor / lr), ``layer_decay`` (timm's layer-wise lr decay: block i of L trains at
            lr·layer_decay^(L-i), the head at lr; null: off). Missing keys take :data:`OPTIM_DEFAULTS`.
        data: plain description of the training data (name, img_size, mean, std, classes), kept so
            that evaluation and export know the preprocessing.
    """

    def __init__(self, model: Mapping[str, Any], attention: Any = "global", optim: Optional[Mapping[str, Any]] = None,
                 data: Optional[Mapping[str, Any]] = None):
        super().__init__()
        self.save_hyperparameters()
        unknown = sorted(set(optim or {}) - set(OPTIM_DEFAULTS))
        if unknown:
            raise ConfigError(f"unknown option optim.{unknown[0]}; valid options: {', '.join(sorted(OPTIM_DEFAULTS))}")
        self.optim = {**OPTIM_DEFAULTS, **(optim or {})}
        options = dict(model)
        if "name" not in options:
            raise ConfigError("missing model.name; choose model= one of the configs/model/ files")
        name = options.pop("name")
        self.net = create_model(name, attention=attention, **options)
        if options.get("pretrained") is not None:  # checkpoints rebuild the resolved architecture, not the source
            self.hparams["model"] = {"name": name, **model_kwargs(self.net)}
        n = self.net.cfg.num_classes
        self.criterion = nn.CrossEntropyLoss(label_smoothing=float(self.optim["label_smoothing"]))
        self.train_acc = MulticlassAccuracy(n, top_k=1, average="micro")
        self.val_acc = MulticlassAccuracy(n, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(n, top_k=min(5, n), average="micro")
        self.run_config: Optional[dict[str, Any]] = None  # the resolved run config, saved in checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.run_config is not None:
            checkpoint["config"] = self.run_config

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self.net(x)
        loss = self.criterion(logits, y)
        self.train_acc(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.val_acc(logits, y)
        self.val_acc5(logits, y)
        self.log("val/loss", self.criterion(logits, y), on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)
        self.log("val/acc5", self.val_acc5, on_epoch=True)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (no weight decay on biases, norms, position embeddings and tokens: timm's grouping) and
        a per-step cosine schedule after a linear warm-up (timm's ``CosineLRScheduler``)."""
        o = self.optim
        if o["layer_decay"] is None:
            groups = param_groups_weight_decay(self.net, float(o["weight_decay"]), no_weight_decay_list=NO_WEIGHT_DECAY)
        else:  # the models' group_matcher() orders the layers; timm scales each group's lr (lr_scale)
            groups = param_groups_layer_decay(self.net, float(o["weight_decay"]), no_weight_decay_list=NO_WEIGHT_DECAY,
                                              layer_decay=float(o["layer_decay"]))
        optimizer = create_optimizer_v2(groups, opt="adamw", lr=float(o["lr"]), weight_decay=float(o["weight_decay"]),
                                        betas=tuple(o["betas"]))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        warmup = min(int(round(float(o["warmup_epochs"]) * total / epochs)), total // 2)
        scheduler = CosineLRScheduler(optimizer, t_initial=max(1, total - warmup), lr_min=float(o["lr"]) * float(o["min_lr_ratio"]),
                                      warmup_t=warmup, warmup_lr_init=float(o["lr"]) * float(o["warmup_lr_ratio"]),
                                      warmup_prefix=True, t_in_epochs=False)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def lr_scheduler_step(self, scheduler: CosineLRScheduler, metric: Any) -> None:
        scheduler.step_update(num_updates=self.global_step)  # timm schedulers step by update count

    @torch.no_grad()
    def predict_logits(self, x: Tensor) -> Tensor:
        """Eval-mode logits (restores the previous train/eval mode)."""
        was = self.net.training
        self.net.eval()
        try:
            return self.net(x)
        finally:
            self.net.train(was)
