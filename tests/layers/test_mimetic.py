"""Mimetic initialisation: the products it sets, checked against an SVD-free construction, and where it applies."""
from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.attention.base import QKVAttention
from vitzoo.layers.mimetic import applies, mimetic_init_
from vitzoo.registry import ConfigError


def head_products(attn):
    C, h = attn.dim, attn.num_heads
    d = C // h
    w = attn.qkv.weight.double()
    qk = [w[i * d:(i + 1) * d].T @ w[C + i * d:C + (i + 1) * d] for i in range(h)]  # W_q,hᵀ W_k,h: [C, C]
    vo = w[2 * C:].T @ attn.proj.weight.double().T  # W_vᵀ W_oᵀ: [C, C]
    return qk, vo


def test_without_noise_the_products_are_scaled_projections_and_identity():
    attn = vitzoo.create_model("vit_cifar", depth=1, embed_dim=48, num_heads=3).blocks[0].attn
    mimetic_init_(attn, qk=(0.0, 0.7), vo=(0.0, 0.4))
    qk, vo = head_products(attn)
    torch.testing.assert_close(vo, -0.4 * torch.eye(48, dtype=torch.float64), atol=1e-5, rtol=0)
    for p in qk:  # 0.7 times an orthogonal projection onto 16 dimensions: symmetric, p² = 0.7 p, trace 0.7·16
        torch.testing.assert_close(p, p.T, atol=1e-5, rtol=0)
        torch.testing.assert_close(p @ p, 0.7 * p, atol=1e-5, rtol=0)
        assert p.trace().item() == pytest.approx(0.7 * 16, abs=1e-4)
    assert attn.qkv.bias.abs().sum() == 0 and attn.proj.bias.abs().sum() == 0


def test_with_noise_each_head_is_the_best_rank_d_fit():
    """The residual of a best rank-d fit is orthogonal to the fit (Eckart–Young), whatever the noise drawn."""
    attn = vitzoo.create_model("vit_cifar", depth=1, embed_dim=32, num_heads=2).blocks[0].attn
    g = torch.Generator().manual_seed(3)
    mimetic_init_(attn, generator=g)
    qk, vo = head_products(attn)
    g = torch.Generator().manual_seed(3)
    for p in qk:
        z = torch.randn(32, 32, generator=g, dtype=torch.float64) / 32**0.5
        target = 0.7 * z + 0.7 * torch.eye(32, dtype=torch.float64)
        assert torch.linalg.matrix_rank(p).item() == 16
        assert abs((p * (target - p)).sum().item()) < 1e-4  # residual ⟂ fit
        assert ((target - p).norm() ** 2).item() == pytest.approx(
            (torch.linalg.svdvals(target)[16:] ** 2).sum().item(), rel=1e-4)
    z = torch.randn(32, 32, generator=g, dtype=torch.float64) / 32**0.5
    torch.testing.assert_close(vo, 0.4 * z - 0.4 * torch.eye(32, dtype=torch.float64), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", vitzoo.list_attention())
def test_model_option_reaches_every_qkv_backend(attention):
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", depth=1, attention=attention, attn_init="mimetic")
    plain = vitzoo.create_model("vit_cifar", depth=1, attention=attention)
    for m, p in zip(model.modules(), plain.modules()):
        if isinstance(m, QKVAttention) and applies(m):
            qk, vo = head_products(m)
            assert vo.diag().mean() < -0.3 and sum(qk).diag().mean() > 0.3  # identity-like, not ≈ 0 as trunc-normal
            assert head_products(p)[1].diag().abs().mean() < 0.05
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_bad_init_names_the_option():
    with pytest.raises(ConfigError, match=r"model\.attn_init"):
        vitzoo.create_model("vit_cifar", attn_init="xavier")
