"""The neighbourhood backends (``local``, ``dilated``, ``global_tokens``, ``multi_pattern``) against an oracle written
here from the papers' coordinates, sharing no code with the backends (no geometry, halo or pattern helper).

* NAT (Hassani et al., CVPR 2023, https://arxiv.org/abs/2204.07143): a grid query at (r, c) sees, per axis, the k
  consecutive positions centred on it, shifted inward at the border so that it always has k (k² keys in all).
* DiNAT (Hassani & Shi 2022, https://arxiv.org/abs/2209.15001): the same inside the query's dilation sub-lattice
  (the positions ``≡ r mod δ`` of its axis), keys δ apart; per axis δ is the requested dilation where k·δ fits the
  side, otherwise ``side // k`` (the backends' documented small-grid rule).
* Prefix tokens (ViT's class token) are global: a prefix query sees every token, every query sees the prefix.
* ``global_tokens`` (ETC, Vision Longformer): the NAT window plus the prefix and g learned tokens, which first read
  every token. ``multi_pattern``: per head, in the order of ``attention.patterns``, a NAT window, a DiNAT window or
  every token (global heads).

Checked both ways by perturbing one input token at a time, per head (the output projection set to the identity):
every allowed key moves the query's head output and no other token does, on each path the backends have on the
CPU: blocked attention through vitzoo's compiled kernel and through PyTorch, FlexAttention (eager, forward only)
and the dense masked reference. ``local``/``dilated`` run with their relative position bias on (with visible values;
it changes scores, not which keys a query sees), which writes the halo scores out, and off.
"""
from __future__ import annotations

import pytest
import torch
from conftest import make_attention, use_cpu_kernel
from helpers import heads_apart, pattern_mismatch, reached_keys

from vitzoo.attention.sparse import flex as flex_impl
from vitzoo.ops import gather

DIM = 16
PATHS = ["kernel", "pytorch", "flex", "reference"]  # backends without a relative position bias
# (rel_pos_bias, path) of local and dilated: the bias on (as configured) writes the halo scores out, off runs the
# halo blocks through the compiled kernel or SDPA
BIAS_PATHS = [(True, "blocked"), (True, "flex"), (True, "reference"), (False, "kernel"), (False, "pytorch"),
              (False, "flex")]


