"""Training and evaluation end to end: a tiny run for every registered backend in ViT and Swin (loss goes
down, checkpoint and export reload to the same logits, eval on the checkpoint), bad input, entry points."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import CIFAR_ROOT, CONFIGS
from helpers import compose_cfg, run_entry

import vitzoo
from vitzoo.flops import count_flops
from vitzoo.layers.block import Block
from vitzoo.registry import ConfigError
from vitzoo.training import VitModule, evaluate, fit, train

# 30 steps of a one/two-block model on one fixed batch (Lightning's overfit_batches, no augmentation): the run,
# checkpoint, export and eval plumbing for every backend. A falling loss alone would not prove the attention
# works (the MLPs can memorise a batch), so the trained model is also checked to depend on its attention
# (gradients reach it, removing it changes the logits; in ViT the class token only sees the image through it).
# test_attention_is_what_learns_digits checks that global/window attention actually learn a held-out task.
# (`+`: configs/model/ holds only name, img_size, num_classes, drop_path_rate; the rest comes from the registry)
TINY_MODEL = {
    "vit_cifar": ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2"],
    "swin_cifar": ["+model.patch_size=4", "+model.depths=[2,1]", "+model.embed_dim=16", "+model.num_heads=[2,2]"],
}
FAST = [
    "data.batch_size=32",
    "data.augment=false",
    "trainer.overfit_batches=1",
    "trainer.max_epochs=30",
    "trainer.check_val_every_n_epoch=15",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "callbacks.rich_progress_bar=null",
    "optim.lr=1e-2",
    "optim.warmup_epochs=5",
    "benchmark.batch_size=8",
    "benchmark.warmup=1",
    "benchmark.steps=2",
]
ATTENTION = vitzoo.list_attention()
CASES = [(m, a) for m in TINY_MODEL for a in ATTENTION]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(model="vit_cifar", attention="global", extra=()):
    return [f"model={model}", f"attention={attention}", *TINY_MODEL[model], *FAST, *extra]


def digits_batch(n=16):
    from vitzoo.data.datamodules import DigitsDataModule

    dm = DigitsDataModule(name="digits", img_size=32, num_classes=10, flip=False)
    dm.setup()
    return torch.stack([dm.val_set[i][0] for i in range(n)])


@pytest.mark.slow
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
    # train MFU: analytic MACs x 3 per training image over the cached matmul peak
    assert on_disk["train_mfu"] == pytest.approx(
        on_disk["gmacs_analytic"] * 3 * on_disk["train_images_per_s"] / on_disk["matmul_peak_gmacs_s"]
    )
    assert on_disk["gmacs"] > 0 and on_disk["params"] == sum(p.numel() for p in module.net.parameters())

    log = pd.read_csv(tmp_path / "csv" / "metrics.csv")
    losses = log["train/loss_step"].dropna().to_numpy()
    assert len(losses) == 30 and losses[-5:].mean() < losses[:5].mean() - 0.02, f"loss did not go down: {losses}"
    assert_attention_matters(module.net, digits_batch(32), model)
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

    report = evaluate(
        compose_cfg(
            [
                f"ckpt_path={on_disk['best_ckpt']}",
                "trainer.limit_val_batches=1",
                "trainer.enable_progress_bar=false",
                "benchmark.batch_size=8",
                "benchmark.warmup=1",
                "benchmark.steps=2",
            ],
            tmp_path / "eval",
            config="eval",
        )
    )
    assert report["val_acc"] == pytest.approx(on_disk["best_val_acc"], abs=1e-6)  # same weights, same 32 images
    assert report["val_loss"] == pytest.approx(on_disk["val_loss"], rel=1e-5)
    assert report["params"] == on_disk["params"]
    assert report["gmacs"] == pytest.approx(count_flops(reloaded.net).measured / 1e9)  # the evaluated weights' count
    if attention != "routing":  # routing's span S follows the data, so its count moves with the weights
        assert report["gmacs"] == pytest.approx(on_disk["gmacs"])
    written = json.loads(Path(report["report_path"]).read_text())
    assert Path(report["report_path"]) == tmp_path / "eval" / "eval.json"  # in the eval run's own folder
    assert written["val_acc5"] == report["val_acc5"] and written["infer_images_per_s"] > 0


class zeroed_attention:
    """Context: every block's token mixer outputs zeros (the block keeps its residual and MLP)."""

    def __init__(self, net):
        self.blocks = [m for m in net.modules() if isinstance(m, Block)]

    def __enter__(self):
        self.hooks = [b.attn.register_forward_hook(lambda mod, args, out: torch.zeros_like(out)) for b in self.blocks]

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()


