"""Files from strangers and careless hands: nothing written through a symlink or over another run's results,
no network when loading a file, no allocation before the size checks, resume from the newest readable
checkpoint with the RNG state and the elapsed wall time restored, and prediction that reports a bad image and goes
on."""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import FakeClock, compose_cfg, load_file, read_csv
from pytorch_lightning.trainer.states import TrainerFn
from test_bad_inputs import DIGITS, HPARAMS, TINY, checkpoint, edit_options, exported, image_tree

import vitzoo
from vitzoo.export import Predictor, predict_files
from vitzoo.fileio import atomic_write_text
from vitzoo.measure.memory import PeakMemory
from vitzoo.registry import ConfigError
from vitzoo.training import VitModule, evaluate, segments, train
from vitzoo.training.callbacks import ImagesPerSecond
from vitzoo.training.resume import RngState, latest_checkpoint
from vitzoo.training.run_overrides import check_same_run, resume_arguments
from vitzoo.training.segments import ElapsedTime, TrainingPeakMemory
from vitzoo.untrusted import write_new

pytestmark = pytest.mark.usefixtures("one_thread")
EVAL = ["trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "benchmark.batch_size=2",
        "benchmark.warmup=1", "benchmark.steps=1"]


def run(tmp_path: Path, *overrides: str, folder: str = "run") -> dict:
    return train(compose_cfg([*TINY, *overrides], tmp_path / folder))


def eval_ckpt(path: Path, out: Path) -> dict:
    return evaluate(compose_cfg([f"ckpt_path={path}", *EVAL], out, config="eval"))


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a socket connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ---- writing -----------------------------------------------------------------------------------------------------
def test_writes_never_follow_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "new.json")
    with pytest.raises(FileExistsError):
        write_new(tmp_path / "new.json", "report")
    os.symlink(victim, tmp_path / "results.json")
    os.symlink(victim, tmp_path / "results.json.tmp")
    atomic_write_text(tmp_path / "results.json", "results")
    assert victim.read_text() == "precious" and not (tmp_path / "results.json").is_symlink()
    assert (tmp_path / "results.json").read_text() == "results"


def test_eval_report_goes_into_the_eval_run_folder_never_replaced_never_through_a_symlink(tmp_path):
    (tmp_path / "ckpt").mkdir()
    path = checkpoint(tmp_path / "ckpt", name="model.ckpt")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "eval").mkdir()
    os.symlink(victim, tmp_path / "eval" / "eval.json")
    first = eval_ckpt(path, tmp_path / "eval")
    second = eval_ckpt(path, tmp_path / "eval")
    assert victim.read_text() == "precious"
    assert Path(first["report_path"]) == tmp_path / "eval" / "eval-2.json"
    assert Path(second["report_path"]) == tmp_path / "eval" / "eval-3.json"
    assert json.loads(Path(first["report_path"]).read_text())["data"] == "digits"
    assert os.listdir(tmp_path / "ckpt") == ["model.ckpt"]  # nothing beside the checkpoint


