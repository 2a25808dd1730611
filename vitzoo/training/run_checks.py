"""Checks of a resolved run config that Lightning, timm or the data modules would accept silently or report as
a traceback: each is one line naming the option, raised before anything is built.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from vitzoo.models import model_config
from vitzoo.models.factory import INT_RANGES
from vitzoo.registry import ConfigError

FP16 = ("16", "16-mixed", "16-true")  # Lightning precisions a CPU cannot run (it falls back to bf16 with a warning)
GPU_ACCELERATORS = ("gpu", "cuda")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_seed(seed: Any) -> None:
    """``seed`` must be an integer."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer (got {seed!r})")


def check_trainer(trainer: Mapping[str, Any]) -> None:
    """``trainer.max_epochs`` trains something; the accelerator exists; the precision runs on it.

    Args:
        trainer: the resolved ``trainer`` config.
    """
    epochs = trainer.get("max_epochs")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs == 0 or epochs < -1):
        raise ConfigError(f"trainer.max_epochs={epochs!r} trains nothing; choose a positive integer "
                          f"(or -1 with trainer.max_steps)")
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    if accelerator in GPU_ACCELERATORS and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={accelerator} but this machine has no CUDA GPU; use trainer=cpu")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    precision = str(trainer.get("precision", "32-true"))
    if on_cpu and precision in FP16:
        raise ConfigError(f"trainer.precision={precision} cannot run on the CPU; use trainer.precision=bf16-mixed "
                          f"or 32-true")


def check_optim(optim: Mapping[str, Any]) -> None:
    """``optim.lr`` is a positive number; ``weight_decay`` and ``warmup_epochs`` are not negative."""
    lr = optim.get("lr")
    if not _number(lr) or lr <= 0:
        raise ConfigError(f"optim.lr must be a positive number (got {lr!r})")
    for key in ("weight_decay", "warmup_epochs", "label_smoothing"):
        value = optim.get(key)
        if value is not None and (not _number(value) or value < 0):
            raise ConfigError(f"optim.{key} must be a number >= 0 (got {value!r})")


def check_data(data: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """``data.mean``/``data.std`` have one value per input channel; ``data.img_size`` is the model's.

    Args:
        data: the resolved ``data`` config.
        model: the resolved ``model`` config.
    """
    channels = int(model.get("in_chans") or 3)
    for key in ("mean", "std"):
        values = data.get(key)
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) != channels or not all(map(_number, values)):
            raise ConfigError(f"data.{key} must be {channels} numbers, one per input channel (got {values!r})")
        if key == "std" and min(values) <= 0:
            raise ConfigError(f"data.std must be positive (got {values!r})")
    check_img_size(data.get("img_size"), "data.img_size")
    size, model_size = data.get("img_size"), model.get("img_size")
    if size is not None and model_size is not None and size != model_size:
        raise ConfigError(f"data.img_size={size} but model.img_size={model_size}; drop the data.img_size override "
                          f"(it follows the model)")


def check_img_size(size: Any, where: str) -> None:
    """An image side is an integer within the model configs' range (a file may say ``img_size: 1000000``).

    Args:
        size: the value.
        where: the option or file it came from, named in the message.
    """
    low, high = INT_RANGES["img_size"]
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high):
        raise ConfigError(f"{where}={size!r} is not an integer in [{low}, {high}]")


def check_window(attention: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """A window larger than the model's first token grid would be clamped while the config keeps the number.

    Args:
        attention: the resolved ``attention`` config.
        model: the resolved ``model`` config.
    """
    window = attention.get("window_size")
    try:  # the variant's defaults under the overrides (a bad model config is reported when the model is built)
        options = {k: v for k, v in model.items() if k not in ("name", "pretrained")}
        cfg = model_config(str(model.get("name")), **options)
    except (ConfigError, TypeError):
        return
    img, patch = cfg.img_size, cfg.patch_size
    if _number(window) and _number(img) and _number(patch) and patch > 0 and window > img // patch:
        raise ConfigError(f"attention.window_size={window} is larger than the {img // patch}x{img // patch} token "
                          f"grid of model.img_size={img}; choose attention.window_size<={img // patch}")


def check_run_options(run: Mapping[str, Any]) -> None:
    """Every check above on a resolved run config (``OmegaConf.to_container(cfg, resolve=True)``)."""
    check_seed(run.get("seed"))
    check_trainer(run.get("trainer") or {})
    check_optim(run.get("optim") or {})
    check_data(run.get("data") or {}, run.get("model") or {})
    check_window(run.get("attention") or {}, run.get("model") or {})
