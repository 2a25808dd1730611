"""The fused paths from ``qkv`` to merged heads (:mod:`vitzoo.ops.feature`, :mod:`vitzoo.ops.efficient`,
:mod:`vitzoo.ops.linformer`): hand-written backwards against finite differences (float64, several chunks). The
backends' fused forward against their per-head form is in ``tests/attention/linear/test_feature_map_attention.py``;
the compiled feature kernel in ``tests/cpu_kernels/test_feature_kernel.py``."""
from __future__ import annotations

import pytest
import torch
from conftest import use_cpu_kernel

from vitzoo.ops import common
from vitzoo.ops import efficient as efficient_core
from vitzoo.ops import feature as feature_core
from vitzoo.ops.linformer import linformer_attention_qkv

CORE_HEADS = 2


def _core_inputs(kind: str, tokens: int):
    """float64 inputs of the kernel core for one feature map (2 images, 2 heads of 4 channels, 6 features):
    ``qkv``, ω, the fourier scale ``s`` (or None), the normaliser floor and the factor."""
    torch.manual_seed(0)
    h, d, m = CORE_HEADS, 4, 6
    qkv = (0.5 * torch.randn(2, tokens, 3 * h * d, dtype=torch.float64)).requires_grad_()
    omega = {
        "exp": torch.randn(m, d, dtype=torch.float64),
        "fourier": torch.randn(h, m, d, dtype=torch.float64),
        "elu": None,
    }[kind]
    scale = (torch.rand(h, 1, d, dtype=torch.float64) + 0.5).requires_grad_() if kind == "fourier" else None
    eps, factor = (1e-3, 1 / m) if kind == "fourier" else (1e-6 if kind == "exp" else None, 1.0)
    return qkv, omega, scale, eps, factor


@pytest.mark.parametrize("chunk", [1 << 20, 40, 12], ids=["one_chunk", "chunks", "token_blocks"])
@pytest.mark.parametrize("kind", ["exp", "fourier", "elu"])
def test_kernel_core_gradcheck(kind, chunk, monkeypatch, one_thread):
    """Hand-written backward of FeatureAttentionCore's PyTorch path against finite differences (float64, several
    chunks; the compiled kernel: tests/cpu_kernels/test_feature_kernel.py)."""
    use_cpu_kernel("feature_attention", False, monkeypatch)
    monkeypatch.setattr(common, "CHUNK_ELEMENTS", chunk)
    qkv, omega, scale, eps, factor = _core_inputs(kind, 5)
    h = CORE_HEADS
    inputs = (qkv,) if scale is None else (qkv, scale)

    def fn(*args):
        return feature_core.feature_attention_qkv(
            kind, args[0], h, omega, args[1] if len(args) > 1 else scale, eps, factor
        )

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize(
    "kind,kernel", [("exp", True), ("exp", False), ("fourier", True), ("fourier", False), ("elu", False)]
)
def test_kernel_core_backward_from_its_output_matches_recompute(kind, kernel, monkeypatch):
    """Backward takes g·out from the returned output and releases it; a second backward of the retained graph
    recomputes φ(Q)[kv | z] instead and gives the same gradients; an output changed in place is not used (the
    PyTorch path, and the compiled "exp" and "fourier" kernel)."""
    use_cpu_kernel("feature_attention", kernel, monkeypatch)
    monkeypatch.setattr(common, "CHUNK_ELEMENTS", 12)  # several (image, head) chunks and token blocks
    qkv, omega, scale, eps, factor = _core_inputs(kind, 7)
    inputs = [t for t in (qkv, scale) if t is not None]

    def run():
        return feature_core.feature_attention_qkv(kind, qkv, CORE_HEADS, omega, scale, eps, factor)

    y = run()
    g_y = torch.randn_like(y)
    assert y.grad_fn.out is not None
    from_output = torch.autograd.grad(y, inputs, g_y, retain_graph=True)
    assert y.grad_fn.out is None  # released by the first backward
    recomputed = torch.autograd.grad(y, inputs, g_y)
    for a, b in zip(from_output, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    y = run()
    y.mul_(2)  # the saved output is stale now: backward must not use it
    for a, b in zip(torch.autograd.grad(y, inputs, g_y), from_output):
        torch.testing.assert_close(a, 2 * b, rtol=1e-10, atol=1e-13)
    with torch.inference_mode():  # nothing kept for a backward (inference tensors have no version counter)
        torch.testing.assert_close(run(), y / 2)


def test_efficient_core_gradcheck(monkeypatch, one_thread):
    monkeypatch.setattr(common, "CHUNK_ELEMENTS", 40)  # several chunks
    qkv = torch.randn(2, 5, 3 * 2 * 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: efficient_core.efficient_attention_qkv(t, 2), (qkv,))


@pytest.mark.parametrize("mats,heads", [(2, 3), (2, 1), (1, 1)], ids=["none", "headwise", "kv"])
@pytest.mark.parametrize("chunk", [1 << 20, 40], ids=["one_chunk", "chunks"])
def test_linformer_core_gradcheck(mats, heads, chunk, monkeypatch, one_thread):
    """Hand-written backward of LinformerCore (probabilities recomputed) against finite differences."""
    monkeypatch.setattr(common, "CHUNK_ELEMENTS", chunk)  # 40: chunks of 1 or 2 of the 3 heads, per image
    torch.manual_seed(0)
    qkv = torch.randn(2, 6, 3 * 3 * 2, dtype=torch.float64, requires_grad=True)  # B=2, N=6, h=3, d=2
    proj = torch.randn(mats, heads, 6, 3, dtype=torch.float64, requires_grad=True)  # k=3
    assert torch.autograd.gradcheck(lambda t, p: linformer_attention_qkv(t, p, 3, 0.5), (qkv, proj))
