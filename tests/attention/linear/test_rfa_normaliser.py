"""RFA (vitzoo/attention/linear/rfa.py) against the paper's equations: a naive float64 per-query oracle for both
feature maps, the kernel estimate converging to the exact Gaussian kernel as features grow, the positive map's
normaliser positive with no floor (no row inflated, every row's gradient passing), and the learned scale used as
it is (no cap)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import make_attention

from vitzoo.attention import ConfigError, attention_config


def _unit(x, s):
    return x / x.norm() * s


def _phi(x, s, omega, kind):
    """φ of one query or key ``x[d]`` of one head (``s[d]``, ``omega[D, d]``), written out feature by feature."""
    u, D = _unit(x, s), omega.shape[0]
    if kind == "trig":  # [sin(ω₁u) … sin(ω_Du), cos(ω₁u) … cos(ω_Du)] / √D
        return torch.stack([torch.sin(omega[m] @ u) for m in range(D)]
                           + [torch.cos(omega[m] @ u) for m in range(D)]) / math.sqrt(D)
    return torch.stack([torch.exp(omega[m] @ u - u @ u) for m in range(D)]) / math.sqrt(D)


def oracle(attn, x):
    """The layer on ``x[B, N, C]``, one image, head and query at a time:
    ``out_i = Σ_j (φ(q_i)·φ(k_j)) v_j / Σ_j φ(q_i)·φ(k_j)`` (trig: the sum floored at ``eps``)."""
    h, d, C = attn.num_heads, attn.head_dim, attn.dim
    kind = attn.cfg.feature_map
    omega_all, s_all = attn.features.weight.double(), attn.scale_param.double()
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        qkv = x[b] @ attn.qkv.weight.T + attn.qkv.bias  # [N, 3C]
        heads = []
        for head in range(h):
            omega = omega_all[head] if kind == "trig" else omega_all
            s = s_all[head, 0]
            cols = slice(head * d, (head + 1) * d)
            q, k, v = qkv[:, :C][:, cols], qkv[:, C:2 * C][:, cols], qkv[:, 2 * C:][:, cols]
            phi_k = [_phi(k[j], s, omega, kind) for j in range(len(k))]
            rows = []
            for i in range(len(q)):
                phi_q = _phi(q[i], s, omega, kind)
                weights = [float(phi_q @ p) for p in phi_k]
                den = sum(weights)
                if kind == "trig":
                    den = max(den, attn.cfg.eps)
                rows.append(sum(w * v[j] for j, w in enumerate(weights)) / den)
            heads.append(torch.stack(rows))
        out[b] = torch.cat(heads, dim=1) @ attn.proj.weight.T + attn.proj.bias
    return out


@pytest.mark.parametrize("kind,scale", [("positive", 1.0), ("positive", 3.0), ("trig", 1.0)])
def test_fast_path_matches_the_per_query_oracle(kind, scale):
    torch.manual_seed(0)
    attn = make_attention("rfa", (3, 4), 1, feature_map=kind, num_features=12).double().eval()
    with torch.no_grad():
        attn.scale_param.copy_(scale * (0.5 + torch.rand_like(attn.scale_param)))  # a different s per channel
        x = torch.randn(2, 13, 32, dtype=torch.float64)
        torch.testing.assert_close(attn(x, (3, 4)), oracle(attn, x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", ["positive", "trig"])
def test_kernel_estimate_converges_to_the_exact_gaussian_kernel(kind):
    """``φ(q)ᵀφ(k)`` against ``exp(-‖s∘(q̂ - k̂)‖²/2)``: the mean error shrinks as the directions grow (about as
    1/√D) and is below 0.02 at 4,096 directions."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 20, 8, dtype=torch.float64), torch.randn(1, 4, 20, 8, dtype=torch.float64)
    errors = []
    for D in (16, 256, 4096):
        attn = make_attention("rfa", feature_map=kind, num_features=D, learn_scale=False, scale=1.0).double()
        s, omega = attn.feature_scale(), attn.features.weight
        est = attn.feature_map(q, omega, True) @ attn.feature_map(k, omega, False).transpose(-2, -1)  # [1, 4, 20, 20]
        qn, kn = torch.nn.functional.normalize(q, dim=-1) * s, torch.nn.functional.normalize(k, dim=-1) * s
        exact = torch.exp(-(qn[..., :, None, :] - kn[..., None, :, :]).square().sum(-1) / 2)
        errors.append(float((est - exact).abs().mean()))
    assert errors[0] > 2 * errors[1] > 4 * errors[2] and errors[2] < 0.02, errors


def test_positive_normaliser_needs_no_floor_even_at_a_large_scale():
    """At s = 4 (most kernel values below e⁻⁸) every φ(q)ᵀΣφ(k) is > 0 with no floor, each output is a convex
    combination of the values, and every query's gradient passes."""
    torch.manual_seed(0)
    attn = make_attention("rfa", (14, 14), 1, dim=64, heads=2, scale=4.0).double()
    assert attn.floor(197) is None
    q, k, v = (torch.randn(2, 2, 197, 32, dtype=torch.float64, requires_grad=True) for _ in range(3))
    omega = attn.features.weight
    den = attn.feature_map(q, omega, True) @ attn.feature_map(k, omega, False).sum(-2).unsqueeze(-1)
    assert bool((den > 0).all())
    out = attn.attend(q, k, v, (14, 14))
    lo, hi = v.min(dim=2, keepdim=True).values, v.max(dim=2, keepdim=True).values
    assert bool(((out >= lo - 1e-12) & (out <= hi + 1e-12)).all())
    (grad_q,) = torch.autograd.grad((out * torch.randn_like(out)).sum(), q)
    assert bool((grad_q.norm(dim=-1) > 0).all())


def test_learned_scale_has_no_cap():
    """A learned s of 5 acts as a fixed s of 5, and its gradient is not squashed."""
    torch.manual_seed(0)
    learned = make_attention("rfa", (4, 4), 1).double()
    with torch.no_grad():
        learned.scale_param.fill_(5.0)
    fixed = make_attention("rfa", (4, 4), 1, learn_scale=False, scale=5.0).double()
    fixed.load_state_dict(learned.state_dict())
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    torch.testing.assert_close(learned(x, (4, 4)), fixed(x, (4, 4)))
    (learned(x, (4, 4)) * torch.randn(2, 17, 32, dtype=torch.float64)).sum().backward()
    assert float(learned.scale_param.grad.abs().min()) > 0


def test_trig_keeps_its_floor_and_the_option_is_checked():
    attn = make_attention("rfa", (4, 4), 1, feature_map="trig", eps=1e-4)
    assert attn.floor(17) == 1e-4 and attn.features.weight.shape == (4, 128, 8)
    assert attn.formula == attn.trig_formula
    with pytest.raises(ConfigError, match="attention.feature_map must be one of positive, trig"):
        attention_config({"name": "rfa", "feature_map": "relu"})
    with pytest.raises(ConfigError, match="unknown option attention.max_scale|attention.max_scale"):
        attention_config({"name": "rfa", "max_scale": 2.0})