def assert_attention_matters(net, x, model):
    """The trained net uses its token mixers: gradients reach every mixer that has parameters, and
    removing the mixers changes the logits. In ViT (class-token pooling) only attention carries the image
    into the class token: without it all images get the same logits, with it they differ."""
    from vitzoo.attention import TokenMixer

    net.eval()
    net.zero_grad()
    y = torch.arange(len(x)) % 10
    torch.nn.functional.cross_entropy(net(x), y).backward()
    mixers = [b.attn for b in net.modules() if isinstance(b, Block)]
    assert mixers and all(isinstance(m, TokenMixer) for m in mixers)
    for i, m in enumerate(mixers):
        grads = [p.grad for p in m.parameters() if p.requires_grad]
        assert not grads or any(g is not None and g.abs().sum() > 0 for g in grads), f"no gradient reaches mixer {i}"
    with torch.no_grad():
        logits = net(x)
        with zeroed_attention(net):
            without = net(x)
    assert (logits - without).abs().max() > 1e-3, "the logits do not depend on the attention"
    if model == "vit_cifar":
        assert (without - without[:1]).abs().max() < 1e-5  # the control: no attention, no image in the class token
        assert (logits - logits[:1]).abs().max() > 1e-3, "the class token does not see the image"


def digits_tensors(img_size=16):
    from vitzoo.data.datamodules import DigitsDataModule

    dm = DigitsDataModule(name="digits", img_size=img_size, num_classes=10, flip=False, augment=False)
    dm.setup()

    def stack(ds):
        return (
            torch.stack([ds[i][0] for i in range(len(ds))]),
            torch.tensor([ds[i][1] for i in range(len(ds))]),
        )

    return stack(dm.train_set), stack(dm.val_set)


def train_digits(attention, steps=300, zero_attention=False):
    """A one-block ViT (16 px digits, 4×4 patches: 16 tokens + class token) trained ``steps`` AdamW steps of
    32 images; returns held-out accuracy on the 180 validation digits."""
    (xs, ys), (xv, yv) = digits_tensors()
    torch.manual_seed(0)
    net = vitzoo.create_model(
        "vit_cifar",
        attention=attention,
        img_size=16,
        patch_size=4,
        depth=1,
        embed_dim=32,
        num_heads=2,
        window_size=2,
        drop_path_rate=0.0,
    )
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    ctx = zeroed_attention(net) if zero_attention else contextlib.nullcontext()
    with ctx:
        for _ in range(steps):
            idx = torch.randint(len(xs), (32,), generator=g)
            loss = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            return (net(xv).argmax(-1) == yv).float().mean().item()


@pytest.mark.parametrize("attention", ["global", "window"])
def test_attention_is_what_learns_digits(attention):
    """Held-out accuracy far above chance (10%) after 300 steps (a few seconds)."""
    acc = train_digits(attention)
    assert acc > 0.5, f"{attention}: validation accuracy {acc:.2f} after 300 steps"


def test_without_attention_the_same_run_stays_at_chance():
    """The control for the test above: same model and budget, attention output replaced by zeros: the
    class token never sees the image, so the threshold above is out of reach without working attention."""
    control = train_digits("global", zero_attention=True)
    assert control < 0.2, f"without attention the model still reaches {control:.2f}"


