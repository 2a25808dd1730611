"""Untrusted and bad input: hostile checkpoints and exports never run code or touch the disk, and a catalogue
of bad inputs across train / eval / export / data, each with the one-line message it gets.

Rows call the Python API in-process (composed configs, ``vitzoo.load_model``, DataModules); two go through
``python train.py`` (Hydra's own group resolution). Each row: (build the input, call, expected message).
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from helpers import compose_cfg, run_entry
from PIL import Image

import vitzoo
from vitzoo.data.datamodules import ImageFolderDataModule
from vitzoo.export import export_model
from vitzoo.registry import ConfigError
from vitzoo.training import VitModule, evaluate, train
from vitzoo.training.cli import check_group_choices

TINY = [
    "+model.depth=1",
    "+model.embed_dim=32",
    "+model.num_heads=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "callbacks.rich_progress_bar=null",
    "benchmark.batch_size=4",
    "benchmark.warmup=1",
    "benchmark.steps=1",
]
HPARAMS = {
    "model": {"name": "vit_cifar", "img_size": 32, "depth": 1, "embed_dim": 32, "num_heads": 2, "num_classes": 10},
    "attention": {"name": "global"},
    "optim": None,
    "data": None,
}
DIGITS = {
    "_target_": "vitzoo.data.datamodules.DigitsDataModule",
    "name": "digits",
    "img_size": 32,
    "num_classes": 10,
    "batch_size": 32,
    "num_workers": 0,
    "flip": False,
    "augment": False,
}


pytestmark = pytest.mark.usefixtures("one_thread")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and mtime: "an untouched disk"."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


def checkpoint(tmp_path: Path, name="good.ckpt", **changes) -> Path:
    """A vitzoo checkpoint (what training saves: state_dict, hyper_parameters, config) with ``changes`` applied."""
    module = VitModule(**HPARAMS)
    ckpt = {
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(HPARAMS),
        "config": {"data": dict(DIGITS)},
        "epoch": 0,
        "global_step": 0,
    }
    ckpt.update(changes)
    path = tmp_path / name
    torch.save(ckpt, path)
    return path


def exported(tmp_path: Path) -> Path:
    out = tmp_path / "export"
    export_model(vitzoo.create_model("vit_cifar", depth=1, embed_dim=32, num_heads=2), out, data={"img_size": 32})
    return out


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


class WritesAFile:
    """A pickled object that, if it were ever unpickled, would create ``marker`` (it must not be)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


# ---- hostile checkpoints: data, never code ---------------------------------------------------------------------
HOSTILE_CKPT = {
    "foreign data _target_": (
        dict(config={"data": {**DIGITS, "_target_": "os.remove", "path": "VICTIM"}}),
        r"config.data._target_='os.remove' is not an allowed data class",
    ),
    "nested _target_": (
        dict(config={"data": {**DIGITS, "mean": {"_target_": "shutil.rmtree", "path": "VICTIM"}}}),
        r"config.data.mean._target_='shutil.rmtree' is not an allowed",
    ),
    "_target_ nested in a list": (
        dict(config={"data": {**DIGITS, "mean": [0.5, {"_target_": "os.remove", "path": "VICTIM"}, 0.5]}}),
        r"config.data.mean\[1\]._target_='os.remove' is not an allowed",
    ),
    "_target_ in a list of lists": (
        dict(config={"data": {**DIGITS, "extra": [[{"_target_": "shutil.rmtree", "path": "VICTIM"}]]}}),
        r"config.data.extra\[0\]\[0\]._target_='shutil.rmtree' is not an allowed",
    ),
    "interpolation": (
        dict(config={"data": {**DIGITS, "root": "${oc.env:HOME}"}}),
        r"config.data.root=.* is an interpolation",
    ),
    "instantiator in hparams": (
        dict(hyper_parameters={**HPARAMS, "_instantiator": "os.system"}),
        r"unknown hyper-parameter '_instantiator'",
    ),
    "model name not registered": (
        dict(hyper_parameters={**HPARAMS, "model": {"name": "os.system"}}),
        r"unknown model 'os.system'",
    ),
    "wrong shapes": (
        dict(hyper_parameters={**HPARAMS, "model": {**HPARAMS["model"], "num_classes": 7}}),
        r"the weights do not fit the model it describes \(size mismatch for net.head.weight",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CKPT))
