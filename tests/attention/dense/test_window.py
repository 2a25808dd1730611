"""Window attention (Swin W-MSA / SW-MSA) against an oracle written here from the Swin paper, and the whole
Swin backbone against timm's ``SwinTransformer`` on copied weights.

The oracle shares no code with ``vitzoo/attention/dense/window.py``: it never rolls, partitions or builds a
mask tensor the way the backend does. It states which (query, key) token pairs may interact, from each
token's (row, column) alone:

* Liu et al. 2021 (https://arxiv.org/abs/2103.14030), Sec. 3.2: W-MSA splits the feature map into
  non-overlapping M×M windows starting at the top-left corner; SW-MSA displaces the windows by
  (⌊M/2⌋, ⌊M/2⌋), which leaves smaller windows along the top/left and bottom/right borders (the cyclic
  shift + mask is only an efficient way to compute exactly these windows). A map that M does not divide
  is padded at the bottom/right to a multiple of M first (official code), and vitzoo masks those padded
  tokens as keys (its documented deviation), so along each axis a token at coordinate ``r`` belongs to
  window ``floor((r - s) / M)`` of the padded map, with ``s = ⌊M/2⌋`` shifted and 0 otherwise.
* A stage whose map is no larger than M uses one window and no shift (official code).
* vitzoo's prefix (class) token is a key of every query and sees every patch token.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import vitzoo
import vitzoo.ops.dispatch
import vitzoo.ops.window
from vitzoo.attention import MixerContext, build_attention

M = 4
# (grid, prefix tokens): divisible, padded by M/2 (6 = 4 + 2, 10 = 8 + 2), padded by other amounts (7 = 4 + 3,
# 5 = 4 + 1: there the shifted regions alone would not separate padding from real tokens), and with a class token
CASES = [((8, 8), 0), ((6, 10), 0), ((7, 5), 0), ((8, 8), 1), ((6, 10), 1)]


def oracle_shift(grid, window=M, shifted=True):
    return window // 2 if shifted and min(grid) > window else 0


def oracle_windows(grid, window=M, shifted=True):
    """``[H·W]`` window id of each real token under the paper's (shifted) partition of the padded map."""
    H, W = grid
    s = oracle_shift(grid, window, shifted)
    cols_of_windows = math.ceil(W / window) + 1  # the shifted partition has one more window per axis
    ids = []
    for r in range(H):
        for c in range(W):
            ids.append(((r - s) // window + 1) * cols_of_windows + (c - s) // window + 1)  # +1: ids from 0
    return torch.tensor(ids)


def oracle_allowed(grid, prefix, shifted):
    """Boolean ``[P + H·W, P + H·W]``: True where query (row) may attend to key (column)."""
    win = oracle_windows(grid, shifted=shifted)
    n = prefix + len(win)
    allowed = torch.ones(n, n, dtype=torch.bool)
    allowed[prefix:, prefix:] = win[:, None] == win[None, :]
    return allowed


def window_mixer(grid, prefix, shifted, dim=16, heads=2, seed=0):
    torch.manual_seed(seed)
    ctx = MixerContext(dim, heads, tuple(grid), prefix, window=M, shifted=shifted)
    attn = build_attention({"name": "window"}, ctx).double().eval()
    with torch.no_grad():  # a bias large enough to matter (the init's std 0.02 would hide a wrong index)
        attn.relative_position_bias_table.normal_(0, 1.0)
    return attn


def test_oracle_partition_is_the_papers():
    """The oracle itself, on a hand-checked case: 8×8, M=4, shifted by 2 -> 3×3 windows of 2/4/2 rows/cols."""
    win = oracle_windows((8, 8)).view(8, 8)
    sizes = sorted(int((win == w).sum()) for w in win.unique())
    assert sizes == sorted([4, 8, 4, 8, 16, 8, 4, 8, 4])
    assert oracle_windows((8, 8), shifted=False).unique().numel() == 4
    assert oracle_windows((4, 4)).unique().numel() == 1  # one window: no shift


@pytest.mark.parametrize("shifted", [False, True], ids=["W-MSA", "SW-MSA"])
@pytest.mark.parametrize("grid,prefix", CASES)
@pytest.mark.parametrize("path", ["forward", "reference"])
def test_perturbing_a_key_changes_exactly_the_allowed_queries(grid, prefix, shifted, path):
    """Perturb one input token at a time: output i changes iff (i, j) is an allowed pair of the oracle."""
    attn = window_mixer(grid, prefix, shifted)
    fn = attn if path == "forward" else attn.reference
    n = prefix + grid[0] * grid[1]
    torch.manual_seed(1)
    x = torch.randn(1, n, 16, dtype=torch.float64)
    batch = x.repeat(n + 1, 1, 1)  # row 0: unperturbed; row 1 + j: token j perturbed
    idx = torch.arange(n)
    batch[1 + idx, idx] += torch.randn(n, 16, dtype=torch.float64)
    with torch.no_grad():
        out = fn(batch, grid)
    change = (out[1:] - out[:1]).abs().amax(-1)  # [key j, query i]
    expected = oracle_allowed(grid, prefix, shifted).T  # [key, query]
    assert change[expected].min() > 1e-6, "an allowed pair has no effect"
    assert change[~expected].max() < 1e-12, "a masked pair leaks"


def oracle_attention(attn, x, grid, prefix, shifted):
    """Dense ``softmax(QKᵀ/√d + B)V`` over the oracle's allowed pairs, with the module's weights.

    Relative position bias: tokens sharing a (shifted) window lie in one contiguous piece of the map, so
    their offset is their coordinate difference. Prefix rows/columns carry no bias. The prefix query's
    output is, as vitzoo documents, the mean over the windows of the cyclically shifted padded map of one
    softmax over (prefix + that window's real tokens).
    """
    B, n, C = x.shape
    h, d = attn.num_heads, C // attn.num_heads
    H, W = grid
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = (t.reshape(B, n, h, d).transpose(1, 2) for t in qkv.split(C, dim=-1))  # [B, h, n, d]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # [B, h, n, n]
    rows = torch.arange(H).repeat_interleave(W)
    cols = torch.arange(W).repeat(H)
    dr = rows[:, None] - rows[None, :] + M - 1
    dc = cols[:, None] - cols[None, :] + M - 1
    inside = (dr >= 0) & (dr < 2 * M - 1) & (dc >= 0) & (dc < 2 * M - 1)
    table_idx = (dr * (2 * M - 1) + dc).clamp(0, (2 * M - 1) ** 2 - 1)
    bias = attn.relative_position_bias_table[table_idx].permute(2, 0, 1) * inside  # [h, HW, HW]
    scores[:, :, prefix:, prefix:] += bias
    allowed = oracle_allowed(grid, prefix, shifted)
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v  # [B, h, n, d]
    if prefix:
        s = oracle_shift(grid, shifted=shifted)
        hp, wp = math.ceil(H / M) * M, math.ceil(W / M) * M
        shifted_win = (((rows - s) % hp) // M) * (wp // M) + ((cols - s) % wp) // M
        per_window = []
        for w in range(hp * wp // M // M):
            keys = torch.cat([torch.ones(prefix, dtype=torch.bool), shifted_win == w])
            per_window.append(scores[:, :, :prefix].masked_fill(~keys, float("-inf")).softmax(-1) @ v)
        out[:, :, :prefix] = torch.stack(per_window).mean(0)
    out = out.transpose(1, 2).reshape(B, n, C)
    return out @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("path", ["core", "sdpa"])
@pytest.mark.parametrize("shifted", [False, True], ids=["W-MSA", "SW-MSA"])
@pytest.mark.parametrize("grid,prefix", CASES)
def test_output_equals_dense_oracle(grid, prefix, shifted, path, monkeypatch):
    """Both paths (the CPU core; SDPA, which CUDA, dropout, tracing and small inference calls take) give the
    oracle's output."""
    if path == "sdpa":
        monkeypatch.setitem(vitzoo.ops.dispatch.TABLE, "window_attention", (("sdpa", lambda *a: True),))
    else:
        monkeypatch.setattr(vitzoo.ops.window, "INFER_MIN_WINDOW_HEADS", 0)
    attn = window_mixer(grid, prefix, shifted)
    torch.manual_seed(2)
    x = torch.randn(2, prefix + grid[0] * grid[1], 16, dtype=torch.float64)
    with torch.no_grad():
        expected = oracle_attention(attn, x, grid, prefix, shifted)
        torch.testing.assert_close(attn(x, grid), expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(attn.reference(x, grid), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shifted", [False, True], ids=["W-MSA", "SW-MSA"])
@pytest.mark.parametrize("grid,prefix", CASES)
def test_training_gradients_equal_reference(grid, prefix, shifted):
    """In training (WindowCore: probabilities kept when T ≤ d, else recomputed in backward) input and parameter
    gradients are the dense reference's."""
    attn = window_mixer(grid, prefix, shifted).train()
    torch.manual_seed(3)
    x = torch.randn(2, prefix + grid[0] * grid[1], 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn_like(x)
    params = [x, *attn.parameters()]
    got = torch.autograd.grad(attn(x, grid), params, g)
    expected = torch.autograd.grad(attn.reference(x, grid), params, g)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_swin_odd_blocks_are_shifted():
    model = vitzoo.create_model("swin_cifar", attention="window")
    for stage in model.stages:
        assert [blk.attn.shifted for blk in stage.blocks] == [i % 2 == 1 for i in range(len(stage.blocks))]


# ------------------------------------------------------------------------------- timm SwinTransformer

def timm_swin(cfg, window):
    """timm's Swin with exactly the configuration of a vitzoo ``window`` Swin."""
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                           num_classes=cfg.num_classes, global_pool="avg", embed_dim=cfg.embed_dim,
                           depths=tuple(cfg.depths), num_heads=tuple(cfg.num_heads), window_size=window,
                           mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop_rate=cfg.drop_rate,
                           attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=cfg.drop_path_rate)


def timm_name(name: str) -> str:
    """vitzoo parameter name -> timm's. timm merges patches at the START of stage i+1 (``layers.{i+1}.downsample``),
    vitzoo at the END of stage i (``stages.{i}.downsample``); timm's head is ``head.fc``."""
    m = re.match(r"stages\.(\d+)\.downsample\.(.*)", name)
    if m:
        return f"layers.{int(m.group(1)) + 1}.downsample.{m.group(2)}"
    name = re.sub(r"^stages\.", "layers.", name)
    return re.sub(r"^head\.", "head.fc.", name)


def copy_into_timm(model, ref):
    ours = {timm_name(k): v for k, v in model.state_dict().items()}
    theirs = ref.state_dict()  # relative_position_index and attn_mask are non-persistent buffers in timm
    assert set(ours) == set(theirs), (sorted(set(ours) ^ set(theirs)))
    for k, v in ours.items():
        assert v.shape == theirs[k].shape, k
    ref.load_state_dict(ours, strict=True)


@pytest.mark.parametrize("variant,overrides,batch", [
    ("swin_cifar", {}, 3),  # 32 px, patch 2, M=4: grids 16, 8, 4 (last stage: one window, no shift)
    pytest.param("swin_tiny", {"num_classes": 100, "depths": [2, 2, 2, 2]}, 1,  # 224 px, M=7: grids 56, 28, 14, 7
                 marks=pytest.mark.slow),
], ids=["swin_cifar", "swin_tiny_224"])
def test_logits_match_timm_swin_on_copied_weights(variant, overrides, batch):
    """Same logits as timm in float64 (≤1e-10) once vitzoo's weights are copied into timm's model.

    Only grids that every stage's window divides are compared: there both define the same thing. On a
    padded grid they differ on purpose (timm lets real tokens attend to zero padding; vitzoo masks it),
    which is covered by the oracle tests above instead. The 224-px case keeps swin_tiny's widths, heads
    and window but two blocks in stage 3 (shifted and unshifted blocks both occur) to stay fast.
    """
    torch.manual_seed(0)
    model = vitzoo.create_model(variant, attention="window", **overrides).double().eval()
    with torch.no_grad():  # random, non-trivial weights everywhere (biases, norms, position bias)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref = timm_swin(model.cfg, model.cfg.window_size).double().eval()
    copy_into_timm(model, ref)
    x = torch.randn(batch, 3, model.cfg.img_size, model.cfg.img_size, dtype=torch.float64)
    with torch.no_grad():
        ours, theirs = model(x), ref(x)
    assert ours.shape == (batch, model.cfg.num_classes)
    assert ours.std() > 1e-3  # the comparison is not between two constants
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
