"""The non-finite stop (:class:`vitzoo.training.resume.StopOnNonFinite`): a NaN gradient under a finite loss stops
training before the update, in one line naming the step and the first parameter whose gradient is non-finite,
and the last good checkpoint stays on disk; the name lookup itself (:func:`first_non_finite_grad`)."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_cfg
from torch import nn

from vitzoo.training import VitModule, train
from vitzoo.training.resume import TrainingDiverged, first_non_finite_grad

STEPS_PER_EPOCH = 4
TINY = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2", "data.batch_size=32",
        f"trainer.limit_train_batches={STEPS_PER_EPOCH}", "trainer.limit_val_batches=2", "trainer.max_epochs=3",
        "trainer.log_every_n_steps=1", "trainer.deterministic=true", "trainer.enable_progress_bar=false",
        "callbacks.rich_progress_bar=null", "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1",
        "callbacks.model_checkpoint.every_n_train_steps=2"]


def test_first_non_finite_grad_names_the_first_bad_parameter():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    assert first_non_finite_grad(model) is None  # no gradients yet
    model(torch.ones(1, 3)).sum().backward()
    assert first_non_finite_grad(model) is None
    model[1].bias.grad[0] = float("inf")
    model[1].weight.grad[2, 1] = float("nan")
    assert first_non_finite_grad(model) == "1.weight"
    model[1].weight.grad.fill_(3e38)  # huge but finite: no overflow in the check
    assert first_non_finite_grad(model) == "1.bias"


def test_nan_gradient_with_finite_loss_stops_naming_the_parameter(tmp_path, monkeypatch):
    step = VitModule.training_step

    def nan_grad_step(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        if self.global_step == 5:
            p = self.net.head.weight  # value 0, gradient 0·∞ = NaN: the loss stays finite
            loss = loss + 0 * (p - p.detach()).abs().sqrt().sum()
        return loss

    monkeypatch.setattr(VitModule, "training_step", nan_grad_step)
    with pytest.raises(
        TrainingDiverged,
        match=r"the gradient of net\.head\.weight is not finite at step 5 \(epoch 1\); stopped before the update, "
        r"last good checkpoint: .*last.ckpt; lower optim.lr",
    ) as err:
        train(compose_cfg(TINY, tmp_path))
    assert "\n" not in str(err.value)
    kept = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert kept["global_step"] == 4 and all(torch.isfinite(t).all() for t in kept["state_dict"].values())
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"
