"""Export a trained model as ``model.safetensors`` + ``config.json``, and load it back without Lightning.

>>> from vitzoo.export import export_model, load_model, preprocess
>>> export_model(model, "run/export", data={"img_size": 32, "mean": [...], "std": [...]})
>>> model = load_model("run/export")          # or the .safetensors file, or config.json
>>> logits = model(preprocess(model)(pil_image)[None])  # the model's own resize + mean/std

``config.json`` holds the variant, every option of its config dataclass, the attention spec and
(optionally) the preprocessing the model was trained with, so inference needs only vitzoo.
"""
from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_model as _load_safetensors
from safetensors.torch import save_model as _save_safetensors
from torch import nn

from vitzoo.data.transforms import build_transform
from vitzoo.export.formats import FILES, check_formats, export_format
from vitzoo.models import attention_spec, create_model, model_config, model_kwargs
from vitzoo.models.factory import estimate_params
from vitzoo.registry import ConfigError
from vitzoo.untrusted import (
    check_dtypes,
    check_finite,
    check_size,
    export_options,
    load_weights,
    offline_options,
    read_json,
    write_folder,
    write_new,
)

WEIGHTS, CONFIG, FORMAT = "model.safetensors", "config.json", "vitzoo-export/1"
OWNED = (WEIGHTS, CONFIG, *FILES.values())  # the files an export writes; a replace removes only these


def export_model(model: nn.Module, out_dir: Union[str, Path], data: Optional[dict[str, Any]] = None,
                 formats: Sequence[str] = ("safetensors",), replace: bool = False) -> Path:
    """Write ``model.safetensors``, ``config.json`` and the other formats into ``out_dir`` atomically; return it.

    Every file is written and checked in a staging folder first, then renamed into ``out_dir`` (see
    :func:`vitzoo.untrusted.write_folder`): a failed export leaves ``out_dir`` as it was, and a full disk or
    any other ``OSError`` is one :class:`ConfigError` line naming the folder. ``out_dir`` must be
    new, empty, or hold an export (:func:`is_export`); any other folder, a file or a symlink is refused.
    An export of the same weights and config gains the new formats beside its old ones.

    Args:
        model: a model from :func:`vitzoo.create_model` (it knows its ``variant``, ``cfg`` and ``attention_cfg``).
        out_dir: folder to write (created).
        data: preprocessing facts to keep with the weights (img_size, mean, std, classes).
        formats: also ``onnx``, ``torchscript``, ``pt2`` (:mod:`vitzoo.export.formats`: each file is
            checked against eager; ``ExportError`` names the format and op that fail).
            ``model.safetensors`` and ``config.json`` are always written.
        replace: when ``out_dir`` holds an export of other weights or another config, replace it (its
            files of other formats are removed); false: refuse in one line.
    """
    formats = check_formats(list(formats))
    out = Path(out_dir)
    config = export_config(model, data)
    remove: tuple[str, ...] = ()
    if out.is_symlink() or (os.path.lexists(out) and not out.is_dir()):
        kind = "a symlink" if out.is_symlink() else "a file"
        raise ConfigError(f"export folder {out} is {kind}; an export goes into a new folder or an export folder")
    if out.is_dir() and any(out.iterdir()):
        if not is_export(out):
            raise ConfigError(f"export folder {out} holds other files but no export ({CONFIG} + {WEIGHTS}); "
                              f"an export goes into a new folder or an export folder")
        if not holds(out, model, config):
            if not replace:
                raise ConfigError(f"export folder {out} holds an export of other weights or another config; "
                                  f"replace=True (export.py --replace) replaces it, or choose another folder")
            remove = OWNED
    try:
        return write_folder(lambda folder: _write(model, folder, config, formats), out, remove=remove)
    except OSError as e:  # a full disk or a read-only folder: one line, the folder untouched
        reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
        raise ConfigError(f"could not write the export to {out} ({reason}); free space there or write elsewhere, "
                          f"nothing in it changed") from None


def export_config(model: nn.Module, data: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The ``config.json`` of a model: format tag, variant, every model option, attention spec, preprocessing."""
    return {"format": FORMAT, "model": model.variant, "model_options": model_kwargs(model),
            "attention": attention_spec(model), "data": data or {}}


def _write(model: nn.Module, folder: Path, config: dict[str, Any], formats: list[str]) -> None:
    """Every file of an export into the (empty) staging ``folder``."""
    _save_safetensors(model, str(folder / WEIGHTS))
    write_new(folder / CONFIG, json.dumps(config, indent=2) + "\n")
    for fmt in formats:
        if fmt != "safetensors":
            export_format(model, folder, fmt)


def is_export(folder: Union[str, Path]) -> bool:
    """Whether ``folder`` holds a vitzoo export: ``config.json`` with the export format tag beside ``model.safetensors``
    (both regular files, not symlinks)."""
    config, weights = Path(folder) / CONFIG, Path(folder) / WEIGHTS
    if any(f.is_symlink() or not f.is_file() for f in (config, weights)):
        return False
    try:
        return read_json(config, "export config").get("format") == FORMAT
    except ConfigError:
        return False


def holds(folder: Union[str, Path], model: nn.Module, config: Mapping[str, Any]) -> bool:
    """Whether the export in ``folder`` has exactly ``config`` and ``model``'s weights (so its other formats
    describe the same model).

    Args:
        folder: an export folder (:func:`is_export`).
        model: the model about to be exported.
        config: its ``config.json`` (:func:`export_config`).
    """
    if not is_export(folder) or read_json(Path(folder) / CONFIG, "export config") != json.loads(json.dumps(config)):
        return False
    state = model.state_dict()
    try:
        with safe_open(str(Path(folder) / WEIGHTS), "pt") as f:
            keys = set(f.keys())
            if not keys <= set(state) or any(k not in keys and not _shared(k, state) for k in state):
                return False
            return all(torch.equal(f.get_tensor(k), state[k].detach().cpu()) for k in keys)
    except Exception:  # an unreadable weights file holds no usable export
        return False


def _shared(key: str, state: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state[key]`` shares storage with another entry (safetensors saves such a tensor once)."""
    ptr = state[key].untyped_storage().data_ptr()
    return sum(v.untyped_storage().data_ptr() == ptr for v in state.values()) > 1


