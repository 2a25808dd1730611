"""The predicted training-step memory that results.json reports beside the measured peak."""
from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.costs import saved_bytes
from vitzoo.measure.predicted import MIB, amp_dtype, optimizer_state_bytes, predicted_memory

SMALL = dict(depth=1, embed_dim=32, num_heads=2)


@pytest.mark.parametrize("precision,dtype", [("32-true", None), ("bf16-mixed", torch.bfloat16),
                                             ("16-mixed", torch.float16), (None, None)])
def test_amp_dtype_of_lightning_precisions(precision, dtype):
    assert amp_dtype(precision) == dtype


def test_predicted_peak_adds_parameters_gradients_adamw_state_and_activations():
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)
    params = sum(p.numel() for p in model.parameters())
    out = predicted_memory(model, 8, torch.bfloat16)
    activations = saved_bytes(model.memory(8, torch.bfloat16))
    assert out["predicted_activation_bytes"] == activations > 0
    assert out["predicted_peak_mb"] * MIB == 4 * params + 4 * params + 8 * params + activations


def test_an_optimizer_state_is_counted_as_it_is():
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    sgd.step()
    params = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(sgd) == 4 * params  # one fp32 momentum buffer per parameter
    out = predicted_memory(model, 2, optimizer=sgd)
    assert out["predicted_peak_mb"] * MIB == 12 * params + saved_bytes(model.memory(2))


def test_a_backend_without_a_formula_predicts_nothing(monkeypatch):
    model = vitzoo.create_model("vit_cifar", attention="global", **SMALL)

    def missing(*args, **kwargs):
        raise NotImplementedError

    monkeypatch.setattr(model.blocks[0].attn, "memory", missing)
    assert predicted_memory(model, 2) == {"predicted_activation_bytes": None, "predicted_peak_mb": None}
