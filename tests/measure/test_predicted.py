"""The predicted training-step memory that results.json reports beside the measured peak."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import vitzoo
from vitzoo.attention.linear.relu_linear import blocked_weight_grad
from vitzoo.bench.memory_rows import predicted_row
from vitzoo.costs import Saved, saved_bytes
from vitzoo.measure.predicted import (
    MIB,
    amp_dtype,
    backward_peak,
    held_peak_bytes,
    largest_transient,
    optimizer_state_bytes,
    predicted_memory,
    segment,
    step_temporaries,
)

SMALL = dict(depth=1, embed_dim=32, num_heads=2)


@pytest.mark.parametrize("precision,dtype", [("32-true", None), ("bf16-mixed", torch.bfloat16),
                                             ("16-mixed", torch.float16), (None, None)])
def test_amp_dtype_of_lightning_precisions(precision, dtype):
    assert amp_dtype(precision) == dtype


def brute_force_peak(activations, gradients):
    """Every moment of a backward from the last position to the first, and the forward's end, summed directly."""
    moments = [sum(activations)]
    for b in range(len(activations)):
        moments.append(sum(activations[:b + 1]) + sum(gradients[b:]))
    return max(moments)


@pytest.mark.parametrize("activations,gradients,peak", [
    ([1, 1], [10, 10], 21),  # gradients outweigh activations: at the first block, every gradient and its activations
    ([10, 10], [1, 1], 21),  # activations outweigh gradients: at the last block, every activation and its gradients
    ([5, 0, 5], [0, 0, 0], 10),  # no gradients: the forward's end
])
def test_backward_peak_of_hand_built_blocks(activations, gradients, peak):
    assert backward_peak(activations, gradients) == brute_force_peak(activations, gradients) == peak
    assert peak < sum(activations) + sum(gradients) or not any(gradients)


def test_backward_peak_equals_the_brute_force_on_every_small_case():
    for n in (1, 2, 3):
        for acts in itertools.product((0, 1, 7), repeat=n):
            for grads in itertools.product((0, 2, 9), repeat=n):
                assert backward_peak(acts, grads) == brute_force_peak(acts, grads), (acts, grads)


class TwoBlocks(nn.Module):
    """A stem parameter of the model itself, a patch embedding, two blocks and a head, in forward order."""

    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(10))  # 40 B, with the stem
        self.patch_embed = nn.Linear(10, 10)  # 440 B
        self.blocks = nn.ModuleList(nn.Linear(100, 100, bias=False) for _ in range(2))  # 40,000 B each
        self.head = nn.Linear(10, 2)  # 88 B


@pytest.mark.parametrize("act_scale,phase", [(1, "optimizer step"), (10_000, "backward")])
def test_held_peak_places_items_and_gradients_by_name_in_module_order(act_scale, phase):
    model = TwoBlocks()
    items = [Saved("patch_embed: input", 3 * act_scale, 4), Saved("blocks.0.attn: qkv input", 5 * act_scale, 4),
             Saved("blocks.1: drop-path mask", 7 * act_scale, 4), Saved("blocks.1.mlp: fc1 input", 1 * act_scale, 4),
             Saved("head input", 2 * act_scale, 4)]
    acts = [0, 12 * act_scale, 20 * act_scale, 32 * act_scale, 8 * act_scale]  # root, patch_embed, blocks.0/1, head
    grads = [40, 440, 40_000, 40_000, 88]
    backward = brute_force_peak(acts, grads) + 28 * act_scale  # + the largest transient: the mask's gradient
    step = sum(grads) + 2 * 40_000  # every gradient + AdamW's two temporaries of the largest parameter (for-loop)
    assert held_peak_bytes(model, items) == max(backward, step) == (step if phase == "optimizer step" else backward)
    assert [segment(n) for n in ("blocks.1.mlp: fc1 input", "stages.2.blocks.10.attn: q", "stages.0.downsample.norm",
                                 "head input", "patch_embed.proj.weight")] == [
        "blocks.1", "stages.2.blocks.10", "stages.0.downsample", "head", "patch_embed"]