# ------------------------------------------------------------------------------------------------ the oracle
def axis_keys(n: int, kernel: int, dilation: int, i: int) -> list[int]:
    """Positions a query at ``i`` sees along an axis of length ``n``: the k positions of its sub-lattice
    ``{i mod δ, i mod δ + δ, ...}`` centred on it, moved inward to stay inside the sub-lattice."""
    lattice = list(range(i % dilation, n, dilation))
    start = min(max(lattice.index(i) - kernel // 2, 0), len(lattice) - kernel)
    return lattice[start:start + kernel]


def used_dilation(side: int, kernel: int, dilation: int) -> int:
    """δ along an axis: the requested one where k·δ fits the side, otherwise side // k."""
    return dilation if kernel * dilation <= side else side // kernel


def window_keys(grid, kernel: int, dilation: int = 1) -> torch.Tensor:
    """``[L, L]`` booleans: grid query (r, c) sees grid key (r', c') (raster order)."""
    H, W = grid
    d_r, d_c = used_dilation(H, kernel, dilation), used_dilation(W, kernel, dilation)
    allowed = torch.zeros(H * W, H * W, dtype=torch.bool)
    for r in range(H):
        for c in range(W):
            for kr in axis_keys(H, kernel, d_r, r):
                for kc in axis_keys(W, kernel, d_c, c):
                    allowed[r * W + c, kr * W + kc] = True
    return allowed


def with_prefix(windows: torch.Tensor, prefix: int) -> torch.Tensor:
    """``[P + L, P + L]``: the grid pattern ``windows[L, L]`` with P global prefix tokens in front."""
    L = windows.shape[0]
    allowed = torch.ones(prefix + L, prefix + L, dtype=torch.bool)
    allowed[prefix:, prefix:] = windows
    return allowed


def test_oracle_hand_checked():
    """The oracle on cases worked by hand (NAT's border shift, DiNAT's sub-lattices, the small-grid rule) and its
    invariants: every grid query has exactly k² keys, its own position among them."""
    assert [axis_keys(5, 3, 1, i) for i in range(5)] == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [2, 3, 4]]
    assert [axis_keys(7, 3, 2, i) for i in range(7)] == [[0, 2, 4], [1, 3, 5], [0, 2, 4], [1, 3, 5], [2, 4, 6],
                                                         [1, 3, 5], [2, 4, 6]]
    assert [used_dilation(side, 3, 3) for side in (4, 7, 8, 9, 12)] == [1, 2, 2, 3, 3]
    for grid, k, d in [((7, 9), 3, 1), ((6, 10), 5, 1), ((11, 7), 3, 3), ((10, 13), 3, 4)]:
        allowed = window_keys(grid, k, d)
        assert bool((allowed.sum(1) == k * k).all()) and bool(allowed.diagonal().all())


# ------------------------------------------------------------------------------------------------ the probe
def path_fn(attn, grid, path: str, monkeypatch):
    """``batch -> output`` of ``attn`` at ``grid`` on one path: ``blocked`` (halo blocks; with a relative position
    bias their scores are written out), ``kernel`` / ``pytorch`` (halo blocks through vitzoo's compiled kernel or
    through SDPA, without a bias), ``flex`` or ``reference``. Fails if the kernel or FlexAttention does not run."""
    if path == "reference":
        return lambda batch: attn.reference(batch, grid)
    if path in ("kernel", "pytorch"):
        use_cpu_kernel("block_attention", path == "kernel", monkeypatch)
    attn.cfg.impl = "flex" if path == "flex" else "blocked"
    calls, watched = [], {"flex": (flex_impl, "run_flex"), "kernel": (gather, "_kernel_forward")}.get(path)
    if watched:
        run = getattr(*watched)
        monkeypatch.setattr(*watched, lambda *a, **k: calls.append(1) or run(*a, **k))

    def forward(batch):
        out = attn(batch, grid)
        assert calls or not watched, f"the {path} path did not run"
        return out
    return forward


def build(name, grid, prefix, heads, **options):
    """The backend in float64 eval mode, heads apart, relative position tables (if any) with visible values."""
    torch.manual_seed(0)
    attn = heads_apart(make_attention(name, grid, prefix, dim=DIM, heads=heads, **options).double().eval())
    if getattr(attn, "rel_pos_bias", None) is not None:
        with torch.no_grad():
            attn.rel_pos_bias.normal_()
    return attn


def check_heads(fn, grid, prefix: int, expected: list[torch.Tensor]) -> None:
    """Head h of ``fn`` is moved exactly by the keys ``expected[h][P + L, P + L]`` allows (query, key)."""
    x = torch.randn(1, prefix + grid[0] * grid[1], DIM, dtype=torch.float64)
    reached = reached_keys(fn, x, heads=len(expected))
    for head, allowed in enumerate(expected):
        assert not (mismatch := pattern_mismatch(reached[head], allowed)), f"head {head}: {mismatch}"


# ---------------------------------------------------------------------------------------- local and dilated
# (grid, prefix, kernel): square and non-square, odd sides, blocks of 4 not dividing the grid, a kernel as long as
# the shorter side, Swin's 4x4 stage
LOCAL_CASES = [((5, 5), 1, 3), ((7, 9), 0, 3), ((6, 10), 1, 5), ((5, 7), 1, 5), ((4, 4), 0, 3), ((9, 6), 1, 3)]
# (grid, prefix, kernel, dilation): δ kept on both axes, k·δ equal to a side, δ shrinking to 1 on one axis, to 2
# (not 1) on one axis, to 3 on one axis, on both axes (4x4), with k = 5
DILATED_CASES = [((7, 9), 1, 3, 2), ((12, 9), 0, 3, 3), ((5, 8), 1, 3, 2), ((11, 7), 1, 3, 3), ((10, 13), 1, 3, 4),
                 ((4, 4), 0, 3, 2), ((10, 11), 0, 5, 2)]


@pytest.mark.parametrize("bias,path", BIAS_PATHS)
@pytest.mark.parametrize("grid,prefix,kernel", LOCAL_CASES)
def test_local_sees_exactly_the_nat_window(grid, prefix, kernel, bias, path, monkeypatch, one_thread):
    """Every head: NAT's k×k window shifted inward at the border, plus the global class token."""
    attn = build("local", grid, prefix, heads=2, kernel_size=kernel, rel_pos_bias=bias)
    allowed = with_prefix(window_keys(grid, kernel), prefix)
    check_heads(path_fn(attn, grid, path, monkeypatch), grid, prefix, [allowed] * 2)


@pytest.mark.parametrize("bias,path", BIAS_PATHS)
@pytest.mark.parametrize("grid,prefix,kernel,dilation", DILATED_CASES)
def test_dilated_sees_exactly_the_dinat_window(grid, prefix, kernel, dilation, bias, path, monkeypatch, one_thread):
    """Every head: DiNAT's k×k window in the query's sub-lattice (δ fitted per axis), plus the global class token."""
    attn = build("dilated", grid, prefix, heads=2, kernel_size=kernel, dilation=dilation, rel_pos_bias=bias)
    allowed = with_prefix(window_keys(grid, kernel, dilation), prefix)
    check_heads(path_fn(attn, grid, path, monkeypatch), grid, prefix, [allowed] * 2)


@pytest.mark.parametrize("name", ["local", "dilated", "multi_pattern"])
def test_pattern_at_a_grid_other_than_the_construction_grid(name, monkeypatch, one_thread):
    """Built at 8x8, run at 11x6: the windows (and DiNAT's δ, 2 on rows and 2 on columns) are those of 11x6."""
    grid, prefix = (11, 6), 1
    options = {"patterns": [["local", 1], ["dilated", 1]]} if name == "multi_pattern" else {}
    attn = build(name, (8, 8), prefix, heads=2, **options)
    dilation = 2 if name == "dilated" else 1
    expected = ([with_prefix(window_keys(grid, 3, d), prefix) for d in (1, 2)] if name == "multi_pattern"
                else [with_prefix(window_keys(grid, 3, dilation), prefix)] * 2)
    check_heads(path_fn(attn, grid, "blocked", monkeypatch), grid, prefix, expected)


# ------------------------------------------------------------------------------------------------ global_tokens
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("grid,kernel", [((5, 5), 3), ((7, 9), 3), ((6, 10), 5)])
def test_global_tokens_window_with_the_class_token_as_global(grid, kernel, path, monkeypatch, one_thread):
    """No learned token (they read every token before they are keys): every head sees NAT's window plus the class
    token; the class token's query sees every token."""
    attn = build("global_tokens", grid, 1, heads=2, kernel_size=kernel, num_global=0)
    allowed = with_prefix(window_keys(grid, kernel), 1)
    check_heads(path_fn(attn, grid, path, monkeypatch), grid, 1, [allowed] * 2)


def hold_learned_tokens(attn, shift: torch.Tensor | None = None) -> None:
    """Fix the learned tokens' keys and values to those of the first image of the batch, so that the read (through
    which every token reaches every query) no longer moves them; ``shift[2, 1, h, g, d]`` is added to them."""
    read = type(attn).learned_kv.__get__(attn)  # the backend's own read

    def held(*args, **kwargs):  # keys, values as grid rows see them, then as prefix rows see them: [B, h, g, d] each
        kv = [t[:1].expand_as(t) for t in read(*args, **kwargs)]
        return tuple(kv if shift is None else (t + shift[i % 2] for i, t in enumerate(kv)))
    attn.learned_kv = held


@pytest.mark.parametrize("path", ["kernel", "pytorch", "flex"])
@pytest.mark.parametrize("grid,prefix,kernel,num_global", [((7, 9), 0, 3, 2), ((6, 6), 1, 5, 1), ((5, 8), 1, 3, 3)])
def test_global_tokens_with_learned_tokens(grid, prefix, kernel, num_global, path, monkeypatch, one_thread):
    """With the learned tokens' keys and values held fixed, every head of a grid query is moved exactly by its NAT
    window and the class token; moving a learned token's key and value moves every query in every head."""
    attn = build("global_tokens", grid, prefix, heads=2, kernel_size=kernel, num_global=num_global)
    fn = path_fn(attn, grid, path, monkeypatch)
    hold_learned_tokens(attn)
    check_heads(fn, grid, prefix, [with_prefix(window_keys(grid, kernel), prefix)] * 2)
    x = torch.randn(1, prefix + grid[0] * grid[1], DIM, dtype=torch.float64)
    with torch.no_grad():
        base = fn(x)
        for token in range(num_global):
            shift = torch.zeros(2, 1, 2, num_global, DIM // 2, dtype=torch.float64)  # [k|v, B, h, g, d]
            shift[:, :, :, token] = torch.randn(2, 1, 2, DIM // 2, dtype=torch.float64)
            hold_learned_tokens(attn, shift)
            moved = (fn(x) - base).abs().unflatten(-1, (2, -1)).amax(-1)  # [1, P + L, heads]
            assert bool((moved > 1e-12).all()), f"learned token {token} does not reach every query and head"


@pytest.mark.parametrize("path", PATHS)
def test_global_tokens_read_lets_every_token_reach_every_query(path, monkeypatch, one_thread):
    """Learned tokens read the sequence before they are keys: every token moves every query in every head."""
    grid = (6, 7)
    attn = build("global_tokens", grid, 0, heads=2, num_global=1)
    check_heads(path_fn(attn, grid, path, monkeypatch), grid, 0, [torch.ones(42, 42, dtype=torch.bool)] * 2)


# ------------------------------------------------------------------------------------------------ multi_pattern
def head_windows(patterns, heads: int, grid, kernel: int, dilation: int) -> list[torch.Tensor]:
    """``[L, L]`` per head: ``patterns`` in head order, the null entry taking the heads the others leave."""
    rest = heads - sum(n for _, n in patterns if n is not None)
    out = []
    for name, n in patterns:
        window = {"local": lambda: window_keys(grid, kernel), "dilated": lambda: window_keys(grid, kernel, dilation),
                  "global": lambda: torch.ones(grid[0] * grid[1], grid[0] * grid[1], dtype=torch.bool)}[name]()
        out += [window] * (rest if n is None else n)
    assert len(out) == heads
    return out


MULTI_CASES = [  # (patterns, heads, grid, prefix, kernel, dilation)
    ([["local", None], ["dilated", 1], ["global", 1]], 4, (7, 9), 1, 3, 2),  # the YAML's default patterns
    ([["dilated", 2], ["global", 1], ["local", None]], 4, (8, 6), 0, 3, 2),
    ([["local", 1], ["dilated", 3]], 4, (11, 7), 1, 3, 3),  # δ = 3 on rows, 2 on columns
    ([["local", None], ["dilated", 2]], 2, (5, 8), 0, 3, 2),  # the null entry gets no head; δ = 1 on rows
    ([["dilated", 1], ["local", 1]], 2, (10, 11), 1, 5, 2),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("patterns,heads,grid,prefix,kernel,dilation", MULTI_CASES)
def test_multi_pattern_each_head_sees_its_pattern(patterns, heads, grid, prefix, kernel, dilation, path,
                                                  monkeypatch, one_thread):
    """Head by head: a NAT window, a DiNAT window or every token, in the order of ``attention.patterns``, plus the
    class token, which is global in every head."""
    attn = build("multi_pattern", grid, prefix, heads=heads, patterns=patterns, kernel_size=kernel, dilation=dilation)
    expected = [with_prefix(w, prefix) for w in head_windows(patterns, heads, grid, kernel, dilation)]
    check_heads(path_fn(attn, grid, path, monkeypatch), grid, prefix, expected)
