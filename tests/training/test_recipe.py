"""The CIFAR recipe end to end on tiny settings: cached uint8 images augmented after the device transfer, mixup/CutMix,
EMA and a warm-up that is a share of the run; the long-sequence experiment; a sweep that resumes across sittings."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT
from helpers import compose_cfg, image_folder, run_entry

from vitzoo.training import OptimConfig, evaluate, train
from vitzoo.training.module import warmup_steps

TINY_VIT = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2"]
QUIET = ["trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null", "trainer.num_sanity_val_steps=0",
         "trainer.log_every_n_steps=1", "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1"]
# three classes of solid-colour 32×32 images under <root>/train (image_folder)
FOLDER = dict(classes=("cat", "dog", "frog"), size=32, split="train", colour_steps=(80, 25))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_warmup_is_a_share_of_the_run():
    assert warmup_steps(OptimConfig(warmup_fraction=0.05), 1000, 3) == 50
    assert warmup_steps(OptimConfig(warmup_epochs=5), 1000, 3) == 500  # the old clip: half of a short run
    assert warmup_steps(OptimConfig(warmup_epochs=1), 1000, 10) == 100


def test_cifar10_vit_recipe_trains_with_device_augment_mixup_and_ema(tmp_path):
    data = image_folder(tmp_path / "data", per_class=8, **FOLDER)
    cfg = compose_cfg(
        [
            "experiment=cifar10_vit",
            *TINY_VIT,
            *QUIET,
            f"data.root={data}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.batch_size=4",
            "data.val_fraction=0.25",
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=3",
            "optim.mixup_alpha=0.8",
            "optim.cutmix_alpha=1.0",
            "callbacks.ema={_target_:vitzoo.training.callbacks.EMA,decay:0.9}",
        ],
        tmp_path / "run",
    )
    assert cfg.data.device_augment and cfg.data.cache and cfg.optim.warmup_fraction == 0.05
    results = train(cfg)
    assert results["status"] == "finished" and results["epochs"] == 2
    # beside the measured peak (a live-memory delta: a model this small can measure 0 MB), the predicted one:
    # parameters, gradients, AdamW state and model.memory()'s bytes
    assert results["peak_memory_mb"] >= 0 and results["predicted_activation_bytes"] > 0
    assert results["predicted_peak_mb"] * 2**20 > results["predicted_activation_bytes"]
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1
    ckpt = torch.load(results["best_ckpt"], map_location="cpu", weights_only=True)
    assert "current_model_state" in ckpt  # the EMA callback: state_dict holds the average, this the raw weights
    raw, ema = ckpt["current_model_state"], ckpt["state_dict"]
    assert any(not torch.equal(raw[k], ema[k]) for k in ema if k.startswith("net."))

    report = evaluate(
        compose_cfg(
            [
                f"ckpt_path={results['best_ckpt']}",
                "benchmark.steps=1",
                "benchmark.batch_size=4",
                "trainer.enable_progress_bar=false",
            ],
            tmp_path / "eval",
            config="eval",
        )
    )
    assert report["num_val_images"] == 6 and report["preprocessing"]["mean"] == list(cfg.data.mean)


@pytest.mark.parametrize("model", ["vit_cifar_fast", "swin_cifar"])
def test_fast_recipe_trains_its_vit_and_a_swin_in_its_place(tmp_path, model):
    """experiment=cifar10_fast (through zoo_cifar10, as the ranking runs it): the ViT preset's stem, pooling and
    position embeddings reach the model; model=swin_cifar replaces the preset whole and trains with the same
    data and optimiser; the record names the experiment and holds the per-epoch curve."""
    data = image_folder(tmp_path / "data", per_class=8, **FOLDER)
    tiny = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2"] if model != "swin_cifar" else [
        "+model.depths=[1]", "+model.num_heads=[2]", "+model.embed_dim=16", "+model.window_size=4"]
    cfg = compose_cfg(["experiment=zoo_cifar10", f"model={model}", *tiny, *QUIET, f"data.root={data}",
                       f"data.cache_dir={tmp_path / 'cache'}", "data.val_fraction=0.25", "trainer.max_epochs=2",
                       "trainer.limit_train_batches=2", f"record_dir={tmp_path / 'records'}"],
                      tmp_path / "run")
    results = train(cfg)
    assert results["status"] == "finished" and results["epochs"] == 2
    [record] = (tmp_path / "records").rglob("seed0.json")
    rec = json.loads(record.read_text())
    assert rec["experiment"] == "zoo_cifar10" and len(rec["top1_per_epoch"]) == 2 and rec["batch_size"] == 64
    net = torch.load(results["best_ckpt"], map_location="cpu", weights_only=True)["state_dict"]
    stem = [k for k in net if k.startswith("net.patch_embed.convs.")]
    assert bool(stem) == (model == "vit_cifar_fast")  # the conv stem only in the ViT preset


def test_mixup_with_an_odd_batch_fails_before_training(tmp_path):
    from vitzoo.registry import ConfigError

    cfg = compose_cfg([*TINY_VIT, *QUIET, "data.batch_size=5", "optim.mixup_alpha=0.8"], tmp_path)
    with pytest.raises(ConfigError, match=r"^optim.mixup_alpha/cutmix_alpha need an even data.batch_size \(got 5\)$"):
        train(cfg)
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_cifar10_pixels_smoke(tmp_path):
    data = image_folder(tmp_path / "data", per_class=4, **FOLDER)
    cfg = compose_cfg(
        [
            "experiment=cifar10_pixels",
            "attention=linear",
            "model.depth=1",
            "model.embed_dim=16",
            "model.num_heads=2",
            *QUIET,
            f"data.root={data}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.batch_size=4",
            "data.val_fraction=0.25",
            "trainer.max_steps=2",
            "trainer.limit_val_batches=1",
        ],
        tmp_path / "run",
    )
    assert cfg.model.patch_size == 1
    results = train(cfg)
    assert results["status"] == "finished" and results["train_images_per_s"] and results["peak_memory_mb"] is not None


@pytest.mark.slow
def test_sweep_skips_finished_jobs_and_resumes_killed_ones(tmp_path):
    """A sweep folder with one finished job (fabricated results.json) and one killed job (a checkpoint after epoch 1,
    results.json still 'running') completes: the finished job is not trained again, the killed one resumes."""
    sweep = tmp_path / "sweep"
    common = [
        "experiment=zoo_digits",
        *TINY_VIT,
        *QUIET,
        "data.batch_size=32",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "trainer.max_epochs=2",
    ]
    finished = sweep / "0_vit_cifar_global"
    finished.mkdir(parents=True)
    fabricated = {
        "status": "finished",
        "best_val_acc": 0.5,
        "attention": "global",
        "model": "vit_cifar",
        "data": "digits",
        "fabricated": True,
    }
    (finished / "results.json").write_text(json.dumps(fabricated))
    killed = sweep / "1_vit_cifar_linear"
    train(compose_cfg([*common, "attention=linear", "trainer.max_epochs=1"], killed))  # epoch 1 and its last.ckpt
    status = json.loads((killed / "results.json").read_text())
    (killed / "results.json").write_text(json.dumps({**status, "status": "running"}))  # what a SIGKILL leaves

    proc = run_entry(
        "train.py", "-m", *common, "attention=global,linear", "ckpt_path=auto", "skip_finished=true",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((finished / "results.json").read_text()) == fabricated  # not trained again
    assert not (finished / "checkpoints").exists()
    resumed = json.loads((killed / "results.json").read_text())
    assert resumed["status"] == "finished" and resumed["previous_status"] == "interrupted"
    assert resumed["resumed_from"].endswith("last.ckpt") and resumed["epochs"] == 2
    assert "skip_finished" in proc.stdout + proc.stderr


def test_data_speed_smoke(tmp_path):
    from vitzoo.bench.data_speed import measure

    data = image_folder(tmp_path / "data", per_class=4, **FOLDER)
    overrides = [
        f"data.root={data}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.batch_size=4",
        "data.val_fraction=0.25",
        *TINY_VIT,
    ]
    result = measure("cifar10_vit", overrides, blocks=2, steps=1, warmup=1, device="cpu")
    assert result.batch_size == 4 and result.device == "cpu"
    assert result.pipeline_images_per_s > 0 and result.tensor_images_per_s > 0 and result.ratio > 0


def script_sweeps():
    """The override lists of the ``python train.py -m`` commands in scripts/sweep_gpu.sh (GPU array expanded)."""
    import re
    import shlex

    text = (ROOT / "scripts" / "sweep_gpu.sh").read_text().replace("\\\n", " ")
    gpu = shlex.split(re.search(r"^GPU=\((.*)\)$", text, re.M).group(1))
    commands = [
        shlex.split(line.replace('"${GPU[@]}"', " ".join(gpu)))[3:]
        for line in text.splitlines()
        if line.startswith("python train.py -m")
    ]
    return [[a for a in c if not a.startswith("hydra.sweep.dir=")] for c in commands]


def test_gpu_script_sweeps_compose(tmp_path):
    sweeps = script_sweeps()
    assert [c[0] for c in sweeps] == ["experiment=zoo_cifar10", "experiment=cifar10_pixels"]
    for overrides in sweeps:
        cfg = compose_cfg([o.replace("attention=glob(*)", "attention=global") for o in overrides], tmp_path)
        assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
        assert cfg.ckpt_path == "auto" and cfg.skip_finished  # both sweeps resume across sittings
        assert cfg.trainer.max_steps > 0 or cfg.trainer.max_epochs > 0  # the same budget for every backend