def test_export_never_written_through_a_symlink(tmp_path):
    folder = exported(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (folder / "config.json").unlink()
    os.symlink(victim, folder / "config.json")
    with pytest.raises(ConfigError, match=r"^export folder .*export holds other files but no export"):  # not ours
        vitzoo.export_model(vitzoo.create_model("vit_cifar", depth=1, embed_dim=32, num_heads=2), folder, replace=True)
    assert victim.read_text() == "precious" and (folder / "config.json").is_symlink()


def test_export_script_adds_formats_to_the_runs_export(tmp_path, capsys):
    export = load_file("scripts", "export")
    result = run(tmp_path)
    ckpt, first = Path(result["best_ckpt"]), Path(result["export_dir"])
    before = (first / "model.safetensors").read_bytes()
    assert export.main([str(ckpt), "--formats", "torchscript"]) == 0  # the weights the run exported
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"export -> {first}"
    assert (first / "model.torchscript.pt").is_file() and (first / "model.safetensors").read_bytes() == before
    assert not (first.parent / "export-2").exists()
    assert export.main([str(ckpt), "--replace=maybe"]) == 1
    assert capsys.readouterr().err == "error: argument --replace: ignored explicit argument 'maybe'\n"


# ---- no network ----------------------------------------------------------------------------------------------------
def test_a_checkpoint_never_reaches_the_network(tmp_path, no_network, capfd):
    hparams = {**HPARAMS, "model": {**HPARAMS["model"], "pretrained": "timm:vit_tiny_patch16_224"}}
    path = checkpoint(tmp_path, hyper_parameters=hparams)
    report = eval_ckpt(path, tmp_path / "eval")
    assert 0 <= report["val_acc"] <= 1
    assert VitModule.load_from_checkpoint(path).net.cfg.embed_dim == 32
    assert "model.pretrained='timm:vit_tiny_patch16_224' dropped" in capfd.readouterr().err

    cifar = {**DIGITS, "_target_": "vitzoo.data.datamodules.CIFARDataModule", "name": "cifar10",
             "root": str(tmp_path / "victim_folder"), "download": True}
    path = checkpoint(tmp_path, name="cifar.ckpt", config={"data": cifar})
    with pytest.raises(ConfigError, match=r"data.download=true"):  # offline: the data is not there, nothing fetched
        eval_ckpt(path, tmp_path / "eval_cifar")
    assert "data.download=true dropped" in capfd.readouterr().err
    assert not (tmp_path / "victim_folder").exists() or not any((tmp_path / "victim_folder").iterdir())


def test_an_export_never_reaches_the_network(tmp_path, no_network, capfd):
    folder = exported(tmp_path)
    edit_options(folder, pretrained="timm:vit_tiny_patch16_224")
    assert vitzoo.load_model(folder).cfg.embed_dim == 32
    assert "model.pretrained='timm:vit_tiny_patch16_224' dropped" in capfd.readouterr().err


# ---- memory ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("embed_dim", [10**9, 4096])
def test_an_oversized_export_config_fails_before_the_model_is_built(embed_dim, tmp_path, monkeypatch):
    folder = exported(tmp_path)
    edit_options(folder, embed_dim=embed_dim, num_heads=2)

    def never(*args, **kwargs):
        raise AssertionError("the model was allocated before the size check")

    monkeypatch.setattr("vitzoo.export.files.create_model", never)
    pattern = r"out of range" if embed_dim > 16384 else r"describes at least \d+ parameters but the weights hold \d+"
    with pytest.raises(ConfigError, match=pattern):
        vitzoo.load_model(folder)


def test_an_oversized_checkpoint_config_fails_before_the_model_is_built(tmp_path, monkeypatch):
    hparams = {**HPARAMS, "model": {**HPARAMS["model"], "embed_dim": 4096}}
    path = checkpoint(tmp_path, hyper_parameters=hparams)
    monkeypatch.setattr("vitzoo.training.module.VitModule.__init__", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(ConfigError, match=r"describes at least \d+ parameters but the weights hold"):
        VitModule.load_from_checkpoint(path)


# ---- run folders, resume, metrics ----------------------------------------------------------------------------------
def test_resume_picks_the_newest_readable_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    good = checkpoint(folder, name="best-epoch001.ckpt")
    older = checkpoint(folder, name="best-epoch000.ckpt")
    newest = checkpoint(folder, name="last.ckpt")
    now = time.time()
    for i, p in enumerate([older, good, newest]):
        os.utime(p, (now + i, now + i))
    assert latest_checkpoint(tmp_path) == newest
    newest.write_bytes(newest.read_bytes()[:100])  # truncated by a crash
    assert latest_checkpoint(tmp_path) == good  # the next newest, not the oldest


def test_truncated_last_ckpt_resumes_from_the_best_and_a_failure_keeps_finished_results(tmp_path, capsys):
    first = run(tmp_path)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:200])
    resumed = run(tmp_path, "ckpt_path=auto", "trainer.max_epochs=2")
    assert resumed["status"] == "finished" and resumed["resumed_from"] == first["best_ckpt"]
    assert "skipping last.ckpt" in capsys.readouterr().out

    finished = (tmp_path / "run" / "results.json").read_text()
    with pytest.raises(ConfigError, match=r"data.batch_size must be a positive integer"):
        run(tmp_path, "ckpt_path=auto", "data.batch_size=0")
    assert (tmp_path / "run" / "results.json").read_text() == finished


