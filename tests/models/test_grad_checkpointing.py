"""model.grad_checkpointing: the same loss, gradients and model state as without it, and far fewer saved bytes."""
from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg
from omegaconf import OmegaConf

import vitzoo
from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.registry import ConfigError
from vitzoo.training.cli import add_model_fields


def train_step(name: str, attention: str, checkpointing: bool):
    """Loss, parameter gradients and buffers after one training forward/backward (dropout and stochastic depth on)."""
    torch.manual_seed(0)
    model = vitzoo.create_model(name, num_classes=10, attention=attention, drop_rate=0.1, drop_path_rate=0.5)
    model.set_grad_checkpointing(checkpointing)
    model.train()
    vitzoo.attention.before_train_step(model)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # dropout, stochastic depth and reformer's rotations draw from here
    loss = model(x).logsumexp(-1).sum()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return loss.detach(), grads, dict(model.named_buffers())


@pytest.mark.parametrize(
    "name,attention",
    [
        ("vit_cifar", "global"),
        ("vit_cifar", "window"),
        ("vit_cifar", "performer"),
        ("vit_cifar", "reformer"),  # fresh random rotations in every training forward: the rerun must draw them again
        ("vit_cifar", "routing"),  # k-means centroids updated in forward: the rerun must see the old ones, once
        ("vit_cifar", "relu_linear"),  # a BatchNorm: running statistics updated once per step
        ("swin_cifar", "window"),
        ("swin_cifar", "global"),
        ("swin_cifar", "reformer"),
    ],
)
def test_checkpointing_keeps_loss_gradients_and_state(name, attention):
    loss, grads, buffers = train_step(name, attention, False)
    loss_ck, grads_ck, buffers_ck = train_step(name, attention, True)
    assert torch.equal(loss, loss_ck)
    assert grads.keys() == grads_ck.keys()
    for n, g in grads.items():
        assert g is not None and torch.equal(g, grads_ck[n]), n
    for n, b in buffers.items():
        assert torch.equal(b, buffers_ck[n]), n


def test_without_its_guards_the_rerun_differs(monkeypatch):
    """The test above can fail: a rerun with fresh random numbers changes the gradients, and one that updates
    the centroids again (or reads the updated ones) changes the model's state."""
    import vitzoo.layers.checkpointing as ck

    _, grads, _ = train_step("vit_cifar", "reformer", False)
    _, _, buffers = train_step("vit_cifar", "routing", False)
    real = ck.checkpoint
    monkeypatch.setattr(ck, "checkpoint", lambda *a, **k: real(*a, **k, preserve_rng_state=False))
    _, grads_fresh, _ = train_step("vit_cifar", "reformer", True)
    assert not all(torch.equal(g, grads_fresh[n]) for n, g in grads.items())
    monkeypatch.setattr(ck, "checkpoint", real)
    monkeypatch.setattr(ck._Replay, "__call__", lambda self, *args: self.block(*args))
    _, _, buffers_twice = train_step("vit_cifar", "routing", True)
    assert not torch.equal(buffers["blocks.0.attn.centroids"], buffers_twice["blocks.0.attn.centroids"])


def test_switches_and_config():
    vit = vitzoo.create_model("vit_cifar", num_classes=10)
    swin = vitzoo.create_model("swin_cifar", num_classes=10, grad_checkpointing=True)
    assert vit.grad_checkpointing is False and swin.grad_checkpointing is True
    assert all(stage.grad_checkpointing for stage in swin.stages)
    vit.set_grad_checkpointing()
    swin.set_grad_checkpointing(False)
    assert vit.grad_checkpointing and vit.cfg.grad_checkpointing
    assert not swin.cfg.grad_checkpointing and not any(stage.grad_checkpointing for stage in swin.stages)
    for name in ("vit_cifar", "swin_cifar"):
        with pytest.raises(ConfigError, match="model.grad_checkpointing"):
            vitzoo.create_model(name, num_classes=10, grad_checkpointing="yes")


@pytest.mark.parametrize("name", ["vit_cifar", "swin_cifar"])
def test_hydra_option_reaches_the_model(name):
    cfg = compose_cfg(add_model_fields([f"model={name}", "model.grad_checkpointing=true"]))  # as the CLI: no "+"
    options = OmegaConf.to_container(cfg.model, resolve=True)
    options.pop("pretrained")
    model = vitzoo.create_model(options.pop("name"), **options)
    assert model.grad_checkpointing is True


def saved_bytes(model, checkpointing: bool, train: bool = True) -> int:
    model.set_grad_checkpointing(checkpointing)
    model.train(train)
    x = torch.randn(1, 3, model.cfg.img_size, model.cfg.img_size, device="meta")
    with SavedTensorCounter(model) as c:
        loss = model(x).sum()
    assert loss.requires_grad  # held until here: its graph holds what is counted
    return c.activation_bytes


def test_checkpointing_cuts_vit_small_activations_at_1024_tokens_on_meta():
    model = vitzoo.create_model("vit_small", img_size=512).to("meta")  # patch 16: a 32x32 grid + class token
    plain, checkpointed = saved_bytes(model, False), saved_bytes(model, True)
    assert plain >= 2 * checkpointed
    # what a checkpointed block keeps is its input, which the counter sees
    assert checkpointed >= 12 * 1025 * 384 * 4
    assert saved_bytes(model, True, train=False) == saved_bytes(model, False, train=False)  # eval: no checkpoints
