"""Deployment formats beside ``model.safetensors``: ONNX, TorchScript (trace) and ``torch.export`` (pt2).

Every file has a dynamic batch dimension and is checked on export: it is loaded back, run at batch
sizes 1 and 3 on random images, and its max |difference| from the eager model is printed (and must
stay within :data:`TOLERANCE`). A backend that cannot be exported gets a one-line
:class:`ExportError` naming the format and the op, never a stack trace.

ONNX needs the optional ``export`` extra (``pip install -e ".[export]"``: onnx, onnxscript, onnxruntime).

>>> from vitzoo.export import export_format
>>> export_format(model, "run/export", "onnx")      # -> run/export/model.onnx, max |diff| printed
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitzoo.models import attention_spec
from vitzoo.registry import ConfigError

FILES = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt", "pt2": "model.pt2"}  # format -> file name
TOLERANCE = 1e-4  # max |logit difference| from eager (float32) a written file may show
CHECK_BATCHES = (1, 3)  # batch sizes every file is run at (the export example has batch 2)

console = Console()


class ExportError(ConfigError):
    """A model that cannot be written to (or read back from) a format; one line naming the format and the op."""


def failing_op(exc: BaseException) -> str:
    """The op an exporter or runtime complained about (``aten.fft_rfft2``, ``Einsum(12)``…), else the error type."""
    text = str(exc)
    patterns = (r"aten[.:]{1,2}[A-Za-z_][\w.]*", r"implementation for (\w+\(\d+\))", r"\b(prim::\w+|onnx::\w+)",
                r"Python function call '(\w+)'")
    for pattern in patterns:
        if m := re.search(pattern, text):
            return m[m.lastindex or 0]
    first = text.strip().splitlines()[0][:120] if text.strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def example(model: nn.Module, batch: int) -> Tensor:
    """Random images ``[batch, in_chans, img_size, img_size]`` on the model's device (seeded)."""
    s, c = model.cfg.img_size, model.cfg.in_chans
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, c, s, s, generator=g).to(next(model.parameters()).device)


def batch_dim() -> dict[int, object]:
    """``torch.export`` dynamic-shape spec of the image input: a free batch dimension."""
    return {0: torch.export.Dim("batch", min=1, max=4096)}


# ------------------------------------------------------------------------- writers and readers

def write_onnx(model: nn.Module, path: Path) -> None:
    """``torch.onnx.export`` (dynamo exporter, no fallback), input ``image`` with a dynamic batch.

    Traced with SDPA's math kernel: the CPU flash kernel's output layout differs from what the
    exporter's own decomposition of SDPA produces, and a reshape traced against the first fails on
    the second (``Cannot view a tensor ...``); ONNX has no fused kernel to lose.
    """
    with sdpa_kernel(SDPBackend.MATH):
        torch.onnx.export(model, (example(model, 2),), str(path), dynamo=True, verbose=False, input_names=["image"],
                          output_names=["logits"], dynamic_shapes=(batch_dim(),), optimize=True)


def read_onnx(path: Path) -> Callable[[Tensor], Tensor]:
    """onnxruntime (CPU) session as a function of the image batch."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.detach().cpu().numpy()})[0])


def write_torchscript(model: nn.Module, path: Path) -> None:
    """``torch.jit.trace`` at batch 2 (trace warnings about shapes are checked at other batches instead)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example(model, 2), check_trace=False)
    traced.save(str(path))


def read_torchscript(path: Path) -> Callable[[Tensor], Tensor]:
    return torch.jit.load(str(path), map_location="cpu")


def write_pt2(model: nn.Module, path: Path) -> None:
    """``torch.export.export`` with a dynamic batch, saved with ``torch.export.save``."""
    program = torch.export.export(model, (example(model, 2),), dynamic_shapes=(batch_dim(),))
    torch.export.save(program, str(path))


def read_pt2(path: Path) -> Callable[[Tensor], Tensor]:
    return torch.export.load(str(path)).module()


WRITERS = {"onnx": write_onnx, "torchscript": write_torchscript, "pt2": write_pt2}
READERS = {"onnx": read_onnx, "torchscript": read_torchscript, "pt2": read_pt2}


# ------------------------------------------------------------------------------------- export

def check_formats(formats: list[str]) -> list[str]:
    """``formats`` validated against ``safetensors`` and :data:`FILES` (one-line error naming ``formats``)."""
    valid = ["safetensors", *FILES]
    for f in formats:
        if f not in valid:
            raise ConfigError(f"unknown export format formats=[...,{f}]; choose from {', '.join(valid)}")
    return list(formats)


def max_diff(model: nn.Module, run: Callable[[Tensor], Tensor]) -> float:
    """Max |difference| between eager logits and ``run``'s at every batch size of :data:`CHECK_BATCHES`."""
    worst = 0.0
    with torch.no_grad():
        for b in CHECK_BATCHES:
            x = example(model, b)
            out = torch.as_tensor(run(x)).to(torch.float32).cpu()
            worst = max(worst, (model(x).float().cpu() - out).abs().max().item())
    return worst


def export_format(model: nn.Module, out_dir: str | Path, fmt: str) -> tuple[Path, float]:
    """Write ``out_dir/<FILES[fmt]>``, read it back, check it against eager; return the path and max |diff|.

    Args:
        model: a vitzoo model (its ``cfg`` gives the input size); exported in eval mode, float32, on CPU.
        out_dir: existing export folder.
        fmt: ``onnx``, ``torchscript`` or ``pt2``.

    Raises:
        ExportError: the format cannot express an op of the model, the runtime cannot run it, or the
            file's outputs differ from eager by more than :data:`TOLERANCE`.
    """
    path = Path(out_dir) / FILES[fmt]
    backend = attention_spec(model)["name"]
    was = model.training
    model.eval()
    try:
        try:
            WRITERS[fmt](model, path)
        except Exception as e:
            raise ExportError(f"attention={backend} cannot be exported to {fmt}: {failing_op(e)}") from None
        try:
            diff = max_diff(model, READERS[fmt](path))
        except Exception as e:
            raise ExportError(f"attention={backend}: {path.name} does not run ({fmt}): {failing_op(e)}") from None
    finally:
        model.train(was)
    if not diff <= TOLERANCE:
        raise ExportError(f"attention={backend}: {path.name} differs from eager by {diff:.2e} > {TOLERANCE} ({fmt})")
    console.print(f"{fmt}: {path.name} max |diff| vs eager {diff:.2e} (batch {', '.join(map(str, CHECK_BATCHES))})",
                  markup=False, highlight=False, soft_wrap=True)
    return path, diff


__all__ = ["ExportError", "FILES", "TOLERANCE", "check_formats", "export_format", "failing_op"]
