"""vitzoo's compiled random-feature kernel (vitzoo/cpu_kernels/csrc/feature_attention.cpp) against the PyTorch path
of :mod:`vitzoo.ops.feature`: performer's ``"exp"`` map and rfa's ``"fourier"`` map.

The per-head references (``favor_features``, ``fourier_features`` and the explicit kernel matrix) run through the
kernel in tests/attention/linear/test_feature_map_attention.py and tests/attention/test_registry.py;
here the kernel and the PyTorch path (no
shared code past the arguments) get odd shapes: head dims and feature counts that are not multiples of a vector,
token counts that leave a partial block of 64, keys whose largest exponent grows from block to block (the running
maximum rescales the sums), no normaliser floor, a constant factor, and an output changed in place (backward
recomputes φ(Q)(φ(K)ᵀV)). The build and its fallback: tests/cpu_kernels/test_cpu_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import require_cpu_kernel
from torch.utils.flop_counter import FlopCounterMode

from vitzoo.cpu_kernels import feature_kernel, loader
from vitzoo.ops import feature as feature_core

STEM = feature_kernel.STEM
KINDS = ["exp", "fourier"]


def _inputs(kind: str, B: int, N: int, h: int, d: int, m: int, growing: bool = False, dtype=torch.float64):
    """``qkv`` ``[B, N, 3hd]``, a float32 ``ω`` (``[m, d]``, or ``[h, m, d]`` for ``"fourier"``, as the layers'
    buffers) and ``"fourier"``'s learnable scale ``[h, 1, d]`` (None for ``"exp"``)."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, N, 3, h, d, generator=gen, dtype=dtype)
    if growing:  # later keys have larger norms: the keys' largest exponent grows block by block
        qkv[:, :, 1] *= torch.linspace(0.2, 2.5, N, dtype=dtype)[:, None, None]
    omega = torch.randn(*((h,) if kind == "fourier" else ()), m, d, generator=gen)
    scale = (torch.rand(h, 1, d, generator=gen) + 0.5).requires_grad_() if kind == "fourier" else None
    return qkv.reshape(B, N, 3 * h * d).requires_grad_(), omega, scale


def _options(kind: str, m: int, eps="default") -> tuple:
    """The floor and factor each layer passes: performer 1e-6 and 1, rfa 1e-3 and 1/D."""
    floor = (1e-3 if kind == "fourier" else 1e-6) if eps == "default" else eps
    return floor, (1 / m if kind == "fourier" else 1.0)


def _run(kind, qkv, h, omega, scale, eps, factor, stale=False, torch_backward=None, monkeypatch=None):
    """Output, ``∂L/∂qkv`` and ``∂L/∂s``; ``stale`` changes the output in place (backward may not use it);
    ``torch_backward`` switches the kernel off (True) or on (False) between forward and backward."""
    for t in (qkv, scale):
        if t is not None:
            t.grad = None
    out = feature_core.feature_attention_qkv(kind, qkv, h, omega, scale, eps, factor)
    if stale:
        out.mul_(1.0)
    if torch_backward is not None:
        monkeypatch.setenv(loader.ENV, "0" if torch_backward else "1")
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return [out.detach(), qkv.grad.clone()] + ([] if scale is None else [scale.grad.clone()])


