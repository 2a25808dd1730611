#!/usr/bin/env python
"""Export a trained model to deployment formats, each checked against the eager model.

Examples (from the repository root; ``key=value`` arguments, values parsed as YAML, checked like a config):

    python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt formats=[safetensors,onnx,torchscript,pt2]
    python scripts/export.py ckpt_path=<run>/export formats=[onnx]      # add ONNX to the run's export

``<run>`` is a training run's folder, ``outputs/train/<date>/<time>_<run name>``.

Options (:class:`ExportOptions`): ``ckpt_path`` (required: a ``.ckpt`` or an export folder), ``formats``
(default ``[safetensors]``; also ``onnx``, ``torchscript``, ``pt2``), ``out`` (default: beside what was
read, see :func:`vitzoo.export.files.default_export_dir`: the run's ``export/`` for its checkpoints,
the folder itself for an export folder), ``replace`` (default false). An ``out`` holding the same model
gains the new formats; one holding another model's export is replaced only with ``replace=true``; any
other folder, a file or a symlink is refused. Writes ``model.safetensors`` and ``config.json``
(preprocessing: img_size, mean, std, classes) and one file per format, printing each file's max |diff|
from eager at batch sizes 1 and 3, then the final folder. Every file is written in a staging folder
inside ``out`` and renamed into place, with the user's umask. A format that fails is one line naming it
and the op, and ``out`` stays as it was.
"""
import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vitzoo.export import check_formats, export_model
from vitzoo.export.files import default_export_dir
from vitzoo.registry import ConfigError


@dataclass
class ExportOptions:
    """The command line of ``scripts/export.py``.

    Args:
        ckpt_path: a training checkpoint (``.ckpt``) or an export folder.
        formats: ``safetensors`` (always written) and any of ``onnx``, ``torchscript``, ``pt2``.
        out: the export folder; None: beside what was read.
        replace: replace an export of another model in ``out``.
    """

    ckpt_path: Optional[str] = None
    formats: list[str] = field(default_factory=lambda: ["safetensors"])
    out: Optional[str] = None
    replace: bool = False


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises a one-line :class:`ConfigError` instead of printing usage and exiting."""

    def error(self, message: str):
        raise ConfigError(message)


def parse(argv: list[str]) -> ExportOptions:
    """``key=value`` arguments merged onto :class:`ExportOptions` (unknown keys and wrong types are one line)."""
    p = ArgumentParser(prog="scripts/export.py", description=__doc__.splitlines()[0],
                       epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="ckpt_path=..., formats=[...], out=..., replace=")
    args = p.parse_args(argv)
    for arg in args.overrides:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got {arg!r} (e.g. ckpt_path=<run>/checkpoints/last.ckpt)")
    try:
        given = OmegaConf.from_dotlist(args.overrides)
        if isinstance(given.get("formats"), str):  # formats=onnx: one format
            given.formats = [given.formats]
        merged = OmegaConf.merge(OmegaConf.structured(ExportOptions), given)
        options: ExportOptions = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "argument"
        detail = str(e).splitlines()[0]
        raise ConfigError(f"{key}: {detail}; options: ckpt_path, formats, out, replace (see --help)") from None
    if not options.ckpt_path:
        raise ConfigError("ckpt_path is required: python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt")
    check_formats(options.formats)
    return options


def main(argv: list[str]) -> int:
    try:
        options = parse(argv)
        from vitzoo.training.evaluate import load_trained  # Lightning only once the arguments are good

        path = Path(options.ckpt_path).expanduser()
        model, data = load_trained(path)
        out = Path(options.out).expanduser() if options.out else default_export_dir(path, model, data)
        export_model(model, out, data=data, formats=options.formats, replace=options.replace)
    except ConfigError as e:  # ExportError included: one line naming the format and the op
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"export -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
