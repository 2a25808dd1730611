"""EViT's keep-rate warm-up in training: the schedule callback changes the tokens a training step runs, from the
global step, and a resumed fit goes on where its checkpoint stopped."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

from vitzoo.data.datamodules import DigitsDataModule
from vitzoo.training import VitModule
from vitzoo.training.token_schedule import training_epochs

pytestmark = pytest.mark.usefixtures("one_thread")
BATCHES = 3  # training batches per epoch (limit_train_batches)
EVIT = {"name": "evit", "locations": [0], "keep_rate": 0.5, "warmup_epochs": 2}


def expected_tokens(step: int) -> int:
    """Tokens after block 0 at a step, from EViT's warm-up written out: 1 + kept + one fused token."""
    epoch = step / BATCHES
    rate = 0.5 if epoch >= 2 else 0.5 + 0.5 * (1 + math.cos(math.pi * epoch / 2)) / 2
    kept = math.ceil(rate * 64)
    return 1 + kept + (kept < 64)


def fit(epochs: int, module: VitModule = None, ckpt_path=None, root=None) -> tuple[VitModule, list[int], pl.Trainer]:
    """A short digits fit of a one-block vit_cifar with EViT at block 0; the token counts of its training steps."""
    torch.manual_seed(0)
    dm = DigitsDataModule(name="digits", img_size=32, num_classes=10, batch_size=8, augment=False, flip=False)
    dm.setup("fit")
    module = module or VitModule(model={"name": "vit_cifar", "depth": 1, "embed_dim": 32, "num_heads": 2,
                                        "token_reduction": EVIT}, attention="global", data=dm.describe())
    seen = []
    module.net.norm.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].shape[1]) if module.net.training else None)
    trainer = pl.Trainer(max_epochs=epochs, limit_train_batches=BATCHES, limit_val_batches=1, accelerator="cpu",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, seen, trainer


def test_the_schedule_changes_the_tokens_of_each_training_step(tmp_path):
    module, seen, trainer = fit(3, root=tmp_path)
    assert seen == [expected_tokens(step) for step in range(3 * BATCHES)]
    assert seen[:4] == [65, 64, 58, 50] and seen[-3:] == [34, 34, 34]  # 1 -> 0.5 over 2 epochs of 3 steps
    assert trainer.global_step == 3 * BATCHES
    evaluated = []
    module.net.norm.register_forward_pre_hook(lambda m, args: evaluated.append(args[0].shape[1]))
    with torch.no_grad():
        module.net.eval()(torch.randn(1, 3, 32, 32))
    assert evaluated == [34]  # evaluation runs at the target keep rate


def test_a_resumed_fit_continues_the_schedule_from_the_global_step(tmp_path):
    _, first, trainer = fit(1, root=tmp_path)
    ckpt = tmp_path / "one_epoch.ckpt"
    trainer.save_checkpoint(ckpt)
    _, resumed, trainer = fit(3, ckpt_path=str(ckpt), root=tmp_path)
    assert first == [expected_tokens(step) for step in range(BATCHES)]
    assert resumed == [expected_tokens(step) for step in range(BATCHES, 3 * BATCHES)]  # not from step 0 again
    assert trainer.global_step == 3 * BATCHES


@pytest.mark.parametrize("batches,accumulate,step,epoch,expected", [
    (10, 1, 25, 2, 2.5), (5, 2, 6, 2, 2.0), (float("inf"), 1, 40, 3, 3.0),
])
def test_training_epochs_counts_optimizer_steps(batches, accumulate, step, epoch, expected):
    trainer = SimpleNamespace(num_training_batches=batches, accumulate_grad_batches=accumulate, global_step=step,
                              current_epoch=epoch)
    assert training_epochs(trainer) == expected