BAD = {
    "unknown attention": (["attention.name=bogus"], r"unknown attention 'bogus'; choose attention= one of: .*global"),
    "unknown attention option": (["+attention.bogus=1"], r"unknown option attention.bogus"),
    "backend option out of range": (
        ["attention=window", "attention.window_size=0"],
        r"attention.window_size must be a positive",
    ),
    "img not divisible by patch": (
        ["model.img_size=30"],
        r"model.img_size \(30\) must be divisible by model.patch_size",
    ),
    "dim not divisible by heads": (
        ["model.num_heads=5"],
        r"model.embed_dim \(32\) must be divisible by model.num_heads \(5\)",
    ),
    "unknown model option": (["+model.bogus=1"], r"unknown option model.bogus"),
    "unknown optim option": (["+optim.bogus=1"], r"^unknown option optim.bogus for OptimConfig"),
    "classes mismatch": (["model.num_classes=7"], r"model.num_classes=7 but the data has 10 classes"),
    "missing data folder": (
        ["data=imagefolder", "data.root=/nonexistent/vitzoo"],
        r"data.root=/nonexistent/vitzoo has no train/",
    ),
    "offline download": (
        ["data=cifar10", "data.root=/nonexistent/vitzoo", "data.download=false"],
        r"data.root=.*data.download=true",
    ),
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


@pytest.mark.slow
@pytest.mark.skipif(
    not (CIFAR_ROOT / "train").is_dir(), reason=f"CIFAR-10 JPEGs not found at {CIFAR_ROOT} (env VITZOO_CIFAR10)"
)
def test_imagefolder_training_on_shared_cifar10(tmp_path):
    results = train(
        compose_cfg(
            tiny(
                extra=[
                    "data=imagefolder",
                    f"data.root={CIFAR_ROOT}",
                    "data.num_workers=0",
                    "trainer.overfit_batches=0",
                    "trainer.max_epochs=1",
                    "trainer.limit_train_batches=4",
                    "trainer.limit_val_batches=2",
                ]
            ),
            tmp_path,
        )
    )
    assert results["status"] == "finished" and results["data"] == "imagefolder" and results["epochs"] == 1


@pytest.mark.slow
def test_entry_points_multirun_and_eval(tmp_path):
    """`train.py -m` with one good and one bad job: the sweep finishes both, records the failure, exits 1;
    then `eval.py` on the good job's checkpoint."""
    sweep = tmp_path / "sweep"
    args = [a for a in tiny() if not a.startswith("+model.num_heads")]
    proc = run_entry("train.py", "-m", *args, "+model.num_heads=2,5", f"hydra.sweep.dir={sweep}", timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert sorted(r["status"] for r in jobs.values()) == ["failed", "finished"], jobs
    bad = next(r for r in jobs.values() if r["status"] == "failed")
    assert "model.num_heads (5)" in bad["error"]
    assert "Traceback" not in proc.stderr and "error: model.embed_dim (32) must be divisible" in proc.stderr
    assert "1 of 2 jobs failed" in proc.stderr

    good = next(r for r in jobs.values() if r["status"] == "finished")
    proc = run_entry(
        "eval.py",
        f"ckpt_path={good['best_ckpt']}",
        f"hydra.run.dir={tmp_path / 'eval'}",
        "benchmark.steps=2",
        "trainer.enable_progress_bar=false",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert f"report -> {tmp_path / 'eval' / 'eval.json'}" in proc.stdout.replace("\n", "")
    assert report["model"] == "vit_cifar" and 0 <= report["val_acc"] <= 1 and report["num_val_images"] == 180


@pytest.mark.slow
def test_entry_point_single_run_error_is_one_line(tmp_path):
    proc = run_entry("train.py", "model.img_size=30", f"hydra.run.dir={tmp_path}", timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1] == "error: model.img_size (30) must be divisible by model.patch_size (4)"
    )
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("layer_decay", [None, 0.75])
def test_prefix_tokens_and_embeddings_get_no_weight_decay(layer_decay):
    """The class token, longformer's persistent global tokens and the position embedding are not decayed;
    every weight matrix is."""
    from vitzoo.training.module import OptimConfig, param_groups

    net = vitzoo.create_model("vit_cifar", depth=2, num_classes=10, attention={"name": "longformer", "num_global": 3})
    assert net.global_tokens is not None
    groups = param_groups(net, OptimConfig(weight_decay=0.05, layer_decay=layer_decay))
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert len(decay) == sum(1 for _ in net.parameters())  # every parameter in one group
    for name, p in net.named_parameters():
        expected = 0.0 if p.ndim <= 1 or name.split(".")[0] in ("cls_token", "global_tokens", "pos_embed") else 0.05
        assert decay[id(p)] == expected, name