def test_hostile_checkpoint_is_refused_in_one_line_with_the_disk_untouched(name, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    changes, pattern = HOSTILE_CKPT[name]
    changes = json.loads(json.dumps(changes).replace("VICTIM", str(victim)))
    path = checkpoint(tmp_path, **changes)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=pattern) as err:
        evaluate(compose_cfg([f"ckpt_path={path}"], tmp_path / "eval", config="eval"))
    assert "\n" not in str(err.value)
    if "hyper_parameters" in changes:  # the same checks guard VitModule.load_from_checkpoint
        with pytest.raises(ConfigError, match=pattern):
            VitModule.load_from_checkpoint(path)
    assert snapshot(tmp_path) == before and victim.read_text() == "precious"


@pytest.mark.parametrize("payload", ["pickled object", "truncated"])
def test_pickled_or_truncated_checkpoint_never_runs(payload, tmp_path):
    marker = tmp_path / "marker.txt"
    path = checkpoint(tmp_path)
    if payload == "pickled object":
        torch.save({"state_dict": {}, "hyper_parameters": {"model": WritesAFile(marker)}}, path)
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = snapshot(tmp_path)
    for load in (
        lambda: evaluate(compose_cfg([f"ckpt_path={path}"], tmp_path / "eval", config="eval")),
        lambda: VitModule.load_from_checkpoint(path),
        lambda: train(compose_cfg([*TINY, f"ckpt_path={path}"], tmp_path / "run")),
    ):
        with pytest.raises(ConfigError, match=r"ckpt_path=.* is not a checkpoint \(\w+\)$"):
            load()
    assert not marker.exists()
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run/")} == before  # (run/: results.json)


# ---- hostile exports ---------------------------------------------------------------------------------------------
HOSTILE_EXPORT = {
    "model is an import path": (
        lambda d: edit_json(d / "config.json", model="os.system"),
        r"unknown model 'os.system'",
    ),
    "_target_ in attention": (
        lambda d: edit_json(d / "config.json", attention={"name": "global", "_target_": "os.system"}),
        r"unknown option attention._target_",
    ),
    "_target_ in model options": (
        lambda d: edit_json(d / "config.json", model_options={"_target_": "os.system"}),
        r"unknown option model._target_",
    ),
    "interpolation": (lambda d: edit_json(d / "config.json", data={"root": "${oc.env:HOME}"}), r"is an interpolation"),
    "truncated config.json": (
        lambda d: (d / "config.json").write_text((d / "config.json").read_text()[:40]),
        r"config.json is not valid JSON",
    ),
    "truncated weights": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100]),
        r"model.safetensors: cannot load the weights \(SafetensorError",
    ),
    "wrong shapes": (
        lambda d: edit_json(
            d / "config.json",
            model_options={**json.loads((d / "config.json").read_text())["model_options"], "num_classes": 7},
        ),
        r"cannot load the weights .*(size|shape)",
    ),
    "missing weights file": (lambda d: (d / "model.safetensors").unlink(), r"missing model.safetensors"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_EXPORT))
def test_hostile_export_is_refused_in_one_line(name, tmp_path):
    folder = exported(tmp_path)
    HOSTILE_EXPORT[name][0](folder)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=HOSTILE_EXPORT[name][1]) as err:
        vitzoo.load_model(folder)
    assert "\n" not in str(err.value) and snapshot(tmp_path) == before


