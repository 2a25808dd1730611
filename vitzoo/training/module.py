"""The LightningModule: a vitzoo backbone built from plain config data, trained with cross entropy.

Everything needed to rebuild the network is in the module's hyper-parameters (plain dicts saved by
``save_hyperparameters``), so ``VitModule.load_from_checkpoint(path)`` needs no extra arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import pytorch_lightning as pl
import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2, list_optimizers, param_groups_layer_decay, param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from vitzoo.attention import before_train_step
from vitzoo.export.files import check_file_config
from vitzoo.models import create_model, model_kwargs
from vitzoo.registry import ConfigError, build_config
from vitzoo.training.safe_load import checked_state, checkpoint_hparams, load_state
from vitzoo.training.token_schedule import TokenReductionSchedule
from vitzoo.training.utils import read_checkpoint
from vitzoo.untrusted import check_dtypes, check_finite


@dataclass
class OptimConfig:
    """The ``optim`` options (``python train.py optim.lr=3e-4``): AdamW, then a per-step cosine schedule."""

    opt: str = "adamw"  # optimiser by timm's name (timm.optim.list_optimizers(): adamw, nadamw, lion, ...)
    lr: float = 1e-3  # peak learning rate (after warm-up)
    weight_decay: float = 0.05  # AdamW decoupled weight decay (none on biases, norms, pos_embed, cls_token)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    label_smoothing: float = 0.1  # cross-entropy label smoothing
    warmup_epochs: float = 1.0  # linear warm-up length in epochs (may be fractional), then per-step cosine
    warmup_fraction: Optional[float] = (
        None  # set (e.g. 0.05): warm-up is this share of all steps, replacing warmup_epochs
    )
    warmup_lr_ratio: float = 1e-3  # warm-up starts at lr * this
    min_lr_ratio: float = 0.01  # cosine ends at lr * this
    layer_decay: Optional[float] = None
    mixup_alpha: float = 0.0  # timm Mixup: Beta(alpha, alpha) blend of image pairs (0: off)
    cutmix_alpha: float = 0.0  # timm CutMix: pasted boxes (0: off); with both on, timm picks one per batch


NO_WEIGHT_DECAY = ("pos_embed", "cls_token", "global_tokens")  # besides biases and norms (1-d), as DeiT


def param_groups(net: nn.Module, o: OptimConfig) -> list[dict[str, Any]]:
    """timm's parameter groups: no weight decay on biases, norms and :data:`NO_WEIGHT_DECAY` (the position
    embeddings and the prefix tokens: class token, longformer's persistent global tokens); with
    ``optim.layer_decay`` one group per layer, its learning rate scaled by depth.

    Args:
        net: the model.
        o: the optimiser options.
    """
    if o.layer_decay is None:
        return param_groups_weight_decay(net, float(o.weight_decay), no_weight_decay_list=NO_WEIGHT_DECAY)
    # the models' group_matcher() orders the layers; timm scales each group's lr (lr_scale)
    return param_groups_layer_decay(
        net, float(o.weight_decay), no_weight_decay_list=NO_WEIGHT_DECAY, layer_decay=float(o.layer_decay)
    )


def warmup_steps(o: OptimConfig, total: int, max_epochs: Optional[int]) -> int:
    """Warm-up length in steps: ``warmup_fraction`` of ``total`` if set,
    else ``warmup_epochs`` (at most half of ``total``).

    Args:
        o: the optim options.
        total: optimizer steps of the whole run.
        max_epochs: the trainer's epochs (None or -1 with a step budget: ``warmup_epochs`` counts the run as one).
    """
    if o.warmup_fraction is not None:
        if not 0 <= float(o.warmup_fraction) < 1:
            raise ConfigError(f"optim.warmup_fraction must be in [0, 1) (got {o.warmup_fraction})")
        return int(round(float(o.warmup_fraction) * total))
    epochs = max_epochs if max_epochs and max_epochs > 0 else 1
    return min(int(round(float(o.warmup_epochs) * total / epochs)), total // 2)


def build_mixup(o: OptimConfig, num_classes: int) -> Optional[Mixup]:
    """timm's ``Mixup`` (mixup and/or CutMix, label smoothing folded into the soft targets), or None when both are off.

    Args:
        o: the optim options (``mixup_alpha``, ``cutmix_alpha``, ``label_smoothing``).
        num_classes: classifier outputs.
    """
    if float(o.mixup_alpha) < 0 or float(o.cutmix_alpha) < 0:
        raise ConfigError(
            f"optim.mixup_alpha and optim.cutmix_alpha must be >= 0 (got {o.mixup_alpha}, {o.cutmix_alpha})"
        )
    if float(o.mixup_alpha) == 0 and float(o.cutmix_alpha) == 0:
        return None
    return Mixup(
        mixup_alpha=float(o.mixup_alpha),
        cutmix_alpha=float(o.cutmix_alpha),
        label_smoothing=float(o.label_smoothing),
        num_classes=num_classes,
    )


class VitModule(pl.LightningModule):
    """Image classification with a vitzoo backbone.

    Args:
        model: ``{"name": "vit_cifar", **options}``: a variant and any field of its config dataclass.
        attention: ``{"name": "window", **options}``: the token mixer of every block (None: the
            variant's natural attention, see :func:`vitzoo.models.natural_attention`).
        optim: plain mapping of :class:`OptimConfig` fields (strict: an unknown key is a ConfigError);
            missing keys take its defaults.
        data: plain description of the training data (name, img_size, mean, std, classes), kept so
            that evaluation and export know the preprocessing.
    """

    def __init__(
        self,
        model: Mapping[str, Any],
        attention: Any = None,
        optim: Optional[Mapping[str, Any]] = None,
        data: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.optim = build_config(OptimConfig, optim or {}, "optim")
        options = dict(model)
        if "name" not in options:
            raise ConfigError("missing model.name; choose model= one of the configs/model/ files")
        name = options.pop("name")
        self.net = create_model(name, attention=attention, **options)
        if options.get("pretrained") is not None:  # checkpoints rebuild the resolved architecture, not the source
            self.hparams["model"] = {"name": name, **model_kwargs(self.net)}
        n = self.net.cfg.num_classes
        self.criterion = nn.CrossEntropyLoss(label_smoothing=float(self.optim.label_smoothing))
        self.mixup = build_mixup(self.optim, n)  # None when off; else soft targets and their cross entropy
        self.train_criterion = SoftTargetCrossEntropy() if self.mixup is not None else self.criterion
        self.train_acc = MulticlassAccuracy(n, top_k=1, average="micro")
        self.val_acc = MulticlassAccuracy(n, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(n, top_k=min(5, n), average="micro")
        self.run_config: Optional[dict[str, Any]] = None  # the resolved run config, saved in checkpoints
        self.compile_net: bool = False  # the run's `compile` option: torch.compile the network in configure_model
        self._compiled: Optional[Any] = None  # torch.compile(self.net), kept out of the module tree (see run_net)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None) -> "VitModule":  # type: ignore[override]
        """Rebuild from a vitzoo ``.ckpt``: read ``weights_only``, hyper-parameters checked as plain data.

        Args:
            checkpoint_path: the ``.ckpt`` file.
            map_location: device for the module (default CPU).
        """
        module = module_from_checkpoint(read_checkpoint(checkpoint_path), f"ckpt_path={checkpoint_path}")
        return module.to(map_location or "cpu")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.run_config is not None:
            checkpoint["config"] = self.run_config

    def configure_model(self) -> None:
        """With ``compile_net``: ``torch.compile(self.net)`` for the training and validation steps.

        The compiled wrapper is stored outside the module tree (not a submodule), so ``state_dict``
        keys, checkpoints and exports stay those of ``self.net`` (no ``_orig_mod.`` prefix); it
        shares the parameters of ``self.net``.
        """
        if self.compile_net and self._compiled is None:
            object.__setattr__(self, "_compiled", torch.compile(self.net))

    def run_net(self, x: Tensor) -> Tensor:
        """Logits of ``x`` from the compiled network when there is one, else from ``self.net``."""
        return (self.net if self._compiled is None else self._compiled)(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.run_net(x)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        before_train_step(self.net)  # performer/rfa: count the step, redraw ω when due (outside forward)

    def configure_callbacks(self) -> list[pl.Callback]:
        return [TokenReductionSchedule()]  # EViT's keep-rate warm-up, per step from the global step (any Trainer)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        target = y
        if self.mixup is not None:
            x, target = self.mixup(x, y)
        logits = self.run_net(x)
        loss = self.train_criterion(logits, target)
        self.train_acc(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.run_net(x)
        self.val_acc(logits, y)
        self.val_acc5(logits, y)
        self.log("val/loss", self.criterion(logits, y), on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)
        self.log("val/acc5", self.val_acc5, on_epoch=True)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (no weight decay on biases, norms, position embeddings and tokens: timm's grouping) and
        a per-step cosine schedule after a linear warm-up (timm's ``CosineLRScheduler``)."""
        o = self.optim
        groups = param_groups(self.net, o)
        if o.opt not in list_optimizers():
            raise ConfigError(f"optim.opt={o.opt!r} is not one of timm's optimisers (timm.optim.list_optimizers())")
        optimizer = create_optimizer_v2(
            groups, opt=o.opt, lr=float(o.lr), weight_decay=float(o.weight_decay), betas=tuple(o.betas)
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = warmup_steps(o, total, self.trainer.max_epochs)
        scheduler = CosineLRScheduler(
            optimizer,
            t_initial=max(1, total - warmup),
            lr_min=float(o.lr) * float(o.min_lr_ratio),
            warmup_t=warmup,
            warmup_lr_init=float(o.lr) * float(o.warmup_lr_ratio),
            warmup_prefix=True,
            t_in_epochs=False,
        )
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


def module_from_checkpoint(ckpt: Mapping[str, Any], source: str) -> VitModule:
    """A :class:`VitModule` rebuilt from a checkpoint's plain data and weights (both checked first).

    Args:
        ckpt: a checkpoint dict from :func:`vitzoo.training.utils.read_checkpoint`.
        source: what it was read from (named in messages).
    """
    hparams = checkpoint_hparams(ckpt, source)
    state = checked_state(ckpt.get("state_dict"), source)
    held = {k.removeprefix("net."): (v.numel(), v.dtype) for k, v in state.items()}
    check_file_config(hparams["model"], held, source)  # types, ranges and size before anything is allocated
    module = VitModule(**hparams)
    check_dtypes(module.net.state_dict(), {k: d for k, (_, d) in held.items()}, source)
    load_state(module, state, source)
    check_finite(module.net, source)
    return module


def load_checkpoint_net(ckpt_path: Union[str, Path]) -> tuple[nn.Module, dict[str, Any]]:
    """The backbone of a vitzoo training checkpoint (eval mode) and the data description it was trained with.

    Args:
        ckpt_path: a ``.ckpt`` written by vitzoo training.
    """
    ckpt = read_checkpoint(ckpt_path)
    module = module_from_checkpoint(ckpt, f"ckpt_path={ckpt_path}")
    return module.net.eval(), dict(ckpt["hyper_parameters"].get("data") or {})
