"""``exp(proj - shift)`` with a lean backward: the positive random features of FAVOR+
(:mod:`vitzoo.attention.linear.performer`)."""
from __future__ import annotations

import torch
from torch import Tensor


class ExpShift(torch.autograd.Function):
    """``exp(proj - shift)`` for ``proj[..., N, m]`` and ``shift[..., N, 1]`` in two passes over N×m.

    Autograd's version also writes ``-grad`` for the broadcast subtraction; here the shift's gradient
    is the row sum of the projection's gradient, and the forward works in place on a fresh tensor.
    """

    @staticmethod
    def forward(ctx, proj: Tensor, shift: Tensor) -> Tensor:
        phi = (proj - shift).exp_()
        ctx.save_for_backward(phi)
        return phi

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        (phi,) = ctx.saved_tensors
        grad_proj = grad * phi  # d exp(u) = exp(u) du
        return grad_proj, -grad_proj.sum(dim=-1, keepdim=True)
