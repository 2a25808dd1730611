"""Preprocessing belongs to the model: eval uses the checkpoint's mean/std/img_size whatever data group is chosen."""
from __future__ import annotations

from conftest import CONFIGS
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from vitzoo.training.evaluate import data_config

SAVED = {"name": "imagefolder", "img_size": 32, "mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616],
         "classes": [str(i) for i in range(10)]}
CKPT = {"hyper_parameters": {"model": {"name": "vit_cifar", "img_size": 32, "num_classes": 10}, "attention": None,
                             "optim": {}, "data": SAVED},
        "config": {"data": {"_target_": "vitzoo.data.datamodules.ImageFolderDataModule", "name": "imagefolder",
                            "root": "/x", "img_size": 32, "mean": SAVED["mean"], "std": SAVED["std"]}}}


def eval_cfg(overrides):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("eval", overrides=["ckpt_path=x.ckpt", *overrides])
    with open_dict(cfg):
        cfg.hydra = {"overrides": {"task": ["ckpt_path=x.ckpt", *overrides]}}  # what Hydra records for the run
    return cfg


def test_another_data_group_keeps_the_models_normalisation(tmp_path):
    data = data_config(eval_cfg(["data=imagefolder", f"data.root={tmp_path}"]), CKPT)
    assert str(data.root) == str(tmp_path)  # the images come from the chosen group
    assert list(data.mean) == SAVED["mean"] and list(data.std) == SAVED["std"]  # not imagefolder's ImageNet values
    assert data.img_size == 32


def test_an_explicit_different_value_wins_with_a_warning(tmp_path, capsys):
    data = data_config(eval_cfg(["data=imagefolder", f"data.root={tmp_path}", "data.mean=[0.5,0.5,0.5]"]), CKPT)
    assert list(data.mean) == [0.5, 0.5, 0.5] and list(data.std) == SAVED["std"]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "data.mean=[0.5, 0.5, 0.5] differs from the checkpoint's" in lines[0]


def test_the_checkpoints_own_data_is_unchanged_and_silent(capsys):
    data = data_config(eval_cfg([]), CKPT)
    assert list(data.mean) == SAVED["mean"] and data.root == "/x"
    assert "warning" not in capsys.readouterr().out


def test_an_export_carries_its_preprocessing(tmp_path):
    import torch
    from PIL import Image

    import vitzoo
    from vitzoo.export import export_model, preprocess

    net = vitzoo.create_model("vit_cifar", depth=1, embed_dim=32, num_heads=2, num_classes=10)
    export_model(net, tmp_path, data=SAVED)
    x = preprocess(vitzoo.load_model(tmp_path))(Image.new("RGB", (64, 64), (255, 0, 0)))
    assert x.shape == (3, 32, 32)
    expected = (torch.tensor([1.0, 0.0, 0.0]) - torch.tensor(SAVED["mean"])) / torch.tensor(SAVED["std"])
    torch.testing.assert_close(x[:, 0, 0], expected, rtol=0, atol=1e-5)
