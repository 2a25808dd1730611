"""BigBird's pattern from the paper's block coordinates, sharing no code with the backend: the grid is cut into
b×b blocks; a query in block (R, C) sees the w×w block window around it (shifted at the border to stay inside
the block grid), the global blocks (n_g of them spread evenly over the raster order: the first for one, first
and last for two) and its head's r random blocks (the decision, read from the ``random_blocks`` buffer and
checked to be r distinct blocks outside the window and the global blocks); a query in a global block sees every
token; every query sees the class token. Checked both ways by perturbing one key at a time."""
from __future__ import annotations

import pytest
import torch
from conftest import make_attention
from helpers import reached_keys

PREFIX = 1


def block_of(token: int, grid, b: int) -> tuple[int, int]:
    return (token // grid[1]) // b, (token % grid[1]) // b


def window_blocks(R: int, C: int, rows: int, cols: int, w: int) -> set[tuple[int, int]]:
    """The w×w block window around (R, C), shifted to stay inside a rows×cols block grid."""
    wr, wc = min(w, rows), min(w, cols)
    r0 = min(max(R - wr // 2, 0), rows - wr)
    c0 = min(max(C - wc // 2, 0), cols - wc)
    return {(r, c) for r in range(r0, r0 + wr) for c in range(c0, c0 + wc)}


def global_blocks(count: int, n_global: int) -> set[int]:
    if n_global == 1:
        return {0}
    return {int(round(i * (count - 1) / (n_global - 1))) for i in range(n_global)}


def reached(attn, grid) -> torch.Tensor:
    """``[L, P + L]``: which input tokens move each grid query's output (one token perturbed at a time)."""
    x = torch.randn(1, PREFIX + grid[0] * grid[1], 32, dtype=torch.float64)
    return reached_keys(lambda batch: attn(batch, grid), x)[0, PREFIX:]


@pytest.mark.parametrize("grid,b,n_global,r", [((8, 10), 2, 1, 2), ((8, 10), 2, 2, 1), ((9, 12), 3, 2, 2)])
def test_bigbird_sees_exactly_window_global_and_random_blocks(grid, b, n_global, r):
    torch.manual_seed(0)
    attn = make_attention("bigbird", grid, PREFIX, block_size=b, num_global_blocks=n_global,
                          num_random=r).double().eval()
    rows, cols = -(-grid[0] // b), -(-grid[1] // b)
    glob = global_blocks(rows * cols, n_global)
    rand = attn.random_blocks  # [h, blocks, r]: the decision
    assert rand.shape == (4, rows * cols, r)
    seen = reached(attn, grid)
    assert seen[:, :PREFIX].all(), "a query does not see the class token"
    for token in range(grid[0] * grid[1]):
        R, C = block_of(token, grid, b)
        block = R * cols + C
        window = {br * cols + bc for br, bc in window_blocks(R, C, rows, cols, 3)}
        if block in glob:
            allowed_blocks = set(range(rows * cols))
        else:
            allowed_blocks = window | glob
            for head in range(4):
                picks = {int(j) for j in rand[head, block]}
                assert len(picks) == r and not picks & (window | glob), (head, block, picks)
                allowed_blocks |= picks
        expected = torch.tensor([(R2 * cols + C2) in allowed_blocks
                                 for R2, C2 in (block_of(k, grid, b) for k in range(grid[0] * grid[1]))])
        assert torch.equal(seen[token, PREFIX:], expected), f"query {token} (block {block})"
