"""Inference from an export folder: the model (eager or ONNX) and its preprocessing.

>>> from vitzoo.export import load_predictor, predict_files
>>> predictor = load_predictor("outputs/.../export", backend="onnx")
>>> for path, top in predict_files(predictor, ["cat.jpg"]): print(path, top)

A training checkpoint becomes a :class:`Predictor` with
``Predictor(*vitzoo.training.load_checkpoint_net(ckpt_path))``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from vitzoo.data.transforms import build_transform
from vitzoo.export.files import load_model
from vitzoo.export.formats import FILES, read_onnx
from vitzoo.registry import ConfigError

IMAGE_TYPES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif")
BACKENDS = ("safetensors", "onnx")


@dataclass
class Predictor:
    """A function from normalised images ``[B, 3, S, S]`` to logits ``[B, K]`` and the preprocessing facts.

    Args:
        run: images -> logits.
        data: ``img_size``, ``mean``, ``std``, ``classes`` as saved with the model.
    """

    run: Callable[[Tensor], Tensor]
    data: dict[str, Any]


def load_predictor(path: str | Path, backend: str = "safetensors") -> Predictor:
    """A :class:`Predictor` from an export folder.

    Args:
        path: an export folder (``config.json`` + ``model.safetensors`` / ``model.onnx``) or a file in it.
        backend: ``safetensors`` (eager vitzoo model) or ``onnx`` (onnxruntime on ``model.onnx``).
    """
    p = Path(path).expanduser()
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend} is unknown; choose one of {', '.join(BACKENDS)}")
    if p.suffix == ".ckpt":
        raise ConfigError(f"{p} is a training checkpoint; export it with scripts/export.py ckpt_path={p}")
    folder = p if p.is_dir() else p.parent
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{p} is not an export folder with config.json")
    data = json.loads(config_file.read_text()).get("data") or {}
    if backend == "onnx":
        onnx_file = folder / FILES["onnx"]
        if not onnx_file.is_file():
            raise ConfigError(f"backend=onnx: no {onnx_file}; export it with scripts/export.py formats=[onnx]")
        return Predictor(read_onnx(onnx_file), data)
    return Predictor(load_model(folder), data)


def image_files(inputs: list[str]) -> list[Path]:
    """Image files given directly or found (recursively, sorted) in given folders."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_TYPES)
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"image path {p} does not exist")
    if not files:
        raise ConfigError(f"no images ({', '.join(IMAGE_TYPES)}) in {', '.join(inputs)}")
    return files


def predict_files(predictor: Predictor, files: list[Path], topk: int = 5,
                  batch_size: int = 32) -> Iterator[tuple[Path, list[tuple[str, float]]]]:
    """``(file, [(class, probability), ...])`` with the ``topk`` classes of every image.

    Images are preprocessed as at evaluation (vitzoo's eval transform at the saved ``img_size``,
    ``mean``, ``std``).
    """
    from PIL import Image

    d = predictor.data
    if not {"img_size", "mean", "std"} <= set(d):
        raise ConfigError(
            "the model has no saved preprocessing (data.img_size/mean/std); export it from a training run"
        )
    transform = build_transform(int(d["img_size"]), d["mean"], d["std"], train=False)
    classes = list(d.get("classes") or [])
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        x = torch.stack([transform(Image.open(f).convert("RGB")) for f in chunk])  # [B, 3, S, S]
        with torch.no_grad():
            probs = torch.as_tensor(predictor.run(x)).float().softmax(dim=-1)  # [B, K]
        values, indices = probs.topk(min(topk, probs.shape[-1]), dim=-1)
        for f, vs, ids in zip(chunk, values.tolist(), indices.tolist()):
            yield f, [(classes[i] if i < len(classes) else str(i), v) for i, v in zip(ids, vs)]


__all__ = ["Predictor", "image_files", "load_predictor", "predict_files"]