def test_metrics_csv_has_each_epoch_once_after_a_resume(tmp_path):
    run(tmp_path)
    metrics = tmp_path / "run" / "csv" / "metrics.csv"
    rows = metrics.read_text().splitlines()
    header = rows[0].split(",")
    killed = [""] * len(header)  # a row the killed run logged after its last checkpoint
    killed[header.index("epoch")], killed[header.index("step")] = "1", "99"
    metrics.write_text("\n".join(rows + [",".join(killed)]) + "\n")
    run(tmp_path, "ckpt_path=auto", "trainer.max_epochs=2")
    seen = [(r["epoch"], r["step"], bool(r["val/acc"])) for r in read_csv(metrics)]
    assert len(seen) == len(set(seen))  # each step and epoch once
    assert {int(e) for e, _, _ in seen} == {0, 1}  # no row labelled past the last epoch, no killed-run row
    assert all(int(s) < 99 for _, s, _ in seen)


def test_rng_state_round_trips():
    callback = RngState()
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    state = callback.state_dict()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(2)
    np.random.seed(2)
    random.seed(2)
    callback.load_state_dict(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    torch.testing.assert_close(got[0], expected[0])
    assert np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_elapsed_time_continues_from_the_checkpoint_and_counts_segments():
    clock = FakeClock()
    first = ElapsedTime(clock)
    clock.advance(7.5)
    state = first.state_dict()
    assert state == {"seconds": 7.5, "segments": 1}
    clock.advance(100.0)  # work after the checkpoint, lost when the process dies
    resumed = ElapsedTime(clock)
    resumed.load_state_dict(state)
    clock.advance(2.0)
    assert resumed.seconds() == 9.5 and resumed.segments == 2


def test_a_validation_of_a_checkpoint_does_not_rewind_the_counters():
    """``trainer.validate(ckpt_path=best)`` loads the callbacks' state too: only a fit takes it over."""
    clock = FakeClock()
    timer, speed, peak = ElapsedTime(clock), ImagesPerSecond(clock), TrainingPeakMemory(lambda: 50.0)
    clock.advance(30.0)
    validating = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.VALIDATING))
    for cb, state in zip((timer, speed, peak), [{"seconds": 25.0}, {"images": 10, "seconds": 1.0}, {"peak_mb": 900}]):
        cb.on_load_checkpoint(validating, None, {})
        cb.load_state_dict(state)
    assert timer.seconds() == 30.0 and timer.segments == 1 and speed.images_per_s is None and peak.peak_mb() == 50.0
    fitting = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING))
    for cb, state in zip((timer, speed, peak), [{"seconds": 4.0}, {"images": 8, "seconds": 4.0}, {"peak_mb": 70}]):
        cb.on_load_checkpoint(fitting, None, {})
        cb.load_state_dict(state)
    assert timer.seconds() == 34.0 and timer.segments == 2 and speed.images_per_s == 2.0 and peak.peak_mb() == 70.0


STEPS = 3  # optimizer steps per epoch in the resume tests
RESUME = ["data.augment=true", "model.drop_path_rate=0.3", f"trainer.limit_train_batches={STEPS}",
          "trainer.max_epochs=3", "trainer.deterministic=true", "callbacks.model_checkpoint.save_top_k=-1"]


