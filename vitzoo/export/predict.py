"""Inference from an export folder: the model (eager or ONNX) and its preprocessing.

>>> from vitzoo.export import load_predictor, predict_files
>>> predictor = load_predictor("outputs/.../export", backend="onnx")
>>> for path, top in predict_files(predictor, ["cat.jpg"]): print(path, top)

A training checkpoint becomes a :class:`Predictor` with
``Predictor(*vitzoo.training.evaluate.load_trained(ckpt_path))``. Images are read by the guarded reader
training uses (:func:`vitzoo.data.datasets.read_rgb`: regular files only, at most ``max_pixels`` pixels).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from vitzoo.data.datasets import MAX_PIXELS, check_max_pixels, read_rgb
from vitzoo.data.transforms import build_transform
from vitzoo.export.files import load_model
from vitzoo.export.formats import FILES, read_onnx
from vitzoo.models.factory import INT_RANGES
from vitzoo.registry import ConfigError
from vitzoo.untrusted import read_json

IMAGE_TYPES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif")
BACKENDS = ("safetensors", "onnx")


@dataclass
class Predictor:
    """A function from normalised images ``[B, 3, S, S]`` to logits ``[B, K]`` and the preprocessing facts.

    Args:
        run: images -> logits.
        data: ``img_size``, ``mean``, ``std``, ``classes`` as saved with the model.
        runtime: what runs the model, for the user (``eager PyTorch``, ``ONNX Runtime``).
    """

    run: Callable[[Tensor], Tensor]
    data: dict[str, Any]
    runtime: str = "eager PyTorch"


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
        raise ConfigError(f"{p} is a training checkpoint; export it with python scripts/export.py {p}")
    folder = p if p.is_dir() else p.parent
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{p} is not an export folder with config.json")
    data = read_json(config_file, "export config").get("data") or {}
    if backend == "onnx":
        onnx_file = folder / FILES["onnx"]
        if not onnx_file.is_file():
            raise ConfigError(f"the onnx backend needs {onnx_file}; add it with python scripts/export.py "
                              f"{folder} --formats onnx")
        return Predictor(read_onnx(onnx_file), data, f"ONNX Runtime ({onnx_file.name})")
    return Predictor(load_model(folder), data, "eager PyTorch (model.safetensors)")


def image_files(inputs: list[str]) -> list[Path]:
    """Image files given directly or found (recursively, sorted) in given folders.

    Nothing is opened here: an entry that is not a regular file (a FIFO named ``x.png``) is listed and
    refused by the reader in its own line.
    """
    files: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_TYPES and not f.is_dir())
        elif os.path.lexists(p):
            files.append(p)
        else:
            raise ConfigError(f"image path {p} does not exist")
    if not files:
        raise ConfigError(f"no images ({', '.join(IMAGE_TYPES)}) in {', '.join(inputs)}")
    return files


def printable(text: str) -> str:
    """``text`` with newlines and other control characters escaped (``\\n``): one name, one line of output."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def check_predict_options(data: dict[str, Any], topk: Any, batch_size: Any) -> int:
    """The checked ``img_size`` of the saved preprocessing; ``topk`` and ``batch_size`` positive integers.

    Args:
        data: the saved preprocessing (img_size, mean, std, classes).
        topk: classes printed per image.
        batch_size: images per forward pass.
    """
    for name, value in (("topk", topk), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer (got {value!r})")
    if not {"img_size", "mean", "std"} <= set(data):
        raise ConfigError(
            "the model has no saved preprocessing (data.img_size/mean/std); export it from a training run"
        )
    low, high = INT_RANGES["img_size"]
    size = data["img_size"]
    if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
        raise ConfigError(f"the saved data.img_size={size!r} is not an integer in [{low}, {high}]; re-export the model")
    return size


def predict_files(predictor: Predictor, files: list[Path], topk: int = 5, batch_size: int = 32,
                  max_pixels: int = MAX_PIXELS, option: str = "max_pixels") -> Iterator[tuple[Path, Any]]:
    """``(file, [(class, probability), ...])`` with the ``topk`` classes of every image, or ``(file, error)``
    (a :class:`ConfigError` naming the file) for an image that cannot be read: the others go on.

    Images are preprocessed as at evaluation (vitzoo's eval transform at the saved ``img_size``,
    ``mean``, ``std``). Class names are :func:`printable`.

    Args:
        predictor: the model and its saved preprocessing.
        files: the images (:func:`image_files`).
        topk: classes per image.
        batch_size: images per forward pass.
        max_pixels: the largest image (width × height) read; a larger one is one error.
        option: how the caller names ``max_pixels`` (``--max-pixels`` on predict's command line), for messages.
    """
    d = predictor.data
    transform = build_transform(check_predict_options(d, topk, batch_size), d["mean"], d["std"], train=False)
    max_pixels = check_max_pixels(max_pixels, option)
    hint = f"skipped, the other images go on ({option}={max_pixels} limits the pixels read)"
    classes = [printable(c) for c in (d.get("classes") or [])]
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        images, failed = {}, {}
        for f in chunk:
            try:
                images[f] = transform(read_rgb(f, max_pixels, hint))
            except ConfigError as e:
                failed[f] = e
        yield from _top(predictor, chunk, images, failed, topk, classes)


def _top(predictor: Predictor, chunk: list[Path], images: dict[Path, Tensor], failed: dict[Path, ConfigError],
         topk: int, classes: list[str]) -> Iterator[tuple[Path, Any]]:
    """One batch's results in file order: top-k classes, or the error of a file that could not be read."""
    found: dict[Path, Any] = dict(failed)
    if images:
        x = torch.stack(list(images.values()))  # [B, 3, S, S]
        with torch.no_grad():
            probs = torch.as_tensor(predictor.run(x)).float().softmax(dim=-1)  # [B, K]
        values, indices = probs.topk(min(topk, probs.shape[-1]), dim=-1)
        for f, vs, ids in zip(images, values.tolist(), indices.tolist()):
            found[f] = [(classes[i] if i < len(classes) else str(i), v) for i, v in zip(ids, vs)]
    for f in chunk:
        yield f, found[f]


__all__ = ["Predictor", "check_predict_options", "image_files", "load_predictor", "predict_files", "printable"]
