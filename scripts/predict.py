#!/usr/bin/env python
"""Top-5 classes of images from a trained model, with the preprocessing saved beside it.

Examples (from the repository root):

    python scripts/predict.py outputs/train/<date>/<time>_<run>/export cat.jpg dog.png
    python scripts/predict.py outputs/train/<date>/<time>_<run>/export photos/ backend=onnx
    python scripts/predict.py outputs/train/<date>/<time>_<run>/checkpoints/last.ckpt photos/ topk=3

Arguments: an export folder (``config.json`` + ``model.safetensors`` / ``model.onnx``) or a ``.ckpt``,
then image files or folders (searched recursively). Options (``key=value``): ``backend=safetensors``
(default, eager vitzoo) or ``backend=onnx`` (onnxruntime), ``topk=5``, ``batch_size=32``.
An image that cannot be read is one ``error:`` line on stderr; the other images are still predicted
(exit status 1 when any failed). Names are printed with newlines and control characters escaped.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from vitzoo.export import Predictor, image_files, load_predictor, predict_files
from vitzoo.export.predict import printable
from vitzoo.registry import ConfigError

OPTIONS = {"backend": "safetensors", "topk": 5, "batch_size": 32}  # key=value options and their defaults


def parse(argv: list[str]) -> tuple[str, list[str], dict[str, Any]]:
    """The model path, the image paths and the ``key=value`` options."""
    options, paths = dict(OPTIONS), []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in OPTIONS:
            options[key] = yaml.safe_load(value)
        else:
            paths.append(arg)
    if len(paths) < 2:
        raise ConfigError(
            "usage: python scripts/predict.py <export folder or .ckpt> <images or folders> [backend=onnx] [topk=5]"
        )
    return paths[0], paths[1:], options


def checkpoint_predictor(ckpt_path: str, backend: str) -> Predictor:
    """A :class:`~vitzoo.export.Predictor` running a training checkpoint's network (eager only)."""
    if backend != "safetensors":
        raise ConfigError(f"backend={backend} needs an export folder; export the checkpoint with scripts/export.py")
    from vitzoo.training import load_checkpoint_net  # Lightning only for checkpoints

    return Predictor(*load_checkpoint_net(Path(ckpt_path).expanduser()))


def main(argv: list[str]) -> int:
    try:
        model_path, inputs, options = parse(argv)
        predictor = (
            checkpoint_predictor(model_path, options["backend"])
            if model_path.endswith(".ckpt")
            else load_predictor(model_path, backend=options["backend"])
        )
        results = predict_files(
            predictor, image_files(inputs), topk=options["topk"], batch_size=options["batch_size"]
        )
        failed = 0
        for path, top in results:
            if isinstance(top, ConfigError):
                failed += 1
                print(f"error: {printable(str(top))}", file=sys.stderr, flush=True)
                continue
            print(f"{printable(str(path))}: " + ", ".join(f"{name} {p:.3f}" for name, p in top), flush=True)
    except ConfigError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