SHAPES = {
    "odd": (2, 37, 3, 5, 19, False),
    "performer": (1, 130, 2, 32, 256, False),
    "growing_keys": (2, 200, 2, 12, 40, True),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("kind,eps", [("exp", "default"), ("exp", None), ("fourier", "default")])
@pytest.mark.parametrize("stale", [False, True], ids=["saved_output", "recomputed"])
def test_kernel_matches_torch_path(shape, kind, eps, stale, monkeypatch):
    require_cpu_kernel(STEM)
    qkv, omega, scale = _inputs(kind, *shape[:5], growing=shape[5])
    args = (kind, qkv, shape[2], omega, scale, *_options(kind, shape[4], eps))
    fast = _run(*args, stale)
    monkeypatch.setenv(loader.ENV, "0")
    slow = _run(*args, stale)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("torch_backward", [True, False], ids=["kernel_then_torch", "torch_then_kernel"])
def test_backwards_take_either_forwards_results(kind, torch_backward, monkeypatch):
    """Both paths save the same tensors: each backward takes the other forward's results."""
    require_cpu_kernel(STEM)
    qkv, omega, scale = _inputs(kind, 2, 150, 2, 7, 24, growing=True)
    args = (kind, qkv, 2, omega, scale, *_options(kind, 24))
    monkeypatch.setenv(loader.ENV, "1" if torch_backward else "0")
    mixed = _run(*args, torch_backward=torch_backward, monkeypatch=monkeypatch)
    monkeypatch.setenv(loader.ENV, "0")
    slow = _run(*args)
    for a, b in zip(mixed, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_gradcheck(kind):
    """The kernel's backward against finite differences (float64, two token blocks; ``"fourier"`` also for s)."""
    require_cpu_kernel(STEM)
    qkv, omega, scale = _inputs(kind, 1, 70, 2, 3, 5, growing=True)
    qkv = (0.5 * qkv.detach()).requires_grad_()
    inputs = (qkv,) if scale is None else (qkv, scale.detach().double().requires_grad_())
    eps, factor = _options(kind, 5)

    def fn(x, s=None):
        return feature_core.feature_attention_qkv(kind, x, 2, omega.double(), s, eps, factor)

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_float32_close_to_float64(kind):
    """float32 runs the vectorised exp2 and sin/cos (polynomials): within float32 rounding of the float64 result."""
    require_cpu_kernel(STEM)
    qkv, omega, scale = _inputs(kind, 2, 150, 4, 32, 64, growing=True)
    options = _options(kind, 64)
    exact = _run(kind, qkv, 4, omega, scale, *options)
    single = qkv.detach().float().requires_grad_()
    for a, b in zip(_run(kind, single, 4, omega, scale, *options), exact, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_features_are_float32_accurate(kind, monkeypatch):
    """The float32 exp2 and sin/cos polynomials within a few ulp: with one key per image and head, one-hot, so that
    the products are exact, the last column of ``kvz`` (``φ(K)ᵀ1``) is ``φ(k)`` itself, against float64."""
    require_cpu_kernel(STEM)
    B, h, d, m = 32, 4, 16, 256
    qkv = torch.zeros(B, 1, 3, h, d)
    qkv[:, 0, 1] = torch.eye(d).repeat(B * h // d, 1).view(B, h, d)  # one-hot keys
    gen = torch.Generator().manual_seed(0)
    omega = 4 * torch.randn(*((h,) if kind == "fourier" else ()), m, d, generator=gen)  # ωk up to about ±15
    scale = torch.ones(h, 1, d) if kind == "fourier" else None
    features = feature_core.feature_core_forward(kind, qkv.view(B, 1, -1), h, omega, scale, None, 1.0)[1][..., -1]
    monkeypatch.setenv(loader.ENV, "0")
    exact = feature_core.feature_core_forward(
        kind, qkv.view(B, 1, -1).double(), h, omega.double(), None if scale is None else scale.double(), None, 1.0
    )[1][..., -1]
    tol = {"exp": dict(rtol=1e-6, atol=1e-9), "fourier": dict(rtol=0, atol=5e-7)}[kind]  # exp: 2^x of x = -20 and below
    torch.testing.assert_close(features.double(), exact, **tol)


def test_kernel_steps_aside_where_it_does_not_apply():
    """Only "exp" with one ω [m, d] and "fourier" with ω [h, D, d] and its scale, on float CPU tensors, and no
    dispatch mode watching."""
    require_cpu_kernel(STEM)
    qkv, omega, _ = _inputs("exp", 1, 8, 2, 4, 6)
    per_head, scale = omega.expand(2, 6, 4), torch.ones(2, 1, 4)
    assert feature_kernel.usable("exp", qkv, omega, None)
    assert feature_kernel.usable("fourier", qkv, per_head, scale)
    assert not feature_kernel.usable("elu", qkv, None, None)
    assert not feature_kernel.usable("exp", qkv, per_head, None)  # one ω per head
    assert not feature_kernel.usable("fourier", qkv, per_head, None)
    assert not feature_kernel.usable("exp", qkv.bfloat16(), omega, None)
    with FlopCounterMode(display=False):  # counts the PyTorch path's matmuls
        assert not feature_kernel.usable("exp", qkv, omega, None)