def test_adamw_step_temporaries_follow_its_implementation():
    model = TwoBlocks()
    every = sum(p.numel() * 4 for p in model.parameters())
    assert step_temporaries(model) == 2 * 40_000  # CPU parameters: the for-loop step, two of the largest
    assert step_temporaries(model, torch.optim.AdamW(model.parameters(), foreach=True)) == every
    assert step_temporaries(model, torch.optim.AdamW(model.parameters(), foreach=False)) == 2 * 40_000


def test_predicted_peak_adds_parameters_adamw_state_and_the_held_activations_and_gradients():
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)
    params = sum(p.numel() for p in model.parameters())
    out = predicted_memory(model, 8, torch.bfloat16)
    items = model.memory(8, torch.bfloat16)
    activations = saved_bytes(items)
    assert out["predicted_activation_bytes"] == activations > 0
    held = held_peak_bytes(model, items)
    assert activations + largest_transient(items) <= held
    assert out["predicted_peak_mb"] * MIB == 4 * params + 8 * params + held


def test_predicted_row_sums_its_terms_with_the_held_part():
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(2, 3, 32, 32)
    nn.functional.cross_entropy(model(x), torch.tensor([0, 1])).backward()
    opt.step()
    row = predicted_row(model, opt, (x,), 2, False)
    items = model.memory(2)
    assert row["predicted_held_mb"] * MIB == held_peak_bytes(model, items)
    assert row["predicted_transient_mb"] * MIB == largest_transient(items)
    assert row["predicted_peak_mb"] == pytest.approx(sum(row[k] for k in (
        "predicted_params_mb", "predicted_optimizer_mb", "predicted_input_mb", "predicted_held_mb")))
    assert row["predicted_activation_mb"] * MIB == saved_bytes(items)


def test_the_transient_of_an_entry_is_one_of_its_tensors_and_its_ops_workspace():
    assert Saved("35 iteration matrices", 35 * 100, 4, count=35).transient == 400
    assert Saved("conv input", 100, 4, workspace=1000).transient == 1400
    nystrom = vitzoo.create_model("swin_cifar", attention="nystrom", img_size=16)
    items = nystrom.memory(16)
    matrices = max((i for i in items if "iteration matrices" in i.name), key=lambda i: i.nbytes)
    assert largest_transient(items) < matrices.nbytes  # no entry's transient is the sum of its tensors
    # relu_linear's depthwise 5×5 over q|k|v (3C channels, a channels-last input): oneDNN's weight gradient with
    # each channel padded to a 16×16 block; swin_cifar's last stage has C = 256
    assert blocked_weight_grad(16, 768, 1, 1, 5) == 768 * 256 * 25 * 4
    relu = vitzoo.create_model("swin_cifar", attention="relu_linear", img_size=16)
    assert largest_transient(relu.memory(16)) > blocked_weight_grad(16, 768, 1, 1, 5)
    assert largest_transient(relu.memory(1)) < blocked_weight_grad(16, 768, 1, 1, 5)  # batch 1: the plain layout


def test_an_optimizer_state_is_counted_as_it_is():
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    sgd.step()
    params = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(sgd) == 4 * params  # one fp32 momentum buffer per parameter
    out = predicted_memory(model, 2, optimizer=sgd)
    assert out["predicted_peak_mb"] * MIB == 8 * params + held_peak_bytes(model, model.memory(2))


def test_a_backend_without_a_formula_predicts_nothing(monkeypatch):
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)

    def missing(*args, **kwargs):
        raise NotImplementedError

    monkeypatch.setattr(model.blocks[0].attn, "memory", missing)
    assert predicted_memory(model, 2) == {"predicted_activation_bytes": None, "predicted_peak_mb": None}
