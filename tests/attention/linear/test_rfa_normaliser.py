"""RFA's normaliser and scale (vitzoo/attention/linear/rfa.py): the floor is the least value the exact kernel's
normaliser can take, so it clamps only impossible estimates and a bad estimate cannot blow a row up; the error
against the exact Gaussian kernel stays bounded at a realistic scale (ViT-S: 197 tokens, 6 heads of 64, 128
directions); the smooth bound on the learned scale never stops its gradient."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_attention

B, H, N, D = 2, 6, 197, 64  # ViT-S/16 at 224: 196 patches and the class token, 6 heads of 64


def _exact(attn, q, k, v):
    """softmax-free attention with the exact kernel ``exp(-‖s∘(q̂ - k̂)‖²/2)`` ``[B, h, N, d]``."""
    s = attn.feature_scale()
    qn, kn = F.normalize(q, dim=-1) * s, F.normalize(k, dim=-1) * s
    kernel = torch.exp(-(qn[..., :, None, :] - kn[..., None, :, :]).square().sum(-1) / 2)  # [B, h, N, N]
    return (kernel @ v) / kernel.sum(-1, keepdim=True), kernel.sum(-1)


def _errors(scale, eps=None):
    torch.manual_seed(0)
    attn = make_attention("rfa", (14, 14), 1, dim=H * D, heads=H, scale=scale, eps=eps).double().eval()
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        approx = attn.attend(q, k, v, (14, 14))
        exact, den = _exact(attn, q, k, v)
    rel = (approx - exact).norm(dim=-1) / exact.norm(dim=-1)  # per row
    to_values = (approx - exact).norm(dim=-1) / v.norm(dim=-1).mean()
    return attn, rel, to_values, den


@pytest.mark.parametrize("learn", [True, False])
def test_floor_is_the_least_exact_normaliser(learn):
    torch.manual_seed(0)
    attn = make_attention("rfa", (14, 14), 1, dim=H * D, heads=H, scale=1.5, learn_scale=learn).double()
    s_max = attn.cfg.max_scale if learn else 1.5
    assert attn.floor(N) == pytest.approx(N * math.exp(-2 * s_max**2))
    with torch.no_grad():
        attn.scale_param.fill_(50.0 if learn else 1.5)  # a learned s as large as it can get
        q = torch.randn(B, H, N, D, dtype=torch.float64)
        _, den = _exact(attn, q, torch.randn_like(q), q)
        assert bool((den >= attn.floor(N)).all())
        _, worst = _exact(attn, q[:, :, :1], -q[:, :, :1].expand_as(q), q)  # every key opposite the query
    torch.testing.assert_close(worst, torch.full_like(worst, attn.floor(N)), rtol=1e-6, atol=0)  # the bound is tight


def test_error_against_the_exact_kernel_is_bounded_at_realistic_scale():
    _, rel, to_values, _ = _errors(1.0)  # the initial scale
    assert float(rel.median()) < 0.15 and float(to_values.max()) < 0.05


def test_a_bad_estimate_cannot_blow_a_row_up():
    """Near the scale bound most estimates are noise: with the kernel's floor no row's error passes 20 value
    norms; a fixed floor of 1e-3 lets some rows grow tens of times further."""
    _, _, to_values, _ = _errors(1.9)
    _, _, fixed, _ = _errors(1.9, eps=1e-3)
    assert float(to_values.max()) < 20 and float(fixed.max()) > 10 * float(to_values.max())


def test_bounded_scale_keeps_its_gradient():
    attn = make_attention("rfa", (8, 8), 1)
    assert float(attn.feature_scale()[0, 0, 0]) == pytest.approx(1.0)  # s starts at attention.scale
    with torch.no_grad():
        attn.scale_param.fill_(10.0)  # far past the bound: s ≈ max_scale, not more
    assert float(attn.feature_scale().max()) < attn.cfg.max_scale
    attn(torch.randn(2, 65, 32), (8, 8)).square().sum().backward()
    assert attn.scale_param.grad is not None and bool((attn.scale_param.grad != 0).any())
