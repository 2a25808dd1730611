"""The saved-tensor counter (vitzoo.measure.activations) against hand-computed bytes, and CPU against meta."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import vitzoo
from vitzoo.measure.activations import OUTSIDE, SavedTensorCounter

F32, BF16 = 4, 2  # bytes per element


def test_linear_saves_its_input_as_activation_and_its_weight_as_parameter():
    lin = nn.Linear(8, 3)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter(lin) as c:
        y = lin(x)
    assert c.activation_bytes == 4 * 8 * F32  # the input, for the weight's gradient
    assert c.parameter_bytes == 3 * 8 * F32  # the weight (a transposed view of it), for the input's gradient
    assert c.buffer_bytes == 0 and c.cast_bytes == 0
    assert c.per_module() == {"": 4 * 8 * F32}
    y.sum().backward()  # the hooks hand the tensors back unchanged
    assert torch.allclose(x.grad, lin.weight.sum(0).expand(4, 8))


def test_a_storage_saved_through_views_counts_once():
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter() as c:
        a = x.exp()  # saves its output a
        a.view(32).sin()  # saves a view of a
        a[:2].cos()  # saves a slice of a
    assert c.activation_bytes == 4 * 8 * F32
    assert len(c.records) == 1 and c.per_module() == {OUTSIDE: 4 * 8 * F32}


def test_a_view_keeps_its_whole_storage():
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter() as c:
        y = x.exp()[:1].sin()  # only row 0 is saved by sin, but the storage of all 4 rows stays alive
    assert c.activation_bytes == 4 * 8 * F32 and y.requires_grad


def test_autocast_linear_saves_bf16_copies_and_names_the_weight_cast():
    lin = nn.Linear(8, 3)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter(lin) as c, torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    assert c.activation_bytes == 4 * 8 * BF16 + 3 * 8 * BF16  # bf16 input and bf16 copy of the weight
    assert c.cast_bytes == 3 * 8 * BF16
    assert c.parameter_bytes == 0  # the fp32 weight itself is not kept


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.register_buffer("shift", torch.zeros(8))

    def forward(self, x):
        return (x * self.scale[None]) * self.shift  # saves x and a view of scale, then the buffer (for the product)


def test_parameters_and_buffers_are_counted_apart_from_activations():
    m = Scale()
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter(m) as c:
        y = m(x)
    assert y.requires_grad
    assert c.parameter_bytes == 8 * F32  # scale[None], a view of the parameter
    assert c.buffer_bytes == 8 * F32  # shift
    assert c.activation_bytes == 4 * 8 * F32  # x; x·scale is not kept (shift needs no gradient)
    assert {r.kind for r in c.records} == {"activation", "parameter", "buffer"}


def test_modules_name_what_they_save_and_the_hooks_go_away():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    with SavedTensorCounter(m) as c:
        loss = m(x).logsumexp(-1).sum()
    # 0 keeps its input (for its weight's gradient; the input needs none, so the weight is not kept); ReLU its
    # output, which 2 keeps as well (counted once, under ReLU) with its weight; logsumexp its input and output
    assert c.per_module() == {"0": 4 * 8 * F32, "1": 4 * 16 * F32, OUTSIDE: 4 * 2 * F32 + 4 * F32}
    assert c.per_module("parameter") == {"2": 2 * 16 * F32}
    assert "| 0 | 128 | 0 | 0 | 1 |" in c.table() and c.table().splitlines()[-1].startswith("| total | 432 | 128 |")
    with pytest.raises(ValueError, match="kind"):
        c.per_module("gradient")
    assert not m[0]._forward_hooks and not m[0]._forward_pre_hooks
    with SavedTensorCounter(m) as c2:
        pass
    loss.backward()
    assert c2.records == []


def test_storages_of_a_dropped_graph_are_freed_bytes_even_at_a_reused_address():
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorCounter() as c:
        for _ in range(3):
            x.exp().sin()  # exp and sin save exp's output, dropped with the graph (the next one may reuse it)
        y = x.cos()  # saves x, which the caller holds
    assert c.activation_bytes == 4 * 8 * F32 and y.requires_grad
    assert c.freed_bytes == 3 * 4 * 8 * F32
    assert [r.freed for r in c.records] == [True, True, True, False]


def test_nothing_is_saved_without_gradients():
    m = nn.Linear(8, 3)
    with torch.no_grad(), SavedTensorCounter(m) as c:
        m(torch.randn(4, 8))
    assert c.activation_bytes == c.parameter_bytes == 0


def count(model: nn.Module, device: str, batch: int = 2) -> SavedTensorCounter:
    model = model.to(device).train()
    x = torch.randn(batch, 3, model.cfg.img_size, model.cfg.img_size, device=device)
    with SavedTensorCounter(model) as c:
        loss = model(x).sum()
    assert loss.requires_grad  # held until here: its graph holds what is counted
    return c


def test_vit_cifar_counts_the_same_on_cpu_and_on_meta():
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", num_classes=10)
    cpu = count(model, "cpu")
    meta = count(model, "meta")
    assert cpu.activation_bytes > 0
    assert meta.activation_bytes == cpu.activation_bytes
    # kept weights: patch conv, both norms' weight and bias, q/k/v, proj, fc1, fc2 per block, final norm, head
    C, hidden = 192, 384
    block = 4 * C + C * 3 * C + C * C + 2 * C * hidden
    assert meta.parameter_bytes == cpu.parameter_bytes == (C * 3 * 4 * 4 + 6 * block + 2 * C + C * 10) * F32
    assert meta.per_module() == cpu.per_module()
    # every block saves the same; the attention (fused kernel on both) keeps q, k, v, output and row sums
    n, h = 65, 3
    assert cpu.per_module()["blocks.0.attn"] == 2 * (3 * n * C + n * C + h * n) * F32
