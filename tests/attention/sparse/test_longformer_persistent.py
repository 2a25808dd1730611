"""Longformer's persistent global tokens (Vision Longformer, the default ``attention.global_tokens``): the class
token and ``num_global - 1`` learned tokens, prepended once at the ViT's input and carried through every block.

The oracle is a per-query loop written from the paper's definition, sharing no code with the backend: a global
query (one of the P prefix tokens) attends, through Q_g, K_g, V_g, to every token; a grid query at (r, c) attends,
through Q_s, K_s, V_s, to the P global tokens and to the keys (r + a·δ, c + b·δ), |a|, |b| <= k//2, inside the grid.
The model-level oracle runs that layer in every block on the tokens the previous block returned."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import make_attention
from test_longformer_oracle import allowed_keys

from vitzoo import create_model
from vitzoo.attention import ConfigError, attention_class
from vitzoo.attention.base import TokenMixer
from vitzoo.attention.sparse.longformer import LongformerAttention
from vitzoo.flops import count_flops, evaluate_formula

SPEC = {"name": "longformer", "num_global": 3, "dilated_heads": 1, "impl": "blocked"}
TINY = dict(depth=2, embed_dim=32, num_heads=4)


def _softmax_row(q, keys, values, d):
    """``softmax(q·kᵀ/√d)·V`` of one query over the listed keys."""
    scores = torch.stack([q @ k for k in keys]) / math.sqrt(d)
    weights = torch.softmax(scores, dim=0)
    return sum(w * v for w, v in zip(weights, values))


def layer_oracle(attn: LongformerAttention, x: torch.Tensor, grid) -> torch.Tensor:
    """One image ``x[P + L, C]`` -> ``[P + L, C]``, one query and one head at a time."""
    (H, W), P, h, C = grid, attn.num_prefix, attn.num_heads, attn.dim
    d, cfg = C // h, attn.cfg
    sliding = (x @ attn.qkv.weight.T + attn.qkv.bias).unflatten(-1, (3, h, d))  # [N, 3, h, d]
    glob = (x @ attn.qkv_global.weight.T + attn.qkv_global.bias).unflatten(-1, (3, h, d))
    windows = {dil: allowed_keys(grid, cfg.kernel_size, dil) for dil in {1, cfg.dilation}}
    out = torch.zeros(x.shape[0], h, d, dtype=x.dtype)
    for head in range(h):
        dil = cfg.dilation if head >= h - cfg.dilated_heads else 1
        for i in range(P):  # global rows: every token
            out[i, head] = _softmax_row(glob[i, 0, head], glob[:, 1, head], glob[:, 2, head], d)
        for t in range(H * W):  # grid rows: the global tokens and the window
            keys = list(range(P)) + [P + j for j in range(H * W) if windows[dil][t, j]]
            out[P + t, head] = _softmax_row(sliding[P + t, 0, head], sliding[keys, 1, head], sliding[keys, 2, head], d)
    return attn.proj(out.flatten(1))


def model_oracle(net, images):
    """The ViT's features with every longformer layer replaced by :func:`layer_oracle`."""
    tokens = net.patch_embed(images)  # [B, L, C]
    B = tokens.shape[0]
    x = torch.cat([net.cls_token.expand(B, -1, -1), net.global_tokens.expand(B, -1, -1), tokens], 1) + net.pos_embed
    for blk in net.blocks:
        mixed = torch.stack([layer_oracle(blk.attn, img, net.grid) for img in blk.norm1(x)])
        x = x + mixed
        x = x + blk.mlp(blk.norm2(x))
    return net.norm(x)


def vit(**kw):
    torch.manual_seed(0)
    return create_model("vit_cifar", attention=SPEC, **{**TINY, **kw}).double().eval()


