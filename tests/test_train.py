"""Training and evaluation end to end: a tiny run for every registered backend in ViT and Swin (loss goes
down, checkpoint and export reload to the same logits, eval on the checkpoint), bad input, entry points."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

import vitzoo
from conftest import CIFAR_ROOT, CONFIGS, ROOT
from vitzoo.registry import ConfigError
from vitzoo.training import VitModule, evaluate, fit, train

# 30 steps of a one/two-block model on one fixed batch (Lightning's overfit_batches, no augmentation): the loss
# must go down within them for any working backend. Digits tokens carry little content early in training,
# so a fixed batch and a high learning rate are what make 30 steps enough. Each run takes a few seconds.
# (`+`: configs/model/ holds only name, img_size, num_classes, drop_path_rate; the rest comes from the registry)
TINY_MODEL = {
    "vit_cifar": ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2"],
    "swin_cifar": ["+model.patch_size=4", "+model.depths=[2,1]", "+model.embed_dim=16", "+model.num_heads=[2,2]"],
}
FAST = ["data.batch_size=32", "data.augment=false", "trainer.overfit_batches=1", "trainer.max_epochs=30",
        "trainer.check_val_every_n_epoch=15", "trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null", "optim.lr=1e-2", "optim.warmup_epochs=5",
        "benchmark.batch_size=8", "benchmark.warmup=1", "benchmark.steps=2"]
ATTENTION = vitzoo.list_attention()
CASES = [(m, a) for m in TINY_MODEL for a in ATTENTION]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine it costs a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def compose_cfg(overrides, tmp_path, config="train"):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose(config, overrides=list(overrides))
    cfg.paths.output_dir = str(tmp_path)
    return cfg


def tiny(model="vit_cifar", attention="global", extra=()):
    return [f"model={model}", f"attention={attention}", *TINY_MODEL[model], *FAST, *extra]


def digits_batch(n=16):
    from vitzoo.training.data import DigitsDataModule

    dm = DigitsDataModule(name="digits", img_size=32, num_classes=10, flip=False)
    dm.setup()
    return torch.stack([dm.val_set[i][0] for i in range(n)])


@pytest.mark.parametrize("model,attention", CASES, ids=[f"{m}-{a}" for m, a in CASES])
def test_tiny_training_reload_export_and_eval(model, attention, tmp_path):
    if not (CONFIGS / "attention" / f"{attention}.yaml").is_file():
        pytest.skip(f"configs/attention/{attention}.yaml not written yet")
    results, module = fit(compose_cfg(tiny(model, attention), tmp_path))

    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["status"] == "finished" and on_disk["error"] is None
    assert (on_disk["model"], on_disk["attention"], on_disk["data"]) == (model, attention, "digits")
    assert 0 <= on_disk["best_val_acc"] <= on_disk["best_val_acc5"] <= 1
    assert on_disk["train_images_per_s"] > 0 and on_disk["infer_images_per_s"] > 0 and on_disk["epochs"] == 30
    assert on_disk["gmacs"] > 0 and on_disk["params"] == sum(p.numel() for p in module.net.parameters())

    log = pd.read_csv(tmp_path / "csv" / "metrics.csv")
    losses = log["train/loss_step"].dropna().to_numpy()
    assert len(losses) == 30 and losses[-5:].mean() < losses[:5].mean() - 0.02, f"loss did not go down: {losses}"
    lr = log.filter(like="lr-AdamW").iloc[:, 0].dropna().to_numpy()
    assert lr[0] < lr.max() and lr[-1] < lr.max()  # linear warm-up, then cosine decay
    assert log["train/images_per_s"].dropna().gt(0).all()

    x = digits_batch()
    expected = module.predict_logits(x)
    reloaded = VitModule.load_from_checkpoint(on_disk["best_ckpt"])  # no extra arguments
    torch.testing.assert_close(reloaded.predict_logits(x), expected, rtol=1e-5, atol=1e-5)
    exported = vitzoo.load_model(on_disk["export_dir"])
    assert not exported.training and exported.export_config["data"]["img_size"] == 32
    with torch.no_grad():
        torch.testing.assert_close(exported(x), expected, rtol=1e-5, atol=1e-5)
    ckpt = torch.load(on_disk["best_ckpt"], map_location="cpu", weights_only=True)
    assert ckpt["config"]["attention"]["name"] == attention  # resolved run config inside the checkpoint

    report = evaluate(compose_cfg([f"ckpt_path={on_disk['best_ckpt']}", "trainer.limit_val_batches=1",
                                   "trainer.enable_progress_bar=false", "benchmark.batch_size=8", "benchmark.warmup=1",
                                   "benchmark.steps=2"], tmp_path / "eval", config="eval"))
    assert report["val_acc"] == pytest.approx(on_disk["best_val_acc"], abs=1e-6)  # same weights, same 32 images
    assert report["val_loss"] == pytest.approx(on_disk["val_loss"], rel=1e-5)
    assert report["params"] == on_disk["params"] and report["gmacs"] == pytest.approx(on_disk["gmacs"])
    written = json.loads((tmp_path / "checkpoints" / (os.path.basename(on_disk["best_ckpt"])[:-5] + ".eval.json")).read_text())
    assert written["val_acc5"] == report["val_acc5"] and written["infer_images_per_s"] > 0


BAD = {
    "unknown attention": (["attention.name=bogus"], r"unknown attention 'bogus'; choose attention= one of: .*global"),
    "unknown attention option": (["+attention.bogus=1"], r"unknown option attention.bogus"),
    "backend option out of range": (["attention=window", "attention.window_size=0"], r"attention.window_size must be a positive"),
    "img not divisible by patch": (["model.img_size=30"], r"model.img_size \(30\) must be divisible by model.patch_size"),
    "dim not divisible by heads": (["model.num_heads=5"], r"model.embed_dim \(32\) must be divisible by model.num_heads \(5\)"),
    "unknown model option": (["+model.bogus=1"], r"unknown option model.bogus"),
    "unknown optim option": (["+optim.bogus=1"], r"^unknown option optim.bogus for OptimConfig"),
    "classes mismatch": (["model.num_classes=7"], r"model.num_classes=7 but the data has 10 classes"),
    "missing data folder": (["data=imagefolder", "data.root=/nonexistent/vitzoo"], r"data.root=/nonexistent/vitzoo has no train/"),
    "offline download": (["data=cifar10", "data.root=/nonexistent/vitzoo", "data.download=false"], r"data.root=.*data.download=true"),
    "missing resume checkpoint": (["ckpt_path=/nonexistent/x.ckpt"], r"ckpt_path=/nonexistent/x.ckpt does not exist"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_fails_before_training(name, tmp_path):
    overrides, pattern = BAD[name]
    with pytest.raises(ConfigError, match=pattern) as err:
        train(compose_cfg(tiny(extra=overrides), tmp_path))
    assert "\n" not in str(err.value)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == str(err.value)
    assert not (tmp_path / "checkpoints").exists()


def test_eval_rejects_bad_checkpoints(tmp_path):
    with pytest.raises(ConfigError, match="ckpt_path=.*does not exist"):
        evaluate(compose_cfg([f"ckpt_path={tmp_path / 'none.ckpt'}"], tmp_path, config="eval"))
    junk = tmp_path / "junk.ckpt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="ckpt_path=.*is not a checkpoint"):
        evaluate(compose_cfg([f"ckpt_path={junk}"], tmp_path, config="eval"))
    other = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(ConfigError, match="not a vitzoo training checkpoint"):
        evaluate(compose_cfg([f"ckpt_path={other}"], tmp_path, config="eval"))


@pytest.mark.skipif(not (CIFAR_ROOT / "train").is_dir(), reason=f"CIFAR-10 JPEGs not found at {CIFAR_ROOT} (env VITZOO_CIFAR10)")
def test_imagefolder_training_on_shared_cifar10(tmp_path):
    results = train(compose_cfg(tiny(extra=["data=imagefolder", f"data.root={CIFAR_ROOT}", "data.num_workers=0",
                                            "trainer.overfit_batches=0", "trainer.max_epochs=1",
                                            "trainer.limit_train_batches=4", "trainer.limit_val_batches=2"]), tmp_path))
    assert results["status"] == "finished" and results["data"] == "imagefolder" and results["epochs"] == 1


def run(script, *args, cwd=ROOT):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_entry_points_multirun_and_eval(tmp_path):
    """`train.py -m` with one good and one bad job: the sweep finishes both, records the failure, exits 1;
    then `eval.py` on the good job's checkpoint."""
    sweep = tmp_path / "sweep"
    args = [a for a in tiny() if not a.startswith("+model.num_heads")]
    proc = run("train.py", "-m", *args, "+model.num_heads=2,5", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert sorted(r["status"] for r in jobs.values()) == ["failed", "finished"], jobs
    bad = next(r for r in jobs.values() if r["status"] == "failed")
    assert "model.num_heads (5)" in bad["error"]
    assert "Traceback" not in proc.stderr and "error: model.embed_dim (32) must be divisible" in proc.stderr
    assert "1 of 2 jobs failed" in proc.stderr

    good = next(r for r in jobs.values() if r["status"] == "finished")
    proc = run("eval.py", f"ckpt_path={good['best_ckpt']}", f"hydra.run.dir={tmp_path / 'eval'}", "benchmark.steps=2",
               "trainer.enable_progress_bar=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(open(good["best_ckpt"][:-5] + ".eval.json").read())
    assert report["model"] == "vit_cifar" and 0 <= report["val_acc"] <= 1 and report["num_val_images"] == 180


def test_entry_point_single_run_error_is_one_line(tmp_path):
    proc = run("train.py", "model.img_size=30", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: model.img_size (30) must be divisible by model.patch_size (4)"
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"
