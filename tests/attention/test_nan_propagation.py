"""Generated from the registry: NaN and Inf propagate on every path of every backend (compiled CPU kernel, the
PyTorch path, FlexAttention where the backend has it, the plain reference). A non-finite input token leaves its
own output row non-finite (at least the poisoned channel where a backend mixes tokens per channel); a NaN weight
matrix leaves every output NaN, and so does one NaN query channel (a kernel that clamped NaN scores would give
the mean of the values instead); the kernel and the PyTorch path mark the same outputs and gradients. No path
turns a NaN into a number."""

from __future__ import annotations

import pytest
import torch
from conftest import ATTENTION_NAMES, make_attention

from vitzoo.attention.sparse.pattern import SparsePatternAttention
from vitzoo.cpu_kernels import loader

GRID, PREFIX, TOKEN = (8, 8), 1, 27  # the poisoned token: row 3, column 2 of the grid (after the class token)
PATHS = ["kernel", "torch", "flex", "reference"]


def _attn(name):
    torch.manual_seed(0)
    return make_attention(name, GRID, PREFIX).eval()


def _run(attn, x, path, monkeypatch):
    """The output of ``attn`` on ``x`` along ``path`` (None where the backend has no such path)."""
    monkeypatch.setenv(loader.ENV, "0" if path == "torch" else "1")
    if path == "flex":
        if not isinstance(attn, SparsePatternAttention):
            return None
        attn.cfg.impl = "flex"
    with torch.no_grad():
        out = attn.reference(x, GRID) if path == "reference" else attn(x, GRID)
    if path == "flex":
        attn.cfg.impl = "blocked"
    return out


def _first_weight(attn):
    """The first learnable matrix (the query/key/value projection, where there is one)."""
    for name, p in attn.named_parameters():
        if p.dim() >= 2 and p.requires_grad:
            return name, p
    return None, None


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_non_finite_token_keeps_its_row_non_finite(name, path, value, monkeypatch):
    attn = _attn(name)
    x = torch.randn(2, PREFIX + GRID[0] * GRID[1], 32)
    x[0, TOKEN, 5] = value
    out = _run(attn, x, path, monkeypatch)
    if out is None:
        pytest.skip(f"{name} has no {path} path")
    assert not out[0, TOKEN].isfinite().all(), f"{name} ({path}): a {value} token's output came out finite"
    assert out[1].isfinite().all(), f"{name} ({path}): the other image was touched"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_nan_weight_makes_every_output_nan(name, path, monkeypatch):
    attn = _attn(name)
    pname, weight = _first_weight(attn)
    if weight is None:
        pytest.skip(f"{name} has no weight matrix")
    with torch.no_grad():
        weight.fill_(float("nan"))
    out = _run(attn, torch.randn(2, PREFIX + GRID[0] * GRID[1], 32), path, monkeypatch)
    if out is None:
        pytest.skip(f"{name} has no {path} path")
    finite = int(out[:, PREFIX:].isfinite().sum())  # the grid tokens (Swin's window leaves the class token global)
    assert finite == 0, f"{name} ({path}): {finite} finite outputs with a NaN {pname}"


QUERY_WEIGHTS = ("qkv.weight", "q.weight", "qv.weight")  # row 0: channel 0 of the first head's queries
GLOBAL_QUERY_WEIGHTS = ("qkv_global.weight",)  # longformer's global rows take their queries from here


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_nan_query_channel_makes_every_output_nan(name, path, monkeypatch):
    """One NaN query channel (in each query projection the backend has): every score of the first head is NaN,
    so every output is (through the output projection); a NaN score must never become a probability."""
    attn = _attn(name)
    params = dict(attn.named_parameters())
    pname = next((n for n in QUERY_WEIGHTS if n in params), None)
    if pname is None:
        pytest.skip(f"{name} has no query projection")
    with torch.no_grad():
        for n in (pname, *(n for n in GLOBAL_QUERY_WEIGHTS if n in params)):
            params[n][0] = float("nan")
    out = _run(attn, torch.randn(2, PREFIX + GRID[0] * GRID[1], 32), path, monkeypatch)
    if out is None:
        pytest.skip(f"{name} has no {path} path")
    finite = int(out.isfinite().sum())
    assert finite == 0, f"{name} ({path}): {finite} finite outputs with a NaN query channel"


@pytest.mark.usefixtures("one_thread")  # one thread runs every (image, head) task in turn, sharing its buffers
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_kernel_and_torch_paths_mark_the_same_outputs(name, monkeypatch):
    """Forward and backward: the same outputs and input gradients are non-finite on both paths (a kernel that
    reused a buffer across images would carry the NaN image's values into the next one)."""
    marks = []
    for path in ("kernel", "torch"):
        attn = _attn(name).train()
        monkeypatch.setenv(loader.ENV, "0" if path == "torch" else "1")
        torch.manual_seed(1)
        x = torch.randn(2, PREFIX + GRID[0] * GRID[1], 32)
        x[0, TOKEN, 5] = float("nan")
        x.requires_grad_()
        torch.manual_seed(2)  # the same random draws (features, hashes) on both paths
        out = attn(x, GRID)
        out.square().sum().backward()  # a loss whose gradient depends on the output
        marks.append((out.isfinite(), x.grad.isfinite()))
        assert not x.grad.isfinite().all(), f"{name} ({path}): the NaN token's gradient came out finite"
    assert torch.equal(marks[0][0], marks[1][0]), f"{name}: the paths' outputs differ in which are NaN"
    assert torch.equal(marks[0][1], marks[1][1]), f"{name}: the paths' gradients differ in which are NaN"
