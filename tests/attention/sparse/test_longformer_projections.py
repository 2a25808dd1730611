"""Longformer's two sets of projections (``attention.global_projections``), checked against the definition.

``separate`` (the default, the paper's Sec. 3.1): the global rows (prefix queries, the learned tokens' read) take
their queries, keys and values from ``qkv_global`` (Q_g, K_g, V_g); a grid query scores its window keys and the
global keys (prefix tokens, the learned tokens' states) with ``qkv`` (Q_s, K_s, V_s). The oracle below writes
that out per head from the paper's coordinates (windows from :func:`allowed_keys`), sharing no code with the
backend; the blocked and flex paths and the dense reference must equal it in float64. Perturbing weights shows
which rows read which projection. ``shared`` is ``separate`` with Q_g, K_g, V_g equal to Q_s, K_s, V_s.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import Host, attention_yaml, make_attention
from test_longformer_oracle import allowed_keys

from vitzoo import create_model
from vitzoo.attention import ConfigError, attention_config
from vitzoo.attention.sparse.longformer import LongformerAttention
from vitzoo.flops import evaluate_formula, flop_analysis

# (grid, prefix, options): class token and per-layer learned tokens with dilated heads, Swin-like (no class token),
# class token only, three persistent global tokens (the class token among them)
PER_LAYER = {"global_tokens": "per_layer"}
CASES = [((7, 9), 1, {"num_global": 2, "dilated_heads": 2, **PER_LAYER}), ((6, 8), 0, {"num_global": 1}),
         ((5, 7), 1, {"num_global": 0, "dilated_heads": 1, **PER_LAYER}), ((6, 7), 3,
          {"num_global": 3, "global_tokens": "persistent"})]


def build(grid, prefix, mode: str = "separate", impl: str = "blocked", **opts) -> LongformerAttention:
    """``longformer`` in float64 and eval mode, seeded (per-layer tokens unless ``opts`` says otherwise)."""
    torch.manual_seed(0)
    opts = {**PER_LAYER, **opts}
    return make_attention("longformer", grid, prefix, global_projections=mode, impl=impl, **opts).double().eval()


def oracle(attn: LongformerAttention, x: torch.Tensor, grid) -> torch.Tensor:
    """The separate-projection definition per head, densely: ``x[B, P + L, C] -> [B, P + L, C]``."""
    B, N, C = x.shape
    P, g, h = attn.num_prefix, attn.num_learned, attn.num_heads
    d = C // h
    cfg = attn.cfg

    def project(linear, t):  # [B, n, C] -> queries, keys, values [B, n, h, d]
        return (t @ linear.weight.T + linear.bias).unflatten(-1, (3, h, d)).unbind(2)

    def attend(q, k, v, allowed=None):  # q [B, n, h, d] over k, v [B, m, h, d]; allowed [h, n, m]
        scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(d)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v)

    q_s, k_s, v_s = project(attn.qkv, x)
    q_g, k_g, v_g = project(attn.qkv_global, x)
    state_s = state_g = k_s.new_zeros(2, B, 0, h, d)  # keys and values of the learned tokens' states
    if g:
        tokens = attn.global_tokens.expand(B, g, C)
        read = attend(project(attn.qkv_global, tokens)[0], k_g, v_g)  # their queries over every token (global)
        state = tokens + read.flatten(2)
        state_s, state_g = (torch.stack(project(lin, state)[1:]) for lin in (attn.qkv, attn.qkv_global))
    # prefix rows: Q_g over K_g, V_g of the prefix tokens, the states and the grid tokens
    out_pre = attend(q_g[:, :P], torch.cat([k_g[:, :P], state_g[0], k_g[:, P:]], 1),
                     torch.cat([v_g[:, :P], state_g[1], v_g[:, P:]], 1))
    # grid rows: Q_s over K_s, V_s of the global tokens and of the window (sliding heads, then dilated heads)
    L, dilated = grid[0] * grid[1], cfg.dilated_heads
    window = torch.stack([allowed_keys(grid, cfg.kernel_size, cfg.dilation if i >= h - dilated else 1)
                          for i in range(h)])  # [h, L, L]
    allowed = torch.cat([torch.ones(h, L, P + g, dtype=torch.bool), window], dim=2)
    out_grid = attend(q_s[:, P:], torch.cat([k_s[:, :P], state_s[0], k_s[:, P:]], 1),
                      torch.cat([v_s[:, :P], state_s[1], v_s[:, P:]], 1), allowed)
    return attn.proj(torch.cat([out_pre, out_grid], dim=1).flatten(2))


@pytest.mark.parametrize("impl", ["blocked", "flex"])
@pytest.mark.parametrize("grid,prefix,opts", CASES)
def test_separate_projections_follow_the_definition(grid, prefix, opts, impl):
    attn = build(grid, prefix, impl=impl, **opts)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        expected = oracle(attn, x, grid)
        torch.testing.assert_close(attn(x, grid), expected, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(attn.reference(x, grid), expected, rtol=1e-9, atol=1e-11)


def test_default_is_separate_and_the_option_is_checked():
    assert attention_yaml("longformer")["global_projections"] == "separate"
    attn = make_attention("longformer", (6, 6), 1)
    assert attn.qkv_global.weight.shape == attn.qkv.weight.shape and "qkv_global.bias" in attn.state_dict()
    assert "qkv_global.weight" not in make_attention("longformer", (6, 6), 1, global_projections="shared").state_dict()
    with pytest.raises(ConfigError, match=r"^attention\.global_projections must be one of separate, shared "
                                          r"\(got 'sliding'\)$"):
        attention_config({**attention_yaml("longformer"), "global_projections": "sliding"})


def perturbed(attn: LongformerAttention, name: str, rows: slice = slice(None)) -> LongformerAttention:
    """A copy of ``attn`` with rows ``rows`` of parameter ``name`` (e.g. ``qkv_global.weight``) moved."""
    other = build(attn.grid, attn.num_prefix, num_global=attn.num_learned)
    other.load_state_dict(attn.state_dict())
    with torch.no_grad():
        param = dict(other.named_parameters())[name]
        param[rows] += torch.randn_like(param[rows])
    return other


@pytest.mark.parametrize("num_global", [0, 2])
def test_each_row_reads_its_own_projection(num_global):
    """The class token's output depends on ``qkv_global`` only; without learned tokens the grid tokens' outputs
    depend on ``qkv`` only (bit for bit), with them ``qkv_global`` reaches the grid rows through the states."""
    grid, C = (6, 7), 32
    attn = build(grid, 1, num_global=num_global)
    x = torch.randn(2, 1 + 42, C, dtype=torch.float64)
    with torch.no_grad():
        base = attn(x, grid)
        for name, rows in (("qkv.weight", slice(0, C)), ("qkv.weight", slice(C, 3 * C)), ("qkv.bias", slice(None))):
            moved = perturbed(attn, name, rows)(x, grid)  # sliding queries, or keys and values
            assert torch.equal(moved[:, 0], base[:, 0]), f"{name}[{rows}] moved the class token's output"
            assert (moved[:, 1:] - base[:, 1:]).abs().amin(-1).gt(0).all(), f"{name}[{rows}] left a grid row"
        for rows in (slice(0, C), slice(C, 3 * C)):  # global queries, or global keys and values
            moved = perturbed(attn, "qkv_global.weight", rows)(x, grid)
            assert (moved[:, 0] - base[:, 0]).abs().gt(0).all(), f"qkv_global.weight[{rows}] left the class token"
            if num_global:
                assert not torch.allclose(moved[:, 1:], base[:, 1:]), "the states did not carry qkv_global"
            else:
                assert torch.equal(moved[:, 1:], base[:, 1:]), f"qkv_global.weight[{rows}] moved a grid row"


def test_global_weights_reach_grid_rows_only_through_the_states(monkeypatch):
    """With learned tokens: once the states' sliding keys and values are held at their values, moving
    ``qkv_global`` leaves every grid token's output bit for bit (and moves the class token's)."""
    grid = (6, 7)
    attn = build(grid, 1, num_global=2)
    x = torch.randn(2, 1 + 42, 32, dtype=torch.float64)
    seen = []
    real = LongformerAttention.learned_kv
    monkeypatch.setattr(LongformerAttention, "learned_kv", lambda self, *a: seen.append(real(self, *a)) or seen[-1])
    with torch.no_grad():
        base = attn(x, grid)
        moved_attn = perturbed(attn, "qkv_global.weight")
        k_mem, v_mem = seen[0][:2]
        monkeypatch.setattr(LongformerAttention, "learned_kv",
                            lambda self, *a: (k_mem, v_mem, *real(self, *a)[2:]))
        moved = moved_attn(x, grid)
    assert torch.equal(moved[:, 1:], base[:, 1:])
    assert (moved[:, 0] - base[:, 0]).abs().gt(0).all()


@pytest.mark.parametrize("grid,prefix,opts", CASES)
def test_separate_with_copied_weights_equals_shared(grid, prefix, opts):
    """Q_g, K_g, V_g set to Q_s, K_s, V_s: ``separate`` computes what ``shared`` does (outputs and input
    gradients, blocked and flex, and the references)."""
    shared, separate = build(grid, prefix, "shared", **opts), build(grid, prefix, **opts)
    state = shared.state_dict()
    separate.load_state_dict({**state, "qkv_global.weight": state["qkv.weight"], "qkv_global.bias": state["qkv.bias"]})
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64, requires_grad=True)
    grads = []
    for attn in (shared, separate):
        out = attn(x, grid)
        grads.append((out, *torch.autograd.grad(out.square().sum(), x)))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(separate.reference(x, grid), shared.reference(x, grid), rtol=1e-10, atol=1e-12)
        for attn in (shared, separate):
            attn.cfg.impl = "flex"
        torch.testing.assert_close(separate(x, grid), shared(x, grid), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("grid,prefix,opts", CASES)
def test_flops_of_both_options(grid, prefix, opts):
    """fvcore's count, flops() and each instance's formula agree; ``separate`` costs ``2NC²`` (K_g, V_g of every
    token) plus ``2gC²`` where a prefix query scores the states' K_g, V_g more than ``shared``."""
    counts = {}
    for mode in ("separate", "shared"):
        attn = build(grid, prefix, mode, **opts).float()
        x = torch.randn(1, prefix + grid[0] * grid[1], 32)
        with torch.no_grad():
            measured = flop_analysis(Host(attn, grid), (x,)).by_module()["attn"]
        assert measured == attn.flops(grid) == evaluate_formula(attn.formula, attn.symbols(grid)), mode
        counts[mode] = measured
    shared = make_attention("longformer", grid, prefix, global_projections="shared", **opts)
    assert shared.formula == LongformerAttention.shared_formula
    N, C, g = prefix + grid[0] * grid[1], 32, shared.num_learned
    assert counts["separate"] - counts["shared"] == 2 * N * C * C + 2 * min(prefix, 1) * g * C * C


