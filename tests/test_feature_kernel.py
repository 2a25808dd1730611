"""vitzoo's compiled FAVOR+ kernel (vitzoo/attention/csrc/feature_attention.cpp) against the PyTorch path of
:mod:`vitzoo.attention._kernel_core` (performer's ``"exp"`` feature map).

The per-head reference (``favor_features`` and the explicit kernel matrix) runs through the kernel in
tests/test_kernel_attention.py and tests/test_attention.py; here the kernel and the PyTorch path (no shared code
past the arguments) get odd shapes: head dims and feature counts that are not multiples of a vector, token counts
that leave a partial block of 64, keys whose largest exponent grows from block to block (the running maximum
rescales the sums), no normaliser floor, and an output changed in place (backward recomputes φ(Q)(φ(K)ᵀV)).
The build and its fallback: tests/test_cpu_kernels.py.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import require_cpu_kernel
from vitzoo.attention import _cpp, _feature_kernel, _kernel_core

STEM = _feature_kernel.STEM


def _inputs(B: int, N: int, h: int, d: int, m: int, growing: bool = False, dtype=torch.float64):
    """``qkv`` ``[B, N, 3hd]`` and a float32 ``ω`` ``[m, d]`` (as the layer's buffer)."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, N, 3, h, d, generator=gen, dtype=dtype)
    if growing:  # later keys have larger norms: the keys' largest exponent grows block by block
        qkv[:, :, 1] *= torch.linspace(0.2, 2.5, N, dtype=dtype)[:, None, None]
    return qkv.reshape(B, N, 3 * h * d).requires_grad_(), torch.randn(m, d, generator=gen)


def _run(qkv, h, omega, eps, stale=False, torch_backward=None, monkeypatch=None):
    """Output and ``∂L/∂qkv``; ``stale`` changes the output in place (backward may not use it); ``torch_backward``
    switches the kernel off (True) or on (False) between forward and backward."""
    qkv.grad = None
    out = _kernel_core.kernel_attention_qkv("exp", qkv, h, omega, None, eps)
    if stale:
        out.mul_(1.0)
    if torch_backward is not None:
        monkeypatch.setenv(_cpp.ENV, "0" if torch_backward else "1")
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return out.detach(), qkv.grad.clone()


SHAPES = {"odd": (2, 37, 3, 5, 19, False), "performer": (1, 130, 2, 32, 256, False),
          "growing_keys": (2, 200, 2, 12, 40, True)}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("eps", [1e-6, None])
@pytest.mark.parametrize("stale", [False, True], ids=["saved_output", "recomputed"])
def test_kernel_matches_torch_path(shape, eps, stale, monkeypatch):
    require_cpu_kernel(STEM)
    qkv, omega = _inputs(*shape[:5], growing=shape[5])
    h = shape[2]
    fast = _run(qkv, h, omega, eps, stale)
    monkeypatch.setenv(_cpp.ENV, "0")
    slow = _run(qkv, h, omega, eps, stale)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("torch_backward", [True, False], ids=["kernel_then_torch", "torch_then_kernel"])
def test_backwards_take_either_forwards_results(torch_backward, monkeypatch):
    """Both paths save the same tensors: each backward takes the other forward's results."""
    require_cpu_kernel(STEM)
    qkv, omega = _inputs(2, 150, 2, 7, 24, growing=True)
    monkeypatch.setenv(_cpp.ENV, "1" if torch_backward else "0")
    mixed = _run(qkv, 2, omega, 1e-6, torch_backward=torch_backward, monkeypatch=monkeypatch)
    monkeypatch.setenv(_cpp.ENV, "0")
    slow = _run(qkv, 2, omega, 1e-6)
    for a, b in zip(mixed, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_kernel_gradcheck():
    """The kernel's backward against finite differences (float64, two token blocks, the floor active nowhere)."""
    require_cpu_kernel(STEM)
    qkv, omega = _inputs(1, 70, 2, 3, 5, growing=True)
    qkv = (0.5 * qkv.detach()).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: _kernel_core.kernel_attention_qkv("exp", x, 2, omega, None, 1e-6), qkv)


def test_kernel_float32_close_to_float64():
    """float32 runs the vectorised exp2 (a polynomial): within float32 rounding of the float64 result."""
    require_cpu_kernel(STEM)
    qkv, omega = _inputs(2, 150, 4, 32, 64, growing=True)
    exact = _run(qkv, 4, omega, 1e-6)
    single = qkv.detach().float().requires_grad_()
    for a, b in zip(_run(single, 4, omega, 1e-6), exact, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def test_kernel_steps_aside_where_it_does_not_apply():
    """Only the "exp" map with one ω [m, d] and factor 1 on float CPU tensors, and no dispatch mode watching."""
    require_cpu_kernel(STEM)
    qkv, omega = _inputs(1, 8, 2, 4, 6)
    assert _feature_kernel.usable(qkv, omega, "exp", 1.0)
    assert not _feature_kernel.usable(qkv, omega, "fourier", 1.0)
    assert not _feature_kernel.usable(qkv, omega.expand(2, 6, 4), "exp", 1.0)  # one ω per head
    assert not _feature_kernel.usable(qkv, omega, "exp", 0.5)
    assert not _feature_kernel.usable(qkv.bfloat16(), omega, "exp", 1.0)
    with FlopCounterMode(display=False):  # counts the PyTorch path's matmuls
        assert not _feature_kernel.usable(qkv, omega, "exp", 1.0)
