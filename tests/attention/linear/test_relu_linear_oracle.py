"""relu_linear against a naive float64 oracle written from EfficientViT's LiteMLA equations (Cai et al., ICCV 2023):
one query at a time, the depthwise and grouped 1×1 convolutions as explicit sums over neighbours and channels, the
BatchNorm as ``(y - μ)/√(σ² + ε)·γ + β`` of its running statistics. Shares no code with the module."""
from __future__ import annotations

import pytest
import torch
from conftest import make_attention

EPS = 1e-15  # the paper's code adds it to the normaliser


def _aggregate(qkv, dw, pw, P, grid, d):
    """One scale: depthwise s×s (zero padding) then the 1×1 convolution grouped by d channels; prefix rows unchanged.

    Args:
        qkv: ``[N, 3C]`` of one image; dw ``[3C, s, s]``; pw ``[3C, d]``.
    """
    H, W = grid
    s = dw.shape[-1]
    r = s // 2
    out = qkv.clone()
    for t in range(H * W):
        row, col = divmod(t, W)
        depth = torch.zeros(qkv.shape[1], dtype=qkv.dtype)
        for i in range(s):
            for j in range(s):
                y, x = row + i - r, col + j - r
                if 0 <= y < H and 0 <= x < W:
                    depth += dw[:, i, j] * qkv[P + y * W + x]
        for ch in range(qkv.shape[1]):
            group = ch // d
            out[P + t, ch] = sum(pw[ch, e] * depth[group * d + e] for e in range(d))
    return out


def _lite_mla(qkv, heads, d):
    """``[N, 3C] -> [N, C]``: per head and query ``Σ_j (ReLU(q_i)·ReLU(k_j)) v_j / (Σ_j ReLU(q_i)·ReLU(k_j) + ε)``."""
    N, C = qkv.shape[0], heads * d
    out = torch.zeros(N, C, dtype=qkv.dtype)
    for head in range(heads):
        cols = slice(head * d, (head + 1) * d)
        q = qkv[:, :C][:, cols].clamp(min=0)
        k = qkv[:, C:2 * C][:, cols].clamp(min=0)
        v = qkv[:, 2 * C:][:, cols]
        for i in range(N):
            num, den = torch.zeros(d, dtype=qkv.dtype), 0.0
            for j in range(N):
                w = float((q[i] * k[j]).sum())
                num += w * v[j]
                den += w
            out[i, cols] = num / (den + EPS)
    return out


def oracle(attn, x, grid):
    """The block on ``x[B, N, C]`` in eval mode, one image and one query at a time."""
    P, d, heads = attn.num_prefix, attn.head_dim, attn.num_heads
    W, b = attn.qkv.weight, attn.qkv.bias
    outs = []
    for img in x:
        qkv = img @ W.T + b  # [N, 3C]
        branches = [qkv] + [_aggregate(qkv, a[0].weight[:, 0], a[1].weight[:, :, 0, 0], P, grid, d)
                            for a in attn.aggreg]
        o = torch.cat([_lite_mla(t, heads, d) for t in branches], dim=1)  # [N, (1 + S)C]
        y = o @ attn.proj.weight.T
        if attn.proj.bias is not None:
            y = y + attn.proj.bias
        if attn.norm is not None:
            bn = attn.norm
            y = (y - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
        outs.append(y)
    return torch.stack(outs)


@pytest.mark.parametrize("grid,prefix,opts", [
    ((4, 5), 1, {}),  # the defaults: scales [5], 8-channel heads, BatchNorm
    ((3, 4), 0, {"scales": [3, 5]}),
    ((4, 4), 1, {"scales": [], "proj_norm": "none", "head_dim": None}),
])
def test_matches_the_naive_lite_mla(grid, prefix, opts):
    torch.manual_seed(0)
    attn = make_attention("relu_linear", grid, prefix, **opts).double().eval()
    with torch.no_grad():
        if attn.norm is not None:  # running statistics and affine parameters away from the identity
            attn.norm.running_mean.normal_()
            attn.norm.running_var.uniform_(0.5, 2.0)
            attn.norm.weight.normal_()
            attn.norm.bias.normal_()
        x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
        torch.testing.assert_close(attn(x, grid), oracle(attn, x, grid), rtol=1e-9, atol=1e-10)


def test_defaults_are_the_papers():
    attn = make_attention("relu_linear", (4, 4), 1, dim=64, heads=2)
    assert (attn.cfg.scales, attn.num_heads, attn.head_dim) == ([5], 8, 8)
    assert isinstance(attn.norm, torch.nn.BatchNorm1d) and attn.proj.bias is None
