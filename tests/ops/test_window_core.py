"""Swin's CPU window core (:mod:`vitzoo.ops.window`): hand-written backward against finite differences and the
strided read of a plain partition against the gathered one. The backend's outputs against its oracle are in
``tests/attention/dense/test_window.py``."""
from __future__ import annotations

import pytest
import torch

from vitzoo.attention.dense.window import window_index
from vitzoo.ops import window as window_core


@pytest.mark.parametrize("keep", [False, True], ids=["recomputed", "kept"])
@pytest.mark.parametrize("chunk", [1 << 20, 40], ids=["one_block", "blocks"])
@pytest.mark.parametrize("masked", [False, True], ids=["bias", "bias_mask_padding_prefix"])
def test_window_core_gradcheck(chunk, masked, keep, monkeypatch):
    """Hand-written backward of WindowCore (q/k/v and bias gradients) against finite differences (float64), with the
    probabilities recomputed from the log-sum-exp or kept from forward. The windows read shuffled tokens; with the
    mask also padding slots (masked as keys) and a prefix token."""
    monkeypatch.setattr(window_core, "SCORE_ELEMENTS", chunk)
    monkeypatch.setattr(window_core, "keeps_probs", lambda T, head_dim: keep)
    torch.manual_seed(0)
    B, h, d, nw, m2 = 2, 2, 3, 3, 4
    prefix, padding = (1, 2) if masked else (0, 0)
    n = nw * m2 - padding  # grid tokens
    slots = torch.full((nw * m2,), -1)
    slots[torch.randperm(nw * m2)[:n]] = prefix + torch.arange(n)
    index = torch.cat([torch.arange(prefix).expand(nw, prefix), slots.view(nw, m2)], dim=1)  # [nW, T]
    T = prefix + m2
    qkv = torch.randn(B, prefix + n, 3 * h * d, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(h, T, T, dtype=torch.float64, requires_grad=True)
    mask = None
    if masked:
        blocked = (torch.rand(nw, T, T) < 0.4) | (index < 0)[:, None, :]  # padding slots are never keys
        mask = torch.zeros(nw, T, T, dtype=torch.float64).masked_fill(blocked, float("-inf"))
        mask.diagonal(dim1=1, dim2=2).zero_()  # no all-masked row
    core = window_core.WindowCore.apply
    assert torch.autograd.gradcheck(lambda a, b: core(a, index, prefix, b, mask, h, d ** -0.5), (qkv, bias))


@pytest.mark.parametrize("keep", [False, True], ids=["recomputed", "kept"])
@pytest.mark.parametrize("chunk", [1 << 20, 40], ids=["one_block", "blocks"])
def test_window_core_plain_partition(chunk, keep, monkeypatch):
    """A plain partition (no shift, padding or prefix) read through strided views (``partition``) gives the
    gathered path's outputs and gradients, and finite differences agree with its backward (float64); with small
    blocks they hold whole rows of windows."""
    monkeypatch.setattr(window_core, "SCORE_ELEMENTS", chunk)
    monkeypatch.setattr(window_core, "keeps_probs", lambda T, head_dim: keep)
    torch.manual_seed(0)
    (H, W), window, h, d = (4, 6), 2, 2, 3
    index, _ = window_index((H, W), window, 0, 0)  # [nW, M²]
    qkv = torch.randn(2, H * W, 3 * h * d, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(h, window ** 2, window ** 2, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, H * W, h * d, dtype=torch.float64)
    core = window_core.WindowCore.apply
    plain = core(qkv, index, 0, bias, None, h, d ** -0.5, (H, W, window))
    gathered = core(qkv, index, 0, bias, None, h, d ** -0.5)
    torch.testing.assert_close(plain, gathered, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(plain, (qkv, bias), g), torch.autograd.grad(gathered, (qkv, bias), g)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: core(a, index, 0, b, None, h, d ** -0.5, (H, W, window)), (qkv, bias))
