"""CPU's fused attention with its backward in fp32 (:mod:`vitzoo.ops.sdpa`): the native forward and saved set,
gradients against a plain fp64 softmax written here, and which calls take it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.ops import select
from vitzoo.ops.sdpa import FP32_BACKWARD_KEYS, flash_backward, fp32_backward_sdpa, fp32_backward_workspace


def _dense(q, k, v, mask=None):
    """softmax(QKᵀ/√d + mask)V in fp64, written out."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, h, Nq, Nk]
    if mask is not None:
        scores = scores + mask.double()
    return torch.softmax(scores, dim=-1) @ v.double()


def _inputs(dtype, nq=9, nk=13, d=8, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, nq, d), (2, 3, nk, d), (2, 3, nk, dv)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def _grads(out, inputs, grad):
    return torch.autograd.grad(out, inputs, grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_is_the_native_op_and_gradients_follow_the_fp64_softmax(dtype, masked):
    q, k, v = _inputs(dtype)
    mask = torch.randn(2, 1, 1, 13) if masked else None  # a key bias (ToMe's log-size), broadcast over heads and rows
    out = fp32_backward_sdpa(q, k, v, mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    fast = _grads(out, (q, k, v), grad)
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _grads(_dense(*ref_inputs, mask), ref_inputs, grad.double())
    for got, want in zip(fast, ref):
        assert got.dtype == dtype
        # each gradient is the fp32 kernel's, rounded once to the input type
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_the_saved_set_is_the_native_ops():
    """What the forward keeps for backward (and so every memory() formula that lists it) does not change."""
    q, k, v = _inputs(torch.bfloat16, nq=65, nk=65, d=16, dv=16)
    with SavedTensorCounter() as native:
        out_native = F.scaled_dot_product_attention(q, k, v)  # kept: the counter leaves out what was freed
    with SavedTensorCounter() as fast:
        out_fast = fp32_backward_sdpa(q, k, v)
    assert out_fast.shape == out_native.shape
    assert fast.activation_bytes == native.activation_bytes > 0


@pytest.mark.parametrize("case,expected", [
    ({}, "fp32_backward"),
    ({"nk": FP32_BACKWARD_KEYS + 1}, "native"),
    ({"dtype": torch.float32}, "native"),
    ({"dropout_p": 0.1}, "native"),
    ({"mask": "bool"}, "native"),
    ({"mask": "learned"}, "native"),
    ({"mask": "float"}, "fp32_backward"),
    ({"grad": False}, "native"),
])
def test_which_calls_take_the_fp32_backward(case, expected):
    """CPU training in a reduced type up to FP32_BACKWARD_KEYS keys; fp32, dropout, boolean masks and masks with a
    gradient (a learned bias) and inference keep the native op."""
    nk = case.get("nk", 65)
    q, k, v = _inputs(case.get("dtype", torch.bfloat16), nq=65, nk=nk)
    masks = {"bool": torch.ones(1, 1, 65, nk, dtype=torch.bool), "float": torch.zeros(2, 1, 1, nk),
             "learned": torch.zeros(1, 3, 65, nk, requires_grad=True), None: None}
    mask = masks[case.get("mask")]
    with torch.set_grad_enabled(case.get("grad", True)):
        assert select("sdpa", q, k, v, mask, case.get("dropout_p", 0.0)) == expected


def test_workspace_counts_the_fp32_copies():
    """Five fp32 copies (output gradient, q, k, v, output) and three fp32 gradients: 8·bh·(Nq + Nk)(d + dv) bytes
    with d = dv, here 2 images × 3 heads, 65 queries, 65 keys, 16 wide; nothing where the native backward runs."""
    copies = 4 * 6 * (65 * 16 * 3 + 65 * 16 * 2)  # dO, q, O [Nq, d]; k, v [Nk, d]
    grads = 4 * 6 * (65 * 16 + 2 * 65 * 16)  # dq [Nq, d]; dk, dv [Nk, d]
    assert fp32_backward_workspace(6, 65, 65, 16, amp=torch.bfloat16) == copies + grads
    assert fp32_backward_workspace(6, 65, 65, 16, amp=None) == 0
    assert fp32_backward_workspace(6, 65, FP32_BACKWARD_KEYS + 1, 16, amp=torch.bfloat16) == 0


@pytest.mark.parametrize("nk,fp32", [(17, True), (FP32_BACKWARD_KEYS + 1, False)])
def test_flash_backward_runs_fp32_on_short_keys_only(nk, fp32):
    """flash_backward (axial attention's pass node calls it): on short keys each gradient is the fp32 kernel's
    rounded once, on long keys the native kernel's; both follow the fp64 softmax."""
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    q, k, v = [t.detach() for t in _inputs(torch.bfloat16, nq=5, nk=nk)]
    out, lse = forward(q, k, v)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = flash_backward(grad, q, k, v, out, lse)
    if fp32:
        want = [g.to(torch.bfloat16) for g in backward(*(t.float() for t in (grad, q, k, v, out)), lse, 0.0, False)]
    else:
        want = backward(grad, q, k, v, out, lse, 0.0, False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    ref_inputs = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _grads(_dense(*ref_inputs), ref_inputs, grad.double())
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["global", "bigbird", "axial", "nystrom"])
def test_backends_train_the_same_function_through_either_backward(name, monkeypatch):
    """Under bf16 autocast a backend's output is the same with the fp32 backward as with the native one (the
    forward kernel does not change), and its input gradient agrees within bf16 rounding."""
    from conftest import make_attention

    from vitzoo.ops import dispatch

    torch.manual_seed(0)
    attn = make_attention(name, (8, 8), 1, dim=32, heads=4).train()
    x = torch.randn(2, 65, 32)

    def step(amp=True):
        xg = x.clone().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16, enabled=amp):
            out = attn(xg, (8, 8))
        out.float().pow(2).sum().backward()
        return out.detach(), xg.grad

    calls = []
    monkeypatch.setattr(dispatch.sdpa_ops, "_BACKWARD", lambda *a, **kw: calls.append(a[1].dtype) or BACKWARD(*a, **kw))
    fast = step()
    assert torch.float32 in calls  # the fp32 kernel ran
    monkeypatch.setattr(dispatch.sdpa_ops, "FP32_BACKWARD_KEYS", 0)
    native = step()
    assert torch.equal(fast[0], native[0])
    attn.double()
    x = x.double()
    exact = step(amp=False)[1]  # fp64, no autocast
    scale = exact.abs().max()
    err_fast, err_native = ((g.double() - exact).abs().max() / scale for g in (fast[1], native[1]))
    assert err_fast < 0.05 and err_native < 0.05


BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