def test_state_dict_without_global_projection_fails_strict_load():
    """A ``shared`` state dict (no ``qkv_global``) into ``separate``: a strict load names the missing tensors."""
    shared, separate = build((6, 6), 1, "shared"), build((6, 6), 1)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "qkv_global.weight", "qkv_global.bias"'):
        separate.load_state_dict(shared.state_dict())
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "qkv_global.weight"'):
        shared.load_state_dict(separate.state_dict())


@pytest.mark.parametrize("model,num_global", [("vit_cifar", 1), ("vit_cifar", 3), ("swin_cifar", 1)])
def test_models_fast_paths_equal_the_reference(model, num_global):
    """In ViT (class token, persistent global tokens) and Swin (no class token: per-layer tokens) hosts, float64:
    blocked, flex and the dense reference."""
    torch.manual_seed(0)
    net = create_model(model, attention={**attention_yaml("longformer"), "num_global": num_global}).double().eval()
    layers = [m for m in net.modules() if isinstance(m, LongformerAttention)]
    assert layers and all(m.qkv_global is not None for m in layers)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    outs = []
    with torch.no_grad():
        for impl in ("blocked", "flex"):
            for m in layers:
                m.cfg.impl = impl
            outs.append(net(x))
        for m in layers:
            m.forward = m.reference
        reference = net(x)
    for out in outs:
        torch.testing.assert_close(out, reference, rtol=1e-9, atol=1e-11)