@pytest.mark.parametrize("grid,P,dilated", [((5, 6), 3, 1), ((4, 4), 1, 0), ((6, 5), 2, 2)])
def test_layer_matches_the_per_query_oracle(grid, P, dilated):
    torch.manual_seed(0)
    attn = make_attention("longformer", grid, P, num_global=P, dilated_heads=dilated, impl="blocked").double().eval()
    assert attn.num_learned == 0 and attn.global_form == "persistent"
    x = torch.randn(2, P + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        expected = torch.stack([layer_oracle(attn, img, grid) for img in x])
        torch.testing.assert_close(attn(x, grid), expected, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(attn.reference(x, grid), expected, rtol=1e-9, atol=1e-11)


def test_vit_carries_the_global_tokens_through_every_block():
    """The ViT prepends the class token and 2 learned tokens once; its features equal the oracle's, which runs
    every block on the tokens (global ones included) the block before returned. Pooling and head are unchanged."""
    net = vit()
    assert net.num_prefix == 3 and net.global_tokens.shape == (1, 2, 32)
    assert all(b.attn.num_prefix == 3 and b.attn.num_learned == 0 for b in net.blocks)
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        feats = net.forward_features(images)
        torch.testing.assert_close(feats, model_oracle(net, images), rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(net(images), net.head(feats[:, 0]))  # the class token, as before
        avg = vit(global_pool="avg")
        torch.testing.assert_close(avg(images), avg.head(avg.forward_features(images)[:, 3:].mean(1)))


def test_the_capability_sizes_the_prefix_not_the_name(monkeypatch):
    """The ViT asks the backend's class (TokenMixer.prefix_tokens, 0 by default), whatever its name; without a
    class token every global token is a learned one."""
    assert TokenMixer.prefix_tokens(None) == 0
    cfg = create_model("vit_cifar", attention=SPEC, **TINY).attention_cfg
    assert attention_class(cfg).prefix_tokens(cfg) == 3
    monkeypatch.setattr(attention_class("global"), "prefix_tokens", classmethod(lambda cls, cfg: 2))
    other = create_model("vit_cifar", attention="global", **TINY)
    assert other.num_prefix == 2 and other.global_tokens.shape == (1, 1, 32)
    monkeypatch.undo()
    per_layer = create_model("vit_cifar", attention={**SPEC, "global_tokens": "per_layer"}, **TINY)
    assert per_layer.num_prefix == 1 and per_layer.global_tokens is None
    assert all(b.attn.num_learned == 3 for b in per_layer.blocks)
    no_cls = create_model("vit_cifar", attention=SPEC, class_token=False, global_pool="avg", **TINY)
    assert no_cls.num_prefix == 3 and no_cls.global_tokens.shape == (1, 3, 32)
    assert create_model("vit_cifar", attention="global", **TINY).global_tokens is None


def test_swin_gets_the_per_layer_form():
    """Swin has no prefix tokens to carry (and patch merging between stages): each layer has num_global learned
    tokens (g = 3 in the formula)."""
    net = create_model("swin_cifar", attention=SPEC)
    layers = [m for m in net.modules() if isinstance(m, LongformerAttention)]
    assert layers and all(m.global_form == "per_layer" and m.num_learned == 3 for m in layers)
    assert all(m.symbols()["g"] == 3 and m.symbols()["P"] == 0 for m in layers)


def test_a_host_that_does_not_carry_the_tokens_is_one_line():
    with pytest.raises(ConfigError, match=r"attention.num_global=3 persistent global tokens, but the host carries 1 "
                                          r"prefix token\(s\)") as err:
        make_attention("longformer", (6, 6), 1, num_global=3)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"attention.num_global=0 with attention.global_tokens=persistent"):
        make_attention("longformer", (6, 6), 1, num_global=0)
    with pytest.raises(ConfigError, match=r"attention.global_tokens must be one of persistent, per_layer"):
        make_attention("longformer", (6, 6), 1, global_tokens="layer")


@pytest.mark.parametrize("projections", ["separate", "shared"])
def test_model_and_layer_flops_are_exact(projections):
    """fvcore == analytic for the whole ViT (embedding, blocks, final norm over P + L tokens, head) and per layer;
    each layer's formula evaluates to its flops, with g = 0 and P = 3."""
    net = create_model("vit_cifar", attention={**SPEC, "global_projections": projections}, **TINY)
    report = count_flops(net)
    assert report.measured == report.analytic
    assert all(a == m for _, a, m in report.attention.values())
    attn = net.blocks[0].attn
    assert (attn.symbols(net.grid)["g"], attn.symbols(net.grid)["P"]) == (0, 3)
    assert evaluate_formula(attn.formula, attn.symbols(net.grid)) == attn.flops(net.grid)


def test_torch_export_runs_the_persistent_tokens():
    net = vit()
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    program = torch.export.export(net, (images,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(images), net(images), rtol=1e-9, atol=1e-10)