def interrupted_at(tmp_path, monkeypatch, step: int) -> Path:
    """A run stopped by Ctrl-C when optimizer step ``step`` is about to run; its folder."""
    original = VitModule.training_step

    def stop(self, batch, batch_idx):
        if self.global_step == step:
            raise KeyboardInterrupt
        return original(self, batch, batch_idx)

    monkeypatch.setattr(VitModule, "training_step", stop)
    with pytest.raises(SystemExit, match=r"interrupted; resume with: vitzoo-train ckpt_path=auto hydra.run.dir=/"):
        run(tmp_path, *RESUME, folder="resumed")
    monkeypatch.setattr(VitModule, "training_step", original)
    return tmp_path / "resumed"


@pytest.mark.parametrize("newest", ["intact", "corrupt"])
def test_resume_with_augmentation_and_drop_path_is_bit_exact(newest, tmp_path, monkeypatch):
    """Random crops and stochastic depth draw numbers every step: a resume that lost the RNG state ends with
    other weights; with several checkpoints on disk it starts from the newest readable one."""
    straight = run(tmp_path, *RESUME, folder="straight")
    folder = interrupted_at(tmp_path, monkeypatch, 2 * STEPS)  # epochs 0 and 1 done, each with a checkpoint
    ckpts = folder / "checkpoints"
    assert {p.name for p in ckpts.glob("*.ckpt")} == {"best-epoch000.ckpt", "best-epoch001.ckpt", "last.ckpt"}
    if newest == "corrupt":
        (ckpts / "last.ckpt").write_bytes((ckpts / "last.ckpt").read_bytes()[:300])
    resumed = run(tmp_path, *RESUME, "ckpt_path=auto", folder="resumed")
    assert resumed["segments"] == 2 and math.isfinite(resumed["wall_s"]) and resumed["wall_s"] > 0
    assert Path(resumed["resumed_from"]).name == ("last.ckpt" if newest == "intact" else "best-epoch001.ckpt")
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(ckpts / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 3 * STEPS
    for key, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][key]), key
    assert straight["best_val_acc"] == resumed["best_val_acc"]


def test_a_resume_takes_the_runs_own_overrides_and_the_command_line_wins(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    saved = ["attention=window", "attention.window_size=2", "+model.depth=1", "trainer.max_epochs=3"]
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in saved))
    args = ["ckpt_path=auto", f"hydra.run.dir={run_dir}", "trainer.max_epochs=5"]
    assert resume_arguments(args) == [*saved[:3], *args, "hydra.output_subdir=null"]
    # a group picked on the command line takes its own options, not those of the run's choice
    assert resume_arguments(["attention=global", *args]) == ["+model.depth=1", "attention=global", *args,
                                                              "hydra.output_subdir=null"]
    assert resume_arguments(["-m", *args]) == ["-m", *args]  # a sweep's jobs resume in fit()
    fresh = ["ckpt_path=auto", f"hydra.run.dir={tmp_path / 'new'}"]
    assert resume_arguments(fresh) == fresh


def test_a_config_that_contradicts_the_checkpoint_is_one_line_naming_each_difference():
    data = {"name": "digits", "num_classes": 10, "img_size": 32, "batch_size": 32}
    run = {"model": {"name": "vit_cifar", "depth": 1}, "attention": {"name": "window", "window_size": 2}, "data": data}
    now = {"model": {"name": "vit_cifar", "depth": 2}, "attention": {"name": "global"},
           "data": {**data, "batch_size": 64}}
    with pytest.raises(ConfigError) as err:
        check_same_run(now, run, "the run in R")
    assert str(err.value).startswith("attention.name=global (the run has window); model.depth=2 (the run has 1) "
                                     "contradicts the run in R; drop the option")
    assert "window_size" not in str(err.value) and "batch_size" not in str(err.value) and "\n" not in str(err.value)
    check_same_run({**run, "data": {**data, "batch_size": 64}}, run, "the run in R")  # loading options may change
    check_same_run(now, {"data": data}, "the run in R")  # a checkpoint without model and attention sections


