#!/usr/bin/env python
"""Export a trained model to deployment formats, each checked against the eager model.

Examples (from the repository root; arguments are Hydra-style ``key=value``, values parsed as YAML):

    python scripts/export.py ckpt_path=outputs/train/<date>/<time>_<run>/checkpoints/last.ckpt \
        formats=[safetensors,onnx,torchscript,pt2]
    python scripts/export.py ckpt_path=outputs/train/<date>/<time>_<run>/export formats=[onnx]   # an export folder

Options: ``ckpt_path`` (required: a ``.ckpt`` or an export folder), ``formats`` (default
``[safetensors]``; also ``onnx``, ``torchscript``, ``pt2``), ``out`` (default: the run's ``export/``
folder beside ``checkpoints/``, or the given export folder), ``replace`` (default false: when ``out``
exists a new folder ``<out>-2``, ``-3`` … is written instead, so the run's export, which its
results.json describes, stays; true: ``out`` is replaced, all files or none). Writes ``model.safetensors`` and
``config.json`` (preprocessing: img_size, mean, std, classes) and one file per format, printing each
file's max |diff| from eager at batch sizes 1 and 3. A format that fails is one line naming it and the op.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from vitzoo.export import export_model
from vitzoo.registry import ConfigError
from vitzoo.untrusted import free_path

KEYS = {"ckpt_path", "formats", "out", "replace"}


def parse(argv: list[str]) -> dict[str, Any]:
    """``key=value`` arguments (YAML values) checked against :data:`KEYS`."""
    options: dict[str, Any] = {"formats": ["safetensors"], "out": None, "ckpt_path": None, "replace": False}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ConfigError(f"unknown argument {arg!r}; use {'=..., '.join(sorted(KEYS))}=...")
        options[key] = yaml.safe_load(value)
    if not options["ckpt_path"]:
        raise ConfigError("ckpt_path is required: python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt")
    if not isinstance(options["replace"], bool):
        raise ConfigError(f"replace must be true or false (got {options['replace']!r})")
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


def write_folder(write: Any, out: Path) -> Path:
    """Run ``write(folder)`` into a fresh ``<out>.tmp`` folder, then move it to ``out`` (replacing it): a failed
    export leaves ``out`` as it was.

    Args:
        write: writes the export into the folder it is given.
        out: the export folder.
    """
    tmp = free_path(out.with_name(out.name + ".tmp"))
    try:
        write(tmp)
        if out.is_symlink() or out.is_file():
            out.unlink()
        elif out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    try:
        options = parse(argv)
        model, data, default_out = load(Path(str(options["ckpt_path"])).expanduser())
        out = Path(str(options["out"] or default_out)).expanduser()
        out = out if options["replace"] else free_path(out)
        out = write_folder(lambda folder: export_model(model, folder, data=data, formats=options["formats"]), out)
    except ConfigError as e:  # ExportError included: one line naming the format and the op
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"export -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
