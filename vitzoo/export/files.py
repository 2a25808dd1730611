"""Export a trained model as ``model.safetensors`` + ``config.json``, and load it back without Lightning.

>>> from vitzoo.export import export_model, load_model, preprocess
>>> export_model(model, "run/export", data={"img_size": 32, "mean": [...], "std": [...]})
>>> model = load_model("run/export")          # or the .safetensors file, or config.json
>>> logits = model(preprocess(model)(pil_image)[None])  # the model's own resize + mean/std

``config.json`` holds the variant, every option of its config dataclass, the attention spec and
(optionally) the preprocessing the model was trained with, so inference needs only vitzoo.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

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
    replace_file,
)

WEIGHTS, CONFIG, FORMAT = "model.safetensors", "config.json", "vitzoo-export/1"


def export_model(model: nn.Module, out_dir: Union[str, Path], data: Optional[dict[str, Any]] = None,
                 formats: Sequence[str] = ("safetensors",)) -> Path:
    """Write ``out_dir/model.safetensors`` and ``out_dir/config.json``; return ``out_dir``.

    Args:
        model: a model from :func:`vitzoo.create_model` (it knows its ``variant``, ``cfg`` and ``attention_cfg``).
        out_dir: folder to write (created).
        data: preprocessing facts to keep with the weights (img_size, mean, std, classes).
        formats: also ``onnx``, ``torchscript``, ``pt2`` (:mod:`vitzoo.export.formats`: each file is
            checked against eager; ``ExportError`` names the format and op that fail).
            ``model.safetensors`` and ``config.json`` are always written.
    """
    formats = check_formats(list(formats))
    out = Path(out_dir)
    if out.is_symlink():
        raise ConfigError(f"export folder {out} is a symlink; vitzoo writes only into real folders")
    out.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS, CONFIG, *FILES.values()):  # a planted symlink is replaced, its target left alone
        if (out / name).is_symlink():
            (out / name).unlink()
    config = {"format": FORMAT, "model": model.variant, "model_options": model_kwargs(model),
              "attention": attention_spec(model), "data": data or {}}
    _save_safetensors(model, str(out / WEIGHTS))
    replace_file(out / CONFIG, json.dumps(config, indent=2) + "\n")
    for fmt in formats:
        if fmt != "safetensors":
            export_format(model, out, fmt)
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