@pytest.mark.parametrize("case", ["copied", "empty_last", "folder_last"])
def test_a_copied_folder_or_a_broken_last_ckpt_resumes_into_last_ckpt(case, tmp_path, monkeypatch):
    """The run folder copied elsewhere, or its ``last.ckpt`` emptied or replaced by a folder: the resume writes
    ``last.ckpt`` in its own folder (never ``last-v1.ckpt``, never into the original), it ends as the newest state,
    and the best checkpoint of the earlier segment is pruned as usual (``save_top_k=1``)."""
    options = [o for o in RESUME if not o.startswith("callbacks.model_checkpoint.save_top_k")]
    original = tmp_path / "resumed"
    step = VitModule.training_step

    def stop(self, batch, batch_idx):
        if self.global_step == 2 * STEPS:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    monkeypatch.setattr(VitModule, "training_step", stop)
    with pytest.raises(SystemExit, match="interrupted; resume with"):
        run(tmp_path, *options, folder="resumed")
    monkeypatch.setattr(VitModule, "training_step", step)
    folder = original
    if case == "copied":
        folder = tmp_path / "copy"
        shutil.copytree(original, folder)
        untouched = {p: p.read_bytes() for p in original.rglob("*") if p.is_file()}
    last = folder / "checkpoints" / "last.ckpt"
    if case == "empty_last":
        last.write_bytes(b"")
    elif case == "folder_last":
        last.unlink()
        last.mkdir()
        (last / "note.txt").write_text("not a checkpoint")
    results = run(tmp_path, *options, "ckpt_path=auto", folder=folder.name)
    assert results["status"] == "finished" and results["segments"] == 2
    names = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert names == [Path(results["best_ckpt"]).name, "last.ckpt"] and last.is_file()
    assert Path(results["best_ckpt"]).parent == folder / "checkpoints"
    assert torch.load(last, weights_only=True)["global_step"] == 3 * STEPS
    if case == "copied":
        assert {p: p.read_bytes() for p in original.rglob("*") if p.is_file()} == untouched


def test_an_interrupted_run_reports_wall_time_throughput_and_memory_from_all_segments(tmp_path, monkeypatch):
    """On a fake clock: a training step takes 1 s in the first process and 3 s in the resumed one, a validation
    step 0.5 s; the first process's training peak is 500 MiB, the resumed one's 40 MiB. Ctrl-C stops the first
    process at the first step of epoch 2, right after epoch 1's checkpoint, so no work is lost."""
    clock, batch = FakeClock(), 16
    monkeypatch.setattr(segments, "wall_clock", clock)
    segment = {"step_s": 1.0, "peak_mb": 500.0}
    train_step, val_step = VitModule.training_step, VitModule.validation_step

    def timed_train_step(self, batch, batch_idx):
        if self.global_step == 2 * STEPS and segment["step_s"] == 1.0:
            raise KeyboardInterrupt
        clock.advance(segment["step_s"])
        return train_step(self, batch, batch_idx)

    def timed_val_step(self, batch, batch_idx):
        clock.advance(0.5)
        return val_step(self, batch, batch_idx)

    monkeypatch.setattr(VitModule, "training_step", timed_train_step)
    monkeypatch.setattr(VitModule, "validation_step", timed_val_step)
    monkeypatch.setattr(PeakMemory, "peak_mb", lambda self: segment["peak_mb"])
    options = [*RESUME, "data.augment=false", f"data.batch_size={batch}"]
    with pytest.raises(SystemExit, match="interrupted; resume with"):
        run(tmp_path, *options)
    segment.update(step_s=3.0, peak_mb=40.0)
    results = run(tmp_path, *options, "ckpt_path=auto")
    measured = clock() - 1000.0  # every fake second of both processes
    assert results["segments"] == 2 and results["epochs"] == 3
    assert abs(results["wall_s"] - measured) <= 0.1 * measured, (results["wall_s"], measured)
    # each process's first step is not timed: 2·STEPS - 1 steps of 1 s, then STEPS - 1 steps of 3 s
    timed = [(2 * STEPS - 1, 1.0), (STEPS - 1, 3.0)]
    expected = sum(n for n, _ in timed) * batch / sum(n * s for n, s in timed)
    assert results["train_images_per_s"] == pytest.approx(expected)
    assert results["peak_memory_mb"] == 500.0


