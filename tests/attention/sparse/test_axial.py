"""Axial attention: the row pass, then the column pass over its outputs."""
from __future__ import annotations

import torch
from conftest import make_attention

from vitzoo.attention import dense_attention


def test_a_single_row_is_softmax_attention():
    """On a 1×W grid each column holds one token, so the column pass returns the row pass: global attention."""
    torch.manual_seed(0)
    attn = make_attention("axial", (1, 6), 0).double()
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attn.attend(q, k, v, (1, 6)), dense_attention(q, k, v))


def test_class_token_attends_to_all_tokens():
    torch.manual_seed(0)
    attn = make_attention("axial", (3, 4), 1).double()
    q, k, v = (torch.randn(1, 4, 13, 8, dtype=torch.float64) for _ in range(3))
    out = attn.attend(q, k, v, (3, 4))
    torch.testing.assert_close(out[:, :, :1], dense_attention(q[:, :, :1], k, v))


def test_two_passes_reach_the_whole_grid():
    """Every grid token's output depends on every grid token (row, then column), yet one pass alone would not."""
    torch.manual_seed(0)
    attn = make_attention("axial", (4, 5), 0).double()
    x = torch.randn(1, 20, 32, dtype=torch.float64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda t: attn(t, (4, 5))[0, 0].sum(), x)  # token (0, 0)
    assert (jac[0].abs().sum(-1) > 0).all()
