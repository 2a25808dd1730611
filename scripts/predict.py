#!/usr/bin/env python
"""Top-5 classes of images from a trained model, with the preprocessing saved beside it.

Examples (from the repository root; ``<run>`` is a training run's folder):

    python scripts/predict.py <run>/export cat.jpg dog.png
    python scripts/predict.py <run>/export photos/ --backend onnx
    python scripts/predict.py <run>/checkpoints/last.ckpt photos/ --topk 3

Arguments: an export folder (``config.json`` + ``model.safetensors`` / ``model.onnx``) or a ``.ckpt``,
read by the loader export uses too (:func:`vitzoo.training.evaluate.load_trained`; ``--backend onnx``
reads ``model.onnx`` of an export folder instead), then image files or folders (searched recursively).
The first line on stderr names the runtime (eager PyTorch or ONNX Runtime). Images are read by the same
guarded reader as training data: regular files only (a FIFO is refused without being opened) and at most
``--max-pixels`` pixels. An image that cannot be read is one ``error:`` line on stderr naming it; the other
images are still predicted (exit status 1 when any failed); a bad option is one ``error:`` line too.
Names are printed with newlines and control characters escaped.
"""
from __future__ import annotations

import argparse
import sys

from vitzoo.data.datasets import MAX_PIXELS
from vitzoo.export import Predictor, image_files, load_predictor, predict_files
from vitzoo.export.predict import BACKENDS, printable
from vitzoo.registry import ArgumentParser, ConfigError


def parser() -> ArgumentParser:
    """The command line: the model, the images and the options."""
    p = ArgumentParser(prog="scripts/predict.py", description=__doc__.splitlines()[0],
                       epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an export folder or a training checkpoint (.ckpt)")
    p.add_argument("images", nargs="+", help="image files or folders (searched recursively)")
    p.add_argument("--backend", choices=BACKENDS, default="safetensors",
                   help="safetensors: eager PyTorch (default); onnx: ONNX Runtime on model.onnx (export folders)")
    p.add_argument("--topk", type=int, default=5, help="classes printed per image (default 5)")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (default 32)")
    p.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                   help=f"largest image (width x height) read; a larger one is refused (default {MAX_PIXELS})")
    return p


def load(model: str, backend: str) -> Predictor:
    """The predictor of a checkpoint or an export folder: ONNX Runtime from an export folder, else eager."""
    if backend == "onnx":
        if model.endswith(".ckpt"):
            raise ConfigError(f"--backend onnx needs an export folder; export {model} with "
                              f"python scripts/export.py {model} --formats onnx")
        return load_predictor(model, backend="onnx")
    from vitzoo.training.evaluate import load_trained  # Lightning only once the arguments are good

    net, data = load_trained(model)
    return Predictor(net, data, "eager PyTorch")


def main(argv: list[str]) -> int:
    failed = 0
    try:
        args = parser().parse_args(argv)
        files = image_files(args.images)
        predictor = load(args.model, args.backend)
        print(f"predict: {printable(args.model)} on {predictor.runtime}", file=sys.stderr, flush=True)
        results = predict_files(predictor, files, topk=args.topk, batch_size=args.batch_size,
                                max_pixels=args.max_pixels, option="--max-pixels")
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