# ---- data and prediction -------------------------------------------------------------------------------------------
def test_a_corrupt_image_is_named_with_worker_processes(tmp_path):
    root = image_tree(tmp_path / "imgs", per_class=4)
    (root / "train" / "a" / "0.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ConfigError, match=r"^cannot read image .*/a/0.jpg \(") as err:
        run(tmp_path, "data=imagefolder", f"data.root={root}", "data.num_workers=2", "data.val_fraction=0.5",
            "data.batch_size=2", "data.img_size=32", "trainer.limit_train_batches=null")
    assert "\n" not in str(err.value) and "DataLoader worker" not in str(err.value)


def test_hidden_folders_are_not_classes(tmp_path):
    from test_bad_inputs import data_module

    root = image_tree(tmp_path / "imgs")
    image_tree(root, classes=(".ipynb_checkpoints",))
    assert data_module(root).num_classes == 2


def predictor(classes) -> Predictor:
    data = {"img_size": 8, "mean": [0.5] * 3, "std": [0.5] * 3, "classes": classes}
    return Predictor(lambda x: torch.arange(3.0).expand(x.shape[0], 3), data)


def test_predict_reports_a_bad_image_on_its_own_line_and_goes_on(tmp_path):
    root = image_tree(tmp_path / "imgs", classes=("a",), per_class=3)
    files = sorted((root / "train" / "a").glob("*.jpg"))
    files[1].write_bytes(b"not an image")
    out = list(predict_files(predictor(["x", "y", "z"]), files, topk=1, batch_size=2))
    assert [f for f, _ in out] == files
    assert isinstance(out[1][1], ConfigError) and str(files[1]) in str(out[1][1])
    assert out[0][1][0][0] == "z" and out[2][1][0][0] == "z"


@pytest.mark.parametrize("option", [{"topk": 0}, {"batch_size": 0}, {"topk": "3"}])
def test_predict_options_are_positive_integers(option, tmp_path):
    files = sorted(image_tree(tmp_path / "imgs", classes=("a",)).rglob("*.jpg"))
    with pytest.raises(ConfigError, match=rf"^{next(iter(option))} must be a positive integer"):
        list(predict_files(predictor(["x", "y", "z"]), files, **option))


def test_a_huge_saved_img_size_is_refused_before_any_image_is_read(tmp_path):
    files = sorted(image_tree(tmp_path / "imgs", classes=("a",)).rglob("*.jpg"))
    data = {"img_size": 10**6, "mean": [0.5] * 3, "std": [0.5] * 3}
    with pytest.raises(ConfigError, match=r"the saved data.img_size=1000000 is not an integer in \[1, 4096\]"):
        list(predict_files(Predictor(lambda x: x, data), files))


def test_class_names_cannot_forge_output_lines(tmp_path, capsys):
    folder = exported(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    classes = [f"c{i}" for i in range(10)]
    classes[:] = ["cat\nfake.jpg: dog 1.000"] * 10
    config["data"] = {"img_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3, "classes": classes}
    (folder / "config.json").write_text(json.dumps(config))
    image = image_tree(tmp_path / "imgs", classes=("a",), per_class=1) / "train" / "a" / "0.jpg"
    predict = load_file("scripts", "predict")
    assert predict.main([str(folder), str(image), "--topk", "1"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and "cat\\nfake.jpg" in out
