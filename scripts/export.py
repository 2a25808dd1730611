#!/usr/bin/env python
"""Export a trained model to deployment formats, each checked against the eager model.

Examples (from the repository root; arguments are Hydra-style ``key=value``, values parsed as YAML):

    python scripts/export.py ckpt_path=outputs/train/<date>/<time>_<run>/checkpoints/last.ckpt \
        formats=[safetensors,onnx,torchscript,pt2]
    python scripts/export.py ckpt_path=outputs/train/<date>/<time>_<run>/export formats=[onnx]   # an export folder

Options: ``ckpt_path`` (required: a ``.ckpt`` or an export folder), ``formats`` (default
``[safetensors]``; also ``onnx``, ``torchscript``, ``pt2``), ``out`` (default: the run's ``export/``
folder beside ``checkpoints/``, or the given export folder). Writes ``model.safetensors`` and
``config.json`` (preprocessing: img_size, mean, std, classes) and one file per format, printing each
file's max |diff| from eager at batch sizes 1 and 3. A format that fails is one line naming it and the op.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from vitzoo.export import export_model
from vitzoo.registry import ConfigError

KEYS = {"ckpt_path", "formats", "out"}


def parse(argv: list[str]) -> dict[str, Any]:
    """``key=value`` arguments (YAML values) checked against :data:`KEYS`."""
    options: dict[str, Any] = {"formats": ["safetensors"], "out": None, "ckpt_path": None}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ConfigError(f"unknown argument {arg!r}; use {'=..., '.join(sorted(KEYS))}=...")
        options[key] = yaml.safe_load(value)
    if not options["ckpt_path"]:
        raise ConfigError("ckpt_path is required: python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt")
    if isinstance(options["formats"], str):
        options["formats"] = [options["formats"]]
    return options


def load(path: Path) -> tuple[Any, dict[str, Any], Path]:
    """Model, preprocessing and default output folder of a checkpoint or an export folder."""
    if path.suffix == ".ckpt":
        from vitzoo.training import load_checkpoint_net  # Lightning only for checkpoints

        net, data = load_checkpoint_net(path)
        return net, data, path.parent.parent / "export"
    import vitzoo

    model = vitzoo.load_model(path)
    return model, model.export_config.get("data") or {}, path if path.is_dir() else path.parent


def main(argv: list[str]) -> int:
    try:
        options = parse(argv)
        model, data, default_out = load(Path(str(options["ckpt_path"])).expanduser())
        out = export_model(model, options["out"] or default_out, data=data, formats=options["formats"])
    except ConfigError as e:  # ExportError included: one line naming the format and the op
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"export -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