# ---- the catalogue of bad inputs ---------------------------------------------------------------------------------
def image_tree(root: Path, classes=("a", "b"), per_class=2, split="train", mode="RGB") -> Path:
    for c in classes:
        (root / split / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new(mode, (8, 8), color=(i * 40) if mode == "L" else (i * 40, 0, 0)).save(
                root / split / c / f"{i}.jpg"
            )
    return root


def data_module(root: Path) -> ImageFolderDataModule:
    dm = ImageFolderDataModule(name="imagefolder", root=str(root), img_size=8, batch_size=2, val_fraction=0.5)
    dm.setup()
    return dm


def bad_folder(kind):
    def make(tmp_path):
        root = tmp_path / "imgs"
        if kind == "empty":
            (root / "train").mkdir(parents=True)
        elif kind == "no images":
            (root / "train" / "a").mkdir(parents=True)
        elif kind == "mismatch":
            image_tree(root, ("a", "b"))
            image_tree(root, ("a", "c"), split="val")
        elif kind == "corrupt":
            image_tree(root)
            for i in range(2):
                (root / "train" / "a" / f"{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
        return root

    return make


def read_all(dm):
    return [dm.train_set[i] for i in range(len(dm.train_set))] + [dm.val_set[i] for i in range(len(dm.val_set))]


def unreadable(tmp_path, monkeypatch):
    root = image_tree(tmp_path / "imgs")
    real = os.scandir

    def denied(path="."):  # root bypasses chmod, so the permission error is simulated where torchvision lists
        if Path(path) == root / "train":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", denied)
    return root


def run_train(tmp_path, *overrides):
    train(compose_cfg([*TINY, *overrides], tmp_path / "run"))


def disk_full(tmp_path, monkeypatch):
    def no_space(model, filename, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr("vitzoo.export.files._save_safetensors", no_space)
    run_train(tmp_path)


def nan_loss(tmp_path, monkeypatch):
    step = VitModule.training_step
    monkeypatch.setattr(VitModule, "training_step", lambda self, b, i: step(self, b, i) * float("nan"))
    run_train(tmp_path)


def other_project_ckpt(tmp_path):
    path = tmp_path / "other.ckpt"  # a Lightning checkpoint of someone else's model
    torch.save({"state_dict": {"encoder.weight": torch.zeros(2)}, "hyper_parameters": {"hidden": 8}, "epoch": 3}, path)
    evaluate(compose_cfg([f"ckpt_path={path}"], tmp_path / "eval", config="eval"))


def eval_other_classes(tmp_path):
    path = checkpoint(tmp_path)
    evaluate(
        compose_cfg(
            [
                f"ckpt_path={path}",
                "data=imagefolder",
                f"data.root={image_tree(tmp_path / 'imgs')}",
                "data.num_workers=0",
                "data.val_fraction=0.5",
            ],
            tmp_path / "eval",
            config="eval",
        )
    )


def cli(*args):
    def call(tmp_path):
        proc = run_entry("train.py", *args, f"hydra.run.dir={tmp_path}", timeout=120)
        last = proc.stderr.strip().splitlines()[-1]  # (after any library warnings)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Could not find" not in proc.stderr, (
            proc.stderr[-2000:]
        )
        raise ConfigError(last.removeprefix("error: "))

    return call


CHOICES = r"choose attention= one of: afno, .*, xca$"
BAD_INPUTS = {  # name: (call(tmp_path[, monkeypatch]), expected one-line message)
    "attention=bogus (command line)": (cli("attention=bogus"), r"^unknown attention 'bogus'; " + CHOICES),
    "model=bogus (command line, sweep)": (
        cli("-m", "model=vit_cifar,bogus"),
        r"^unknown model 'bogus'; choose model= one of: swin_base",
    ),
    "attention.name=bogus": (lambda t: run_train(t, "attention.name=bogus"), r"unknown attention 'bogus'; " + CHOICES),
    "data=bogus (group option)": (
        lambda t: check_group_choices(["data=bogus"]),
        r"unknown data 'bogus'; choose data= one of: cifar10",
    ),
    "unknown model key": (lambda t: run_train(t, "+model.bogus=1"), r"unknown option model.bogus for ViTConfig"),
    "unknown attention key": (lambda t: run_train(t, "+attention.bogus=1"), r"unknown option attention.bogus"),
    "unknown optim key": (lambda t: run_train(t, "+optim.bogus=1"), r"optim.bogus"),
    "wrong type: batch size": (
        lambda t: run_train(t, "data.batch_size=0"),
        r"data.batch_size must be a positive integer",
    ),
    "wrong type: val fraction": (
        lambda t: run_train(t, "data.val_fraction=1.5"),
        r"data.val_fraction must be in \(0, 1\)",
    ),
    "wrong type: every_n_train_steps": (
        lambda t: run_train(t, "callbacks.model_checkpoint.every_n_train_steps=-2"),
        r"every_n_train_steps must be a positive integer or null",
    ),
    "img_size not divisible by patch": (
        lambda t: run_train(t, "model.img_size=30"),
        r"model.img_size \(30\) must be divisible",
    ),
    "embed_dim not divisible by heads": (
        lambda t: run_train(t, "model.num_heads=5"),
        r"model.embed_dim \(32\) must be divisible by model.num_heads \(5\)",
    ),
    "window larger than grid, clamp=false": (
        lambda t: run_train(
            t, "attention=window", "attention.window_size=16", "attention.clamp=false", "attention.pad=false"
        ),
        r"attention\.(window_size|clamp|pad)",
    ),
    "model/data classes mismatch": (
        lambda t: run_train(t, "model.num_classes=7"),
        r"model.num_classes=7 but the data has 10 classes",
    ),
    "foreign logger _target_": (
        lambda t: run_train(t, "logger.csv._target_=os.system"),
        r"logger.csv._target_='os.system' is not an allowed logger class",
    ),
    "foreign callback _target_": (
        lambda t: run_train(t, "callbacks.lr_monitor._target_=builtins.exec"),
        r"callbacks.lr_monitor._target_='builtins.exec' is not an allowed",
    ),
    "foreign data _target_": (
        lambda t: run_train(t, "data._target_=shutil.rmtree"),
        r"data._target_='shutil.rmtree' is not an allowed data class",
    ),
    "missing data folder": (
        lambda t: run_train(t, "data=imagefolder", "data.root=/nonexistent/vitzoo"),
        r"data.root=/nonexistent/vitzoo has no train/",
    ),
    "empty image folder": (
        lambda t: data_module(bad_folder("empty")(t)),
        r"data.root: .*/train holds no images in <class>/ folders",
    ),
    "class folder without images": (
        lambda t: data_module(bad_folder("no images")(t)),
        r"data.root: .*/train holds no images",
    ),
    "unreadable image folder": (
        lambda t, m: data_module(unreadable(t, m)),
        r"data.root: cannot read .*/train \(Permission denied\)",
    ),
    "train/ and val/ classes differ": (
        lambda t: data_module(bad_folder("mismatch")(t)),
        r"val/ classes differ from train/ classes \(in one only: b, c\)",
    ),
    "corrupt JPEG": (
        lambda t: read_all(data_module(bad_folder("corrupt")(t))),
        r"cannot read image .*/a/[01].jpg \((UnidentifiedImageError|OSError)",
    ),
    "offline download": (
        lambda t: run_train(t, "data=cifar10", "data.root=/nonexistent/vitzoo", "data.download=false"),
        r"data.download=true",
    ),
    "missing resume checkpoint": (
        lambda t: run_train(t, "ckpt_path=/nonexistent/x.ckpt"),
        r"ckpt_path=/nonexistent/x.ckpt does not exist",
    ),
    ".ckpt from another project": (other_project_ckpt, r"not a vitzoo training checkpoint"),
    "eval data with other classes": (
        eval_other_classes,
        r"data=imagefolder has 2 classes but the checkpoint's model has 10",
    ),
    "export with a missing file": (
        lambda t: (exported(t) / "config.json").unlink() or vitzoo.load_model(t / "export"),
        r"missing config.json",
    ),
    "NaN loss": (lambda t, m: nan_loss(t, m), r"train/loss is nan at step 0 \(epoch 0\); stopped before the update"),
    "disk full writing the export": (
        lambda t, m: disk_full(t, m),
        r"could not write the export to .*/export \(disk full\); free space",
    ),
    "foreign logger _target_ in a list": (
        lambda t: run_train(t, "+logger.csv.extra=[{_target_: os.system}]"),
        r"logger.csv.extra\[0\]._target_='os.system' is not an allowed",
    ),
    "foreign callback _target_ nested": (
        lambda t: run_train(t, "+callbacks.lr_monitor.inner={deeper: {_target_: builtins.exec}}"),
        r"callbacks.lr_monitor.inner.deeper._target_='builtins.exec' is not an allowed",
    ),
    "foreign strategy _target_": (
        lambda t: run_train(t, "+trainer.strategy={_target_: os.system}"),
        r"trainer.strategy._target_='os.system' is not an allowed trainer class",
    ),
    "foreign strategy _target_ in a list": (
        lambda t: run_train(t, "+trainer.plugins=[{_target_: os.system}]"),
        r"trainer.plugins\[0\]._target_='os.system' is not an allowed",
    ),
    "window_size larger than the grid": (
        lambda t: run_train(t, "attention=window", "attention.window_size=64"),
        r"attention.window_size=64 is larger than the 8x8 token grid of model.img_size=32",
    ),
    "data.img_size differs from the model's": (
        lambda t: run_train(t, "data.img_size=28"),
        r"data.img_size=28 but model.img_size=32",
    ),
    "max_epochs=0": (lambda t: run_train(t, "trainer.max_epochs=0"), r"trainer.max_epochs=0 trains nothing"),
    "depth=0": (lambda t: run_train(t, "model.depth=0"), r"model.depth=0 is out of range; choose an integer in \[1,"),
    "optim.lr=-1": (lambda t: run_train(t, "optim.lr=-1"), r"optim.lr must be a positive number \(got -1"),
    "optim.lr=abc (command line)": (cli("optim.lr=abc"), r"^optim.lr must be a number \(got 'abc'\)$"),
    "seed=abc": (lambda t: run_train(t, "seed=abc"), r"seed must be an integer \(got 'abc'\)"),
    "mean of 2 values": (
        lambda t: run_train(t, "data.mean=[0.5,0.5]"),
        r"data.mean must be 3 numbers, one per input channel",
    ),
    "accelerator=gpu without a GPU": (
        lambda t: run_train(t, "trainer.accelerator=gpu"),
        r"trainer.accelerator=gpu but this machine has no CUDA GPU; use trainer=cpu",
    ),
    "precision=16-mixed on the CPU": (
        lambda t: run_train(t, "trainer.precision=16-mixed"),
        r"trainer.precision=16-mixed cannot run on the CPU; use trainer.precision=bf16-mixed",
    ),
    "one-class folder": (
        lambda t: data_module(image_tree(t / "imgs", classes=("only",))),
        r"data.root: .*/train has one class folder \('only'\); a classifier needs at least two",
    ),
    "hidden folder only": (
        lambda t: data_module(image_tree(t / "imgs", classes=(".ipynb_checkpoints",))),
        r"data.root: .*/train holds no images in <class>/ folders \(Couldn't find any class folder in .*/train\)",
    ),
    "run folder cannot be created": (
        lambda t: train(compose_cfg(TINY, (t / "file.txt").write_text("x") and t / "file.txt" / "run")),
        r"cannot create the run folder .*/file.txt/run \(Not a directory\); choose another with hydra.run.dir",
    ),
    "second fresh run in a finished run's folder": (
        lambda t: run_train(t) or run_train(t),
        r".*/run belongs to another run \(results.json says finished\); resume it with ckpt_path=auto, "
        r"or start over in a new folder",
    ),
    "export: embed_dim 1e9": (
        lambda t: edit_options(exported(t), embed_dim=10**9) or vitzoo.load_model(t / "export"),
        r"model.embed_dim=1000000000 is out of range",
    ),
    "export: negative depth": (
        lambda t: edit_options(exported(t), depth=-2) or vitzoo.load_model(t / "export"),
        r"model.depth=-2 is out of range",
    ),
    "export: zero patch": (
        lambda t: edit_options(exported(t), patch_size=0) or vitzoo.load_model(t / "export"),
        r"model.patch_size=0 is out of range",
    ),
    "export: string class count": (
        lambda t: edit_options(exported(t), num_classes="10") or vitzoo.load_model(t / "export"),
        r"model.num_classes must be an integer in \[1, 1000000\] \(got '10'\)",
    ),
    "export: NaN dropout": (
        lambda t: edit_options(exported(t), drop_rate=float("nan")) or vitzoo.load_model(t / "export"),
        r"model.drop_rate must be a finite number in \[0.0, 1.0\) \(got nan\)",
    ),
    "export: int64 weights": (
        lambda t: rewrite_weights(exported(t), lambda v: v.long()) or vitzoo.load_model(t / "export"),
        r"model.safetensors: weight .* is I64, not floating point",
    ),
    "export: all-NaN weights": (
        lambda t: rewrite_weights(exported(t), lambda v: v * float("nan")) or vitzoo.load_model(t / "export"),
        r"model.safetensors: weight .* holds NaN or infinite values",
    ),
    "checkpoint: huge saved img_size": (
        lambda t: evaluate(
            compose_cfg(
                [f"ckpt_path={checkpoint(t, hyper_parameters={**HPARAMS, 'data': {'img_size': 10**6}})}"],
                t / "eval",
                config="eval",
            )
        ),
        r"data.img_size=1000000 is not an integer in \[1, 4096\]",
    ),
    "checkpoint: NaN weights": (
        lambda t: VitModule.load_from_checkpoint(
            checkpoint(t, state_dict={k: v * float("nan") for k, v in VitModule(**HPARAMS).state_dict().items()})
        ),
        r"good.ckpt: weight .* holds NaN or infinite values",
    ),
}


def edit_options(folder: Path, **changes) -> None:
    """Change ``model_options`` in an export's config.json."""
    config = json.loads((folder / "config.json").read_text())
    edit_json(folder / "config.json", model_options={**config["model_options"], **changes})


def rewrite_weights(folder: Path, change) -> None:
    """Apply ``change`` to every tensor of an export's model.safetensors."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    save_file({k: change(v).contiguous() for k, v in weights.items()}, folder / "model.safetensors")


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gets_one_line(name, tmp_path, monkeypatch):
    call, pattern = BAD_INPUTS[name]
    with pytest.raises(ConfigError, match=pattern) as err:
        call(tmp_path, monkeypatch) if call.__code__.co_argcount == 2 else call(tmp_path)
    assert "\n" not in str(err.value)
    if name == "disk full writing the export":
        assert not (tmp_path / "run" / "export").exists() and not (tmp_path / "run" / "export.tmp").exists()
        assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    if name == "second fresh run in a finished run's folder":  # the first run's results stay as they were
        assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "finished"
    elif (tmp_path / "run" / "results.json").is_file():
        assert json.loads((tmp_path / "run" / "results.json").read_text())["error"] == str(err.value)


def test_non_rgb_jpeg_is_converted(tmp_path):
    """Not an error: greyscale (and CMYK, palette) images are converted to RGB like every other image."""
    dm = data_module(image_tree(tmp_path / "imgs", mode="L"))
    image, _ = dm.train_set[0]
    assert image.shape == (3, 8, 8)


def test_catalogue_is_large_enough():
    assert len(BAD_INPUTS) + len(HOSTILE_CKPT) + len(HOSTILE_EXPORT) >= 25 and len(BAD_INPUTS) >= 25


@pytest.mark.parametrize("sweep", ["attention=glob(*)", "attention=glob(*,exclude=global)", "attention=global,window"])
def test_group_sweeps_over_existing_options_pass_the_command_line_check(sweep):
    check_group_choices(["-m", sweep])  # the documented `'attention=glob(*)'` sweeps must not be rejected
