"""vitzoo's compiled block-attention kernel (vitzoo/cpu_kernels/csrc/block_attention.cpp) against the PyTorch path
of :func:`vitzoo.ops.gather.block_attention`.

The dense masked references of every sparse backend run through the kernel in tests/attention/test_registry.py and
tests/attention/sparse/test_sparse_patterns.py; here the kernel and the PyTorch path
(no shared code past the arguments) get
the same odd shapes: head dims and key counts that are not multiples of a vector, one mask row per block,
per-head key ids, global keys, output rows that drop slots.
The build and its fallback: tests/cpu_kernels/test_cpu_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import require_cpu_kernel

from vitzoo.cpu_kernels import block_kernel, loader
from vitzoo.ops import gather


def test_keep_layout_is_transposed_broadcast_and_padded():
    mask = torch.tensor([[[True, False, True]], [[False, True, True]]])  # [n = 2, 1 row, K = 3]
    keep = block_kernel.keep_layout(mask, 2)  # [1, n, Kp = 4, Sp = 16]
    assert keep.shape == (1, 2, 4, 16) and keep.dtype == torch.uint8
    assert keep[0, 0, :3, :2].tolist() == [[1, 1], [0, 0], [1, 1]]
    assert keep[0, 1, :3, 0].tolist() == [0, 1, 1]
    assert int(keep[:, :, 3:].sum()) == 0 and int(keep[:, :, :, 2:].sum()) == 0  # padding: never kept


def _inputs(per_head: bool, rows: int, G: int, d: int, dtype=torch.float64):
    torch.manual_seed(0)
    B, c, L, n, S, K = 2, 3, 37, 5, 6, 11
    qkv = torch.randn(B, L, 3, c, d, dtype=dtype).permute(2, 0, 3, 1, 4)  # q/k/v as strided views [B, c, L, d]
    q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(0))
    glob = [torch.randn(B, c, G, d, dtype=dtype, requires_grad=True) for _ in range(2)] if G else [None, None]
    q_ids = torch.randperm(L)[: n * S].view(n, S)
    k_ids = torch.randint(0, L, (c, n, K) if per_head else (n, K))
    mask = torch.rand(*k_ids.shape[:-1], rows, G + K) > 0.5  # [(c,) n, S or 1, G + K]
    mask[..., -1] = True  # no all-False row
    return q, k, v, glob, q_ids, k_ids, mask


def _run(q, k, v, glob, q_ids, k_ids, mask, out_ids):
    for t in (q, k, v, *glob):
        if t is not None:
            t.grad = None
    out = gather.block_attention(q, k, v, q_ids, k_ids, mask, 0.4, 0.0, *glob, out_ids=out_ids)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return [out.detach()] + [t.grad.clone() for t in (q, k, v, *glob) if t is not None]


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("rows,G,d,drop", [(6, 0, 12, False), (1, 3, 32, True), (6, 2, 5, True)])
def test_kernel_matches_torch_path(per_head, rows, G, d, drop, monkeypatch):
    require_cpu_kernel("block_attention")
    q, k, v, glob, q_ids, k_ids, mask = _inputs(per_head, rows, G, d)
    out_ids = torch.randperm(q_ids.numel())[: q_ids.numel() - 4] if drop else None  # 4 slots get no row
    fast = _run(q, k, v, glob, q_ids, k_ids, mask, out_ids)
    monkeypatch.setenv(loader.ENV, "0")
    slow = _run(q, k, v, glob, q_ids, k_ids, mask, out_ids)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_kernel_float32_close_to_float64():
    """float32 runs the vectorised exp2 (a polynomial): within float32 rounding of the float64 result."""
    require_cpu_kernel("block_attention")
    q, k, v, glob, q_ids, k_ids, mask = _inputs(True, 6, 2, 32)
    exact = _run(q, k, v, glob, q_ids, k_ids, mask, None)
    single = [t.detach().float().requires_grad_() if t is not None else None for t in (q, k, v, *glob)]
    approx = _run(*single[:3], single[3:], q_ids, k_ids, mask, None)
    for a, b in zip(approx, exact, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)
