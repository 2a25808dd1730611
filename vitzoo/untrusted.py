"""Checks for data read back from files vitzoo wrote (exports, checkpoints): plain data, never code; and the
writes every command shares beside :mod:`vitzoo.fileio`'s atomic file: a new file and a folder written atomically,
none through a symlink.

No Lightning import here: :func:`vitzoo.load_model` uses it for inference-only installs.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Union

import torch

from vitzoo.fileio import open_new
from vitzoo.registry import ConfigError

PLAIN = (str, int, float, bool, type(None))


def plain_data(value: Any, where: str) -> None:
    """Raise a one-line ConfigError unless ``value`` is JSON-like plain data without OmegaConf interpolations.

    Args:
        value: what was read back (dicts with string keys, lists, str, int, float, bool, None).
        where: what it was read from and its key path, named in the message.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: key {key!r} is not a string; the file is not plain vitzoo data")
            plain_data(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            plain_data(item, f"{where}[{i}]")
    elif not isinstance(value, PLAIN):
        raise ConfigError(f"{where} is a {type(value).__name__}, not plain data; the file is not plain vitzoo data")
    elif isinstance(value, str) and "${" in value:
        raise ConfigError(f"{where}={value!r} is an interpolation; files read back must hold plain values")


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` (plain data checked), or a one-line ConfigError naming the file.

    Args:
        path: the file to read.
        what: what the file is, for messages (e.g. ``"export config"``).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read {what} {path} ({type(e).__name__}: {e.strerror if isinstance(e, OSError) else e.reason})"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}); re-export the model"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} is not a JSON object; re-export the model")
    plain_data(data, str(path))
    return data


def export_options(config: Mapping[str, Any], source: Path) -> dict[str, Any]:
    """``model_options`` of an export config: a mapping (its keys are checked by the model registry)."""
    options = config.get("model_options")
    if not isinstance(options, Mapping):
        raise ConfigError(f"{source}: model_options is missing or not a mapping; re-export the model")
    return dict(options)


def note(message: str) -> None:
    """One ``note:`` line on stderr (what a load from a file changed, e.g. a dropped download)."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def offline_options(options: Mapping[str, Any], source: Any) -> dict[str, Any]:
    """Model options read from a file without ``pretrained``: a trained model's weights are in the file, so
    rebuilding it never reaches the network (the drop is one ``note:`` line).

    Args:
        options: model options (``model`` hyper-parameter or an export's ``model_options``).
        source: the file, named in the note.
    """
    out = dict(options)
    if out.pop("pretrained", None) is not None:
        note(f"{source}: model.pretrained={options['pretrained']!r} dropped (the weights come from the file; "
             f"nothing is downloaded)")
    return out


def offline_data(data: Mapping[str, Any], source: Any) -> dict[str, Any]:
    """A data config read from a file with ``download`` forced off (one ``note:`` line when it was on).

    Args:
        data: the saved data config.
        source: the file, named in the note.
    """
    out = dict(data)
    if out.get("download"):
        note(f"{source}: data.download=true dropped (a saved config never downloads; pass data.download=true "
             f"on the command line to allow it)")
    if "download" in out:
        out["download"] = False
    return out


def load_weights(load: Any, source: Path) -> None:
    """Call ``load()`` (a safetensors load into a model); a truncated file or mismatched weights is one line.

    Args:
        load: loads the weights into the model (raises on a bad file or mismatch).
        source: the weights file, named in the message.
    """
    try:
        load()
    except Exception as e:  # SafetensorError (truncated/corrupt header), RuntimeError (missing keys, shapes)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(e).__name__
        raise ConfigError(
            f"{source}: cannot load the weights ({type(e).__name__}: {detail}); re-export the model"
        ) from None


def check_size(estimate: int, held: int, source: Any) -> None:
    """Refuse a config that needs more weights than the file holds, before the model is allocated.

    Args:
        estimate: a lower bound on the config's parameter count (:func:`vitzoo.models.factory.estimate_params`).
        held: how many numbers the weights file holds.
        source: the file, named in the message.
    """
    if estimate > held:
        raise ConfigError(
            f"{source}: the config describes at least {estimate} parameters but the weights hold {held}; "
            f"the config does not belong to these weights"
        )


def _floating(dtype: Union[str, torch.dtype]) -> bool:
    if isinstance(dtype, torch.dtype):
        return dtype.is_floating_point
    return str(dtype).upper().startswith(("F", "BF"))  # safetensors header names: F32, F16, BF16, F64, F8_*


def check_dtypes(expected: Mapping[str, torch.Tensor], held: Mapping[str, Any], source: Any) -> None:
    """Every floating tensor of the model must be floating in the file (int64 or bool weights are refused).

    Args:
        expected: the model's ``state_dict()``.
        held: tensor name -> dtype in the file (a ``torch.dtype`` or a safetensors dtype name).
        source: the file, named in the message.
    """
    for name, tensor in expected.items():
        if name in held and tensor.is_floating_point() and not _floating(held[name]):
            raise ConfigError(f"{source}: weight {name} is {held[name]}, not floating point; re-export the model")


def check_finite(model: torch.nn.Module, source: Any) -> None:
    """Refuse weights holding NaN or infinity (such a model predicts the same for every image).

    Args:
        model: the model after loading.
        source: the file, named in the message.
    """
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ConfigError(f"{source}: weight {name} holds NaN or infinite values; use weights from a good run")


def write_new(path: Union[str, Path], text: str) -> Path:
    """Write ``text`` to a file that does not exist yet: never through a symlink, never over another file.

    Args:
        path: the file to create (its folder must exist).
        text: its content.
    """
    with os.fdopen(open_new(Path(path)), "w") as f:
        f.write(text)
    return Path(path)


def free_path(path: Union[str, Path]) -> Path:
    """``path`` if nothing (not even a dangling symlink) is there, else ``<stem>-2<suffix>``, ``-3`` …

    Args:
        path: the preferred name.
    """
    path = Path(path)
    for i in range(1, 10_000):
        candidate = path if i == 1 else path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not os.path.lexists(candidate):
            return candidate
    raise ConfigError(f"{path}: no free name left beside it; clean up the folder")


def file_mode() -> int:
    """The mode a new regular file gets under the process's umask (``0o644`` under the usual ``022``)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_folder(write: Callable[[Path], Any], out: Union[str, Path], remove: Collection[str] = ()) -> Path:
    """Write files into the folder ``out`` atomically, and nowhere else.

    ``write`` fills a fresh staging folder inside ``out`` (same file system); only when it returns is each
    file moved into ``out`` by a rename (``os.replace``), so ``out`` never holds a half-written file and a
    failure leaves it as it was (a folder this call created is removed again). A symlink at a file's name
    is replaced by the file, its target left alone. Files get the umask's mode (:func:`file_mode`).

    Args:
        write: writes the files into the folder it is given.
        out: the folder; created when missing. A symlink or anything but a folder is refused.
        remove: names in ``out`` to delete after the move when ``write`` did not write them (files or
            symlinks only; nothing else in ``out`` is touched).
    """
    out = Path(out)
    if out.is_symlink():
        raise ConfigError(f"{out} is a symlink; vitzoo writes only into real folders")
    if os.path.lexists(out) and not out.is_dir():
        raise ConfigError(f"{out} is a file, not a folder; choose a folder to write into")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        write(staging)
        names = sorted(p.name for p in staging.iterdir())
        for name in names:
            if (out / name).is_dir() and not (out / name).is_symlink():
                raise ConfigError(f"{out / name} is a folder; remove it to write {name} there")
        mode = file_mode()
        for name in names:
            if (staging / name).is_file():
                os.chmod(staging / name, mode)
            os.replace(staging / name, out / name)
        for name in set(remove) - set(names):
            target = out / name
            if target.is_symlink() or (target.exists() and stat.S_ISREG(target.lstat().st_mode)):
                target.unlink()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            try:
                out.rmdir()  # the folder this call made, if nothing else came into it
            except OSError:
                pass
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return out
