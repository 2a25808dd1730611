"""Flip test-time augmentation and the optimiser option: the TTA top-1 against a plain computation, the results
file and record carrying it beside the plain top-1, and timm's optimisers by name."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import compose_cfg
from pytorch_lightning.plugins.precision import Precision

from vitzoo.registry import ConfigError
from vitzoo.training import train
from vitzoo.training.module import VitModule
from vitzoo.training.tta import FlipTTA

TINY = dict(name="vit_cifar", depth=1, embed_dim=32, num_heads=2, num_classes=3, img_size=16)
QUIET = ["trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null", "trainer.num_sanity_val_steps=0",
         "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1", "export=false",
         "+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2", "trainer.max_epochs=2",
         "trainer.limit_train_batches=2", "trainer.limit_val_batches=2"]


def test_flip_tta_is_the_top1_of_the_mean_of_both_views():
    torch.manual_seed(0)
    module = VitModule(model=TINY).eval()
    tta = FlipTTA()
    trainer = SimpleNamespace(precision_plugin=Precision())
    tta.on_validation_epoch_start(trainer, module)
    xs, ys = torch.randn(2, 5, 3, 16, 16), torch.randint(0, 3, (2, 5))
    for i in range(2):
        tta.on_validation_batch_end(trainer, module, None, (xs[i], ys[i]), i)
    correct = 0
    with torch.no_grad():
        for x, y in zip(xs, ys):
            for img, label in zip(x, y):  # one image at a time, the mirror built by indexing
                both = module.net(img[None]) + module.net(img[None, :, :, torch.arange(15, -1, -1)])
                correct += int(both.argmax() == label)
    assert tta.metric.compute().item() == pytest.approx(correct / 10)


def test_a_run_with_tta_reports_both_top1_values(tmp_path):
    cfg = compose_cfg([*QUIET, "+callbacks.flip_tta._target_=vitzoo.training.tta.FlipTTA", "optim.opt=lion",
                       f"record_dir={tmp_path / 'records'}"], tmp_path / "run")
    results = train(cfg)
    assert 0 <= results["best_val_acc"] <= 1 and 0 <= results["best_val_acc_tta"] <= 1
    record = json.loads(next((tmp_path / "records").rglob("seed0.json")).read_text())
    assert record["top1_tta"] == results["best_val_acc_tta"] and record["top1"] == results["best_val_acc"]
    curve, curve_tta = results["val_acc_per_epoch"], results["val_acc_tta_per_epoch"]
    assert len(curve) == len(curve_tta) == 2 and record["top1_per_epoch"] == curve
    assert results["best_val_acc"] == pytest.approx(max(curve), abs=1e-6)  # the best epoch's weights, evaluated again
    assert results["best_val_acc_tta"] == pytest.approx(curve_tta[curve.index(max(curve))], abs=1e-6)


def test_without_tta_the_field_is_empty(tmp_path):
    results = train(compose_cfg(QUIET, tmp_path / "run"))
    assert results["best_val_acc_tta"] is None and results["val_acc_tta_per_epoch"] is None
    assert len(results["val_acc_per_epoch"]) == 2


def test_unknown_optimiser_names_the_option():
    module = VitModule(model=TINY, optim={"opt": "adamz"})
    module.trainer = SimpleNamespace(estimated_stepping_batches=10, max_epochs=1)
    with pytest.raises(ConfigError, match=r"optim\.opt='adamz'"):
        VitModule.configure_optimizers(module)
