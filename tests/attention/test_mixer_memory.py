"""``memory(grid, batch, amp)`` of every registered backend against the bytes autograd saves.

Generated from the registry: each backend, built as a ViT block builds it (one class token), at 64, 256 and
1,024 grid tokens, in fp32 and under bf16 autocast, runs one training forward inside
:class:`~vitzoo.measure.activations.SavedTensorCounter`; the analytic bytes must equal the counted activation
bytes exactly (the counter shares no code with the formulas). The same backends built as a Swin block builds them
(no prefix token, window 4) take a bf16 input under bf16 autocast, as Swin's residual stream is under CPU autocast,
and ``memory(..., input_dtype=torch.bfloat16)`` must equal the counter there too.
"""
from __future__ import annotations

import pytest
import torch
from conftest import ATTENTION_NAMES, make_attention

from vitzoo.costs import saved_bytes
from vitzoo.measure.activations import SavedTensorCounter

GRIDS = [(8, 8), (16, 16), (32, 32)]  # 64, 256 and 1,024 grid tokens
AMPS = [None, torch.bfloat16]
DIM, HEADS, BATCH = 32, 4, 2


def counted_and_predicted(name: str, grid: tuple[int, int], amp, num_prefix: int = 1,
                          input_dtype=None) -> tuple[int, int, str]:
    """(counted activation bytes, ``memory()`` bytes, the counter's table) of one training forward.

    Args:
        name: registered backend; grid: token grid; amp: autocast dtype or ``None``.
        num_prefix: prefix tokens (ViT: 1, Swin: 0); input_dtype: the input's dtype (``None``: fp32).
    """
    torch.manual_seed(0)
    mixer = make_attention(name, grid, num_prefix=num_prefix, dim=DIM, heads=HEADS).train()
    leaf = torch.randn(BATCH, num_prefix + grid[0] * grid[1], DIM, requires_grad=True)  # [B, P + H·W, C]
    # not a leaf, as in a block (a LayerNorm's output): autocast caches its bf16 copy only for leaves, so each
    # projection reading the input makes its own copy
    x = leaf.to(input_dtype or torch.float32, copy=True)
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        with SavedTensorCounter(mixer) as counter:
            out = mixer(x, grid)
    # read once the counter closed, the output still alive: what autograd holds for backward (a tensor saved
    # by a graph part the forward dropped is marked freed and left out)
    counted, table = counter.activation_bytes, counter.table()
    del out
    return counted, saved_bytes(mixer.memory(grid, batch=BATCH, amp=amp, input_dtype=input_dtype)), table


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0] * g[1]}tok")
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_memory_equals_saved_activation_bytes(name, grid, amp, one_thread):
    counted, predicted, table = counted_and_predicted(name, grid, amp)
    assert predicted == counted, f"{name}: memory() {predicted} B, counted {counted} B\n{table}"


@pytest.mark.parametrize("grid", GRIDS[:2], ids=lambda g: f"{g[0] * g[1]}tok")
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_memory_of_a_bf16_input_in_a_swin_block(name, grid, one_thread):
    # Swin's patch norm keeps its convolution's bf16 under CPU autocast, so its mixers read a bf16 input: every
    # autocast op reads that one storage instead of casting the input apart
    bf16 = torch.bfloat16
    counted, predicted, table = counted_and_predicted(name, grid, bf16, num_prefix=0, input_dtype=bf16)
    assert predicted == counted, f"{name}: memory(input_dtype=bf16) {predicted} B, counted {counted} B\n{table}"


@pytest.mark.parametrize("num_prefix,input_dtype,amp", [(1, None, None), (1, None, torch.bfloat16),
                                                        (0, torch.bfloat16, torch.bfloat16)],
                         ids=["vit-fp32", "vit-bf16", "swin-bf16"])
def test_memory_of_axial_passes_that_project_again(num_prefix, input_dtype, amp, monkeypatch, one_thread):
    """``axial`` where its passes run in several calls (forced here: two lines per call, at 256 tokens): the pass
    nodes keep their projections' inputs in place of q|k|v, and ``memory()`` follows."""
    from vitzoo.ops import axial as axial_ops

    monkeypatch.setattr(axial_ops, "lines_per_call", lambda *a: 2)
    assert make_attention("axial", (16, 16), num_prefix=num_prefix, dim=DIM, heads=HEADS).recomputes((16, 16), False)
    counted, predicted, table = counted_and_predicted("axial", (16, 16), amp, num_prefix, input_dtype)
    assert predicted == counted, f"axial: memory() {predicted} B, counted {counted} B\n{table}"
    assert "q|k|v" not in table
