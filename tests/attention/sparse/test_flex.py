"""``attention.impl`` of the fixed-pattern backends: the FlexAttention path gives the blocked path's outputs.

FlexAttention runs forward-only on CPU (eager, unfused), which is what these tests use; its GPU
speed is not measured here. Backends come from the registry (every :class:`SparsePatternAttention`).
"""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import attention_yaml, backends, make_attention
from torch.nn.attention.flex_attention import create_mask

from vitzoo.attention import ConfigError, attention_config
from vitzoo.attention.sparse import flex as flex_impl
from vitzoo.attention.sparse.pattern import SparsePatternAttention
from vitzoo.ops import select

FIXED = backends(base=SparsePatternAttention)

# (grid, prefix, options): square and non-square grids, with and without a class token, grids that
# BigBird pads to whole blocks, dilation that stays > 1, more learned global tokens
CASES = [((8, 8), 1, {}), ((6, 10), 0, {}), ((5, 7), 1, {}), ((9, 12), 0, {})]
EXTRA = [("local", (8, 8), 1, {"rel_pos_bias": True}), ("local", (6, 10), 0, {"rel_pos_bias": True, "kernel_size": 5}),
         ("dilated", (12, 9), 1, {"dilation": 3}), ("longformer", (10, 8), 1,
          {"dilated_heads": 2, "num_global": 3, "global_tokens": "per_layer"}),
         ("global_tokens", (7, 9), 0, {"num_global": 4, "kernel_size": 5}),
         ("bigbird", (7, 10), 1, {"block_size": 3, "num_global_blocks": 2, "num_random": 1}),
         ("multi_pattern", (8, 6), 0, {"patterns": [["dilated", 2], ["global", 1], ["local", None]]})]
PARAMS = [(name, grid, prefix, opts) for name in FIXED for grid, prefix, opts in CASES] + EXTRA


def build(name, grid, prefix, **opts):
    """The backend in eval mode with ``impl=blocked``; relative position tables get visible values."""
    torch.manual_seed(0)
    attn = make_attention(name, grid, prefix, impl="blocked", **opts).eval()
    if getattr(attn, "rel_pos_bias", None) is not None:
        with torch.no_grad():
            attn.rel_pos_bias.normal_()
    return attn


@pytest.mark.parametrize("name,grid,prefix,opts", PARAMS)
def test_flex_forward_equals_blocked_and_reference(name, grid, prefix, opts, one_thread, monkeypatch):
    attn = build(name, grid, prefix, **opts)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32)
    calls = []
    run = flex_impl.run_flex
    monkeypatch.setattr(flex_impl, "run_flex", lambda *a, **k: calls.append(1) or run(*a, **k))
    with torch.no_grad():
        blocked = attn(x, grid)
        assert not calls
        attn.cfg.impl = "flex"
        flex = attn(x, grid)
        assert calls, "impl=flex did not run FlexAttention"
        ref = attn.reference(x, grid)
    torch.testing.assert_close(flex, blocked, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FIXED)
def test_flex_at_another_grid_and_its_mask_is_the_pattern(name, one_thread):
    """Built at 8x8, run at 10x6: outputs match, and ``mask_mod`` lists exactly ``full_mask``'s keys."""
    attn = build(name, (8, 8), 1)
    grid, x = (10, 6), torch.randn(1, 61, 32)
    with torch.no_grad():
        blocked = attn(x, grid)
        attn.cfg.impl = "flex"
        torch.testing.assert_close(attn(x, grid), blocked, atol=1e-5, rtol=1e-5)
    P, g, L = attn.num_prefix, attn.num_learned, 60
    mask_mod = flex_impl.pattern_mask_mod(attn.flex_grid_mod(grid, "cpu"), P, g, L)
    dense = create_mask(mask_mod, 1, attn.num_heads, P + L, P + g + L, device="cpu")[0]  # [h, P + L, P + g + L]
    assert torch.equal(dense, attn.full_mask(grid).expand_as(dense))


@pytest.mark.slow  # inductor compiles flex_attention on CPU: ~10-15 s per case on 2 cores
@pytest.mark.parametrize("name,opts", [("local", {"rel_pos_bias": True}), ("bigbird", {})])
def test_compiled_flex_equals_blocked(name, opts, monkeypatch):
    """The compiled kernel (what CUDA runs) traces the table lookups of mask_mod/score_mod correctly."""
    attn, x = build(name, (8, 8), 1, **opts), torch.randn(2, 65, 32)
    monkeypatch.setattr(flex_impl, "run_flex", functools.partial(flex_impl.run_flex, compiled=True))
    with torch.no_grad():
        blocked = attn(x, (8, 8))
        attn.cfg.impl = "flex"
        torch.testing.assert_close(attn(x, (8, 8)), blocked, atol=1e-5, rtol=1e-5)


def test_block_mask_is_cached_per_grid_and_rebuilt_with_the_pattern(one_thread):
    attn = build("bigbird", (8, 8), 1)
    first = flex_impl.flex_mask_at(attn, (8, 8), "cpu", lambda: attn.build_flex((8, 8), "cpu"))
    assert flex_impl.flex_mask_at(attn, (8, 8), "cpu", lambda: pytest.fail("rebuilt")) is first
    attn.load_state_dict(attn.state_dict())  # BigBird rebuilds its pattern after a load
    assert flex_impl.flex_mask_at(attn, (8, 8), "cpu", lambda: "new") == "new"


@pytest.mark.parametrize("name", FIXED)
def test_impl_is_validated_and_in_the_yaml(name):
    assert attention_yaml(name)["impl"] == "auto"
    with pytest.raises(ValueError, match=r"attention\.impl must be one of auto, blocked, flex"):
        attention_config({**attention_yaml(name), "impl": "fused"})


def test_auto_runs_blocked_on_cpu_training(one_thread, monkeypatch):
    attn = make_attention("local", (6, 6), 1)  # the YAML default: auto
    monkeypatch.setattr(flex_impl, "run_flex", lambda *a, **k: pytest.fail("flex on CPU under auto"))
    attn(torch.randn(1, 37, 32), (6, 6)).sum().backward()


def test_flex_where_it_cannot_run_is_a_one_line_error(one_thread):
    attn = make_attention("longformer", (6, 6), 1, impl="flex")
    x = torch.randn(1, 37, 32)
    with pytest.raises(ConfigError, match=r"^attention\.impl=flex has no backward on cpu[^\n]*$"):
        attn(x, (6, 6))  # training on CPU needs a backward
    with torch.no_grad():
        assert attn(x, (6, 6)).shape == x.shape  # forward only is fine
    with pytest.raises(ConfigError, match=r"attention\.impl=flex has no attention dropout"):
        select("sparse_pattern", "flex", "cuda", True, 0.1)


def test_flops_do_not_depend_on_impl():
    blocked, flex = (
        make_attention("bigbird", (8, 8), 1, impl="blocked"),
        make_attention("bigbird", (8, 8), 1, impl="flex"),
    )
    assert blocked.flops((8, 8)) == flex.flops((8, 8))
