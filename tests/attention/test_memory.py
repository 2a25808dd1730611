"""``memory(grid, batch, amp)`` of every registered backend against the bytes autograd saves.

Generated from the registry: each backend, built as a ViT block builds it (one class token), at 64, 256 and
1,024 grid tokens, in fp32 and under bf16 autocast, runs one training forward inside
:class:`~vitzoo.measure.activations.SavedTensorCounter`; the analytic bytes must equal the counted activation
bytes exactly (the counter shares no code with the formulas).
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


def counted_and_predicted(name: str, grid: tuple[int, int], amp) -> tuple[int, int, str]:
    """(counted activation bytes, ``memory()`` bytes, the counter's table) of one training forward.

    Args:
        name: registered backend; grid: token grid; amp: autocast dtype or ``None``.
    """
    torch.manual_seed(0)
    mixer = make_attention(name, grid, num_prefix=1, dim=DIM, heads=HEADS).train()
    leaf = torch.randn(BATCH, 1 + grid[0] * grid[1], DIM, requires_grad=True)  # [B, 1 + H·W, C]
    # not a leaf, as in a block (a LayerNorm's output): autocast caches its bf16 copy only for leaves, so each
    # projection reading the input makes its own copy
    x = leaf.clone()
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        with SavedTensorCounter(mixer) as counter:
            out = mixer(x, grid)
            counted, table = counter.activation_bytes, counter.table()
    del out
    return counted, saved_bytes(mixer.memory(grid, batch=BATCH, amp=amp)), table


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0] * g[1]}tok")
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_memory_equals_saved_activation_bytes(name, grid, amp, one_thread):
    counted, predicted, table = counted_and_predicted(name, grid, amp)
    assert predicted == counted, f"{name}: memory() {predicted} B, counted {counted} B\n{table}"
