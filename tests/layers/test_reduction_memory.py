"""``memory(size, batch, amp)`` of every registered token reducer against the bytes autograd saves.

Generated from the ``REDUCTIONS`` registry: each reducer, attached to a tiny ViT (``attention=global``, 4 blocks,
dim 32, 4 heads), runs its block once in training on 65 (the 8x8 grid and the class token), 33 and 17 incoming
tokens, in fp32 and under bf16 autocast, inside :class:`~vitzoo.measure.activations.SavedTensorCounter`. The
storages the counter files under the reducer (its own ops and submodules, not the block's modules it calls) must
equal the formula's bytes, and none of them may be a transient one the forward dropped.
"""
from __future__ import annotations

import pytest
import torch

from vitzoo.costs import saved_bytes
from vitzoo.layers.token_reduction import REDUCTIONS, sequence_grid
from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.models import create_model

TOKENS = [65, 33, 17]  # incoming tokens: the 8x8 grid with its class token, then two reduced sequences
AMPS = [None, torch.bfloat16]
BATCH = 2


def reducing_block(name: str):
    """The first block of a tiny ViT that carries a ``name`` reducer (default options)."""
    model = create_model("vit_cifar", attention="global", token_reduction=name, depth=4, embed_dim=32, num_heads=4,
                         drop_path_rate=0.0).train()
    return next(block for block in model.blocks if block.reducer is not None)


def reducer_bytes(records, held: bool) -> int:
    """Activation bytes the counter filed under the reducer (``held``: only storages alive at its close)."""
    return sum(r.nbytes for r in records if r.kind == "activation" and (r.module == "reducer" or
               r.module.startswith("reducer.")) and not (held and r.freed))


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", TOKENS, ids=lambda n: f"{n}tok")
@pytest.mark.parametrize("name", REDUCTIONS.names())
def test_reducer_memory_equals_saved_activation_bytes(name, n, amp, one_thread):
    torch.manual_seed(0)
    block = reducing_block(name)
    grid = (8, 8) if n == 65 else sequence_grid(n, 1)
    x = torch.randn(BATCH, n, 32, requires_grad=True)  # [B, N, C]
    size = torch.ones(BATCH, n, 1)  # [B, N, 1] patches per token
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        with SavedTensorCounter(block) as counter:
            out = block.reducer(block, x, grid, size)
            during = reducer_bytes(counter.records, held=False)
    held = reducer_bytes(counter.records, held=True)
    predicted = saved_bytes(block.reducer.memory((grid, n), batch=BATCH, amp=amp))
    assert out[0].shape[1] == block.reducer.reduced(n)
    assert predicted == held, f"{name}: memory() {predicted} B, counted {held} B\n{counter.table()}"
    assert during == held, f"{name}: {during - held} B saved during the forward and dropped by it"


@pytest.mark.parametrize("name", REDUCTIONS.names())
def test_reducer_memory_takes_the_part_size_or_the_token_count(name):
    """``memory`` accepts the reducer's part size ``(grid, n)`` from ``parts()`` and the bare token count alike,
    and grows with the batch."""
    block = reducing_block(name)
    part = next(size for part, module, size in block.reducer.parts(block, (8, 8), 65) if part == "reducer")
    assert part == ((8, 8), 65)
    one, bare = block.reducer.memory(part), block.reducer.memory(65)
    assert one == bare and saved_bytes(block.reducer.memory(part, batch=3)) > saved_bytes(one) > 0
