#!/usr/bin/env python
"""Export a trained model to deployment formats, each checked against the eager model.

Examples (from the repository root; ``<run>`` is a training run's folder, ``outputs/train/<date>/<time>_<run name>``):

    python scripts/export.py <run>/checkpoints/last.ckpt --formats safetensors onnx torchscript pt2
    python scripts/export.py <run>/export --formats onnx          # add ONNX to the run's export
    python scripts/export.py <run>/checkpoints/last.ckpt --out deploy/ --replace

Arguments: a training checkpoint (``.ckpt``) or an export folder, read by the loader predict uses too
(:func:`vitzoo.training.evaluate.load_trained`), then the options below. ``--out`` defaults to a folder
beside what was read (:func:`vitzoo.export.files.default_export_dir`): the run's ``export/`` for its
checkpoints, the folder itself for an export folder. An ``--out`` holding the same model gains the new
formats; one holding another model's export is replaced only with ``--replace``; any other folder, a file
or a symlink is refused. Writes ``model.safetensors`` and ``config.json`` (preprocessing: img_size, mean,
std, classes) and one file per format, printing each file's max |diff| from eager at batch sizes 1 and 3,
then the final folder. Every file is written in a staging folder inside ``--out`` and renamed into place,
with the user's umask. A bad option, a format that fails (naming it and the op) or a full disk is one
``error:`` line, and ``--out`` stays as it was.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitzoo.export import FILES, export_model
from vitzoo.export.files import default_export_dir
from vitzoo.registry import ArgumentParser, ConfigError

FORMATS = ("safetensors", *FILES)  # safetensors (+ config.json) is always written


def parser() -> ArgumentParser:
    """The command line: what to export and the options."""
    p = ArgumentParser(prog="scripts/export.py", description=__doc__.splitlines()[0],
                       epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a training checkpoint (.ckpt) or an export folder")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=["safetensors"], metavar="FORMAT",
                   help=f"any of {', '.join(FORMATS)} (default safetensors, always written)")
    p.add_argument("--out", default=None, help="the export folder (default: beside what was read)")
    p.add_argument("--replace", action="store_true", help="replace an export of another model in --out")
    return p


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        from vitzoo.training.evaluate import load_trained  # Lightning only once the arguments are good

        path = Path(args.model).expanduser()
        model, data = load_trained(path)
        out = Path(args.out).expanduser() if args.out else default_export_dir(path, model, data)
        export_model(model, out, data=data, formats=args.formats, replace=args.replace)
    except ConfigError as e:  # ExportError included: one line naming the format and the op
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"export -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
