"""Untrusted input is data, never code.

Everything vitzoo reads back (a checkpoint's saved run config and hyper-parameters, an export's
``config.json``) is plain data checked here before it builds anything: data modules, loggers,
callbacks, trainers and strategies come from an allow-list of ``_target_`` paths (vitzoo's own
classes and the Lightning classes its configs name), models and attention from their registries.
A ``_target_`` outside the allow-list is a one-line :class:`ConfigError`, raised before any import.

Checkpoints are read with ``torch.load(weights_only=True)`` (no pickled objects), see
:func:`vitzoo.training.utils.read_checkpoint`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from vitzoo.registry import ConfigError
from vitzoo.untrusted import offline_data, offline_options, plain_data

# kind -> the ``_target_`` paths a config may name for it (extend in code to allow your own class)
ALLOWED_TARGETS: dict[str, set[str]] = {
    "data": {
        "vitzoo.data.datamodules.DigitsDataModule",
        "vitzoo.data.datamodules.CIFARDataModule",
        "vitzoo.data.datamodules.ImageFolderDataModule",
    },
    "logger": {
        "pytorch_lightning.loggers.CSVLogger",
        "vitzoo.training.resume.ResumableCSVLogger",
        "pytorch_lightning.loggers.TensorBoardLogger",
        "pytorch_lightning.loggers.WandbLogger",
    },
    "callbacks": {
        "pytorch_lightning.callbacks.ModelCheckpoint",
        "vitzoo.training.resume.Checkpoint",
        "pytorch_lightning.callbacks.LearningRateMonitor",
        "pytorch_lightning.callbacks.RichProgressBar",
        "vitzoo.training.run_log.ProgressBar",
        "pytorch_lightning.callbacks.TQDMProgressBar",
        "pytorch_lightning.callbacks.EarlyStopping",
        "vitzoo.training.callbacks.EMA",
        "vitzoo.training.tta.FlipTTA",
    },
    "trainer": {"pytorch_lightning.Trainer"},
    "trainer.strategy": {
        "pytorch_lightning.strategies.DDPStrategy",
        "pytorch_lightning.strategies.FSDPStrategy",
        "vitzoo.training.resume.fsdp_strategy",
    },
}
ALL_TARGETS = set().union(*ALLOWED_TARGETS.values())  # nested _target_ entries may name any of them
HPARAM_KEYS = ("model", "attention", "optim", "data")  # VitModule's arguments, all plain data


def check_targets(node: Any, kind: str, where: str) -> None:
    """Raise a one-line ConfigError if ``node`` or anything inside it names a ``_target_`` not allowed for ``kind``.

    Args:
        node: plain data (dict/list/scalars) or an OmegaConf container.
        kind: key of :data:`ALLOWED_TARGETS` for the top level (``trainer.strategy`` for the nested strategy);
            other nested targets may be any allowed one.
        where: dotted config path used in messages, e.g. ``"data"`` or ``"callbacks.model_checkpoint"``.
    """
    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, Mapping):
        target = node.get("_target_")
        allowed = ALLOWED_TARGETS.get(kind, ALL_TARGETS)
        if target is not None and target not in allowed:
            raise ConfigError(
                f"{where}._target_={target!r} is not an allowed {kind.split('.')[0]} class; "
                f"choose one of: {', '.join(sorted(allowed))}"
            )
        for key, value in node.items():
            check_targets(value, f"{kind}.{key}", f"{where}.{key}")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            check_targets(value, f"{kind}[]", f"{where}[{i}]")


def safe_instantiate(node: Any, kind: str, where: str, **extra: Any) -> Any:
    """``hydra.utils.instantiate(node, **extra)`` after :func:`check_targets`.

    Args:
        node: a config with a ``_target_`` from the allow-list.
        kind: key of :data:`ALLOWED_TARGETS`.
        where: dotted config path used in messages.
        extra: objects passed to the constructor (callbacks, logger, plugins), not read from the config.
    """
    check_targets(node, kind, where)
    try:
        return instantiate(node, **extra)
    except InstantiationException as e:  # Hydra wraps a constructor's one-line ConfigError in a multi-line message
        if isinstance(e.__cause__, ConfigError):
            raise e.__cause__ from None
        raise


def instantiate_group(group: Any, kind: str) -> list[Any]:
    """Instantiate every ``_target_`` entry of a ``callbacks``/``logger`` group (null entries skipped)."""
    return [
        safe_instantiate(c, kind, f"{kind}.{name}")
        for name, c in (group or {}).items()
        if c is not None and "_target_" in c
    ]


def saved_data_config(config: Any, source: str) -> Optional[dict[str, Any]]:
    """The data config saved in a checkpoint (None if absent), checked to be plain data naming an allowed data module.

    Args:
        config: the run config stored in the checkpoint under ``config``.
        source: what it was read from (named in messages), e.g. ``ckpt_path=run/last.ckpt``.
    """
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: config is not a mapping; choose the data with data=<digits|cifar10|...>")
    saved = config.get("data")
    if saved is None:
        return None
    plain_data(saved, f"{source}: config.data")
    if not isinstance(saved, Mapping):
        raise ConfigError(f"{source}: config.data is not a mapping; choose the data with data=<digits|cifar10|...>")
    check_targets(saved, "data", f"{source}: config.data")
    return offline_data(saved, source)


def checkpoint_hparams(ckpt: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The checkpoint's ``hyper_parameters`` as VitModule arguments: known keys only, plain data only.

    Args:
        ckpt: a checkpoint dict from :func:`vitzoo.training.utils.read_checkpoint`.
        source: what it was read from (named in messages).
    """
    hparams = ckpt.get("hyper_parameters")
    if not isinstance(hparams, Mapping):
        raise ConfigError(f"{source}: hyper_parameters is not a mapping; not a vitzoo checkpoint")
    unknown = sorted(set(hparams) - set(HPARAM_KEYS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown hyper-parameter {unknown[0]!r} (a vitzoo checkpoint has "
            f"{', '.join(HPARAM_KEYS)}); not a vitzoo checkpoint"
        )
    plain_data(dict(hparams), f"{source}: hyper_parameters")
    if not isinstance(hparams.get("model"), Mapping):
        raise ConfigError(f"{source}: hyper_parameters.model is not a mapping; not a vitzoo checkpoint")
    return {**hparams, "model": offline_options(hparams["model"], source)}


def checked_state(state_dict: Any, source: str) -> Mapping[str, torch.Tensor]:
    """A checkpoint's ``state_dict``, checked to be a mapping of tensors."""
    if not isinstance(state_dict, Mapping) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ConfigError(f"{source}: state_dict is not a mapping of tensors; not a vitzoo checkpoint")
    return state_dict


def load_state(module: torch.nn.Module, state_dict: Any, source: str) -> None:
    """``module.load_state_dict(state_dict)`` (strict) with a one-line error naming the first mismatch."""
    checked_state(state_dict, source)
    try:
        module.load_state_dict(state_dict)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(e).__name__
        raise ConfigError(f"{source}: the weights do not fit the model it describes ({detail})") from None