def default_export_dir(path: Union[str, Path], model: nn.Module, data: Optional[dict[str, Any]] = None) -> Path:
    """Where ``scripts/export.py`` writes by default, beside what it read and never above its run folder.

    An export folder is written into itself (new formats are added). A checkpoint in a run's ``checkpoints/``
    (a run folder holds ``results.json``) goes to the run's ``export/`` when that is new or holds the same
    model, else to ``export-<checkpoint name>/``. Any other checkpoint goes beside it, to ``<name>-export/``.

    Args:
        path: the checkpoint or export folder (or a file in it) read.
        model: the model read from it.
        data: its preprocessing (part of the config compared with an existing export).
    """
    p = Path(path)
    if p.suffix != ".ckpt":
        return p if p.is_dir() else p.parent
    run = p.parent.parent
    if p.parent.name != "checkpoints" or not (run / "results.json").is_file():
        return p.with_name(f"{p.stem}-export")
    out = run / "export"
    if os.path.lexists(out) and not holds(out, model, export_config(model, data)):
        return run / f"export-{p.stem}"
    return out


def _paths(path: Union[str, Path]) -> tuple[Path, Path]:
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not folder.exists() and not p.exists():
        raise ConfigError(f"export path {p} does not exist")
    weights, config = folder / WEIGHTS, folder / CONFIG
    if p.suffix == ".safetensors":
        weights = p
    for f in (weights, config):
        if not f.is_file():
            raise ConfigError(f"export path {p}: missing {f.name} (expected {WEIGHTS} and {CONFIG} side by side)")
    return weights, config


def check_file_config(model: Mapping[str, Any], held: Mapping[str, tuple[int, Any]], source: Any) -> None:
    """The checks every load from a file runs before building its model (checkpoints and exports alike).

    The model options are type- and range-checked and must not describe more parameters than the
    file holds, so a hostile or mistaken config fails in one line before anything is allocated.

    Args:
        model: ``{"name": variant, **options}`` read from the file (``pretrained`` already dropped).
        held: tensor name -> (number of values, dtype) of the weights in the file.
        source: the file, named in messages.
    """
    options = dict(model)
    if not isinstance(options.get("name"), str):
        raise ConfigError(f"{source}: the model has no name; not a vitzoo model file")
    cfg = model_config(options.pop("name"), **options)
    check_size(estimate_params(cfg), sum(n for n, _ in held.values()), source)


def _header(weights: Path) -> dict[str, tuple[int, str]]:
    """Tensor name -> (number of values, dtype name) from a safetensors header (no tensor is read)."""
    try:
        with safe_open(str(weights), "pt") as f:
            out = {}
            for key in f.keys():
                part = f.get_slice(key)
                out[key] = (math.prod(part.get_shape()), part.get_dtype())
            return out
    except Exception as e:  # SafetensorError: truncated or lying header
        detail = (str(e).splitlines() or [""])[0]
        raise ConfigError(
            f"{weights}: cannot load the weights ({type(e).__name__}: {detail}); re-export the model"
        ) from None


def load_model(path: Union[str, Path], map_location: str = "cpu") -> nn.Module:
    """Rebuild an exported model in eval mode, without Lightning.

    Args:
        path: the export folder, its ``model.safetensors`` or its ``config.json``.
        map_location: device for the weights.

    The returned module has ``export_config`` (the parsed ``config.json``: preprocessing under ``data``).
    """
    weights, config_file = _paths(path)
    config = read_json(config_file, "export config")  # plain data only
    if config.get("format") != FORMAT:
        raise ConfigError(
            f"{config_file} is not a vitzoo export (format {config.get('format')!r}, expected {FORMAT!r})"
        )
    options = offline_options(export_options(config, config_file), config_file)
    held = _header(weights)
    check_file_config({"name": str(config.get("model")), **options}, held, config_file)
    model = create_model(str(config.get("model")), attention=config.get("attention"), **options)
    check_dtypes(model.state_dict(), {k: d for k, (_, d) in held.items()}, weights)
    load_weights(lambda: _load_safetensors(model, str(weights), strict=True, device=str(map_location)), weights)
    check_finite(model, weights)
    model.to(map_location).eval()
    model.export_config = config
    return model


def preprocess(model: nn.Module) -> Any:
    """The eval transform (PIL image or ``[3, H, W]`` tensor -> normalised tensor) an exported model was trained with.

    Args:
        model: a model from :func:`load_model` (its ``export_config["data"]`` holds img_size, mean, std).
    """
    data = getattr(model, "export_config", {}).get("data") or {}
    missing = [k for k in ("img_size", "mean", "std") if data.get(k) is None]
    if missing:
        raise ConfigError(f"the export's config.json data has no {missing[0]}; normalise the images yourself")
    return build_transform(int(data["img_size"]), data["mean"], data["std"], train=False)
