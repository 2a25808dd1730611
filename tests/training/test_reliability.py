"""Crash safety: SIGKILL mid-epoch then ``ckpt_path=auto`` finishes the configured epochs and steps; a run killed
at an epoch boundary and resumed ends bit-exact with an uninterrupted one; SIGTERM leaves ``interrupted``; NaN
loss stops with the step named and the last good checkpoint kept; checkpoint writes are atomic."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from conftest import CONFIGS, ROOT
from helpers import compose_cfg, run_entry

from vitzoo.training import VitModule, train
from vitzoo.training.resume import AtomicCheckpointIO, TrainingDiverged

STEPS_PER_EPOCH, EPOCHS = 4, 3
# a one-block ViT, 4 steps of 32 digits per epoch, deterministic kernels, no progress bar
TINY = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2", "data.batch_size=32",
        f"trainer.limit_train_batches={STEPS_PER_EPOCH}", "trainer.limit_val_batches=2", f"trainer.max_epochs={EPOCHS}",
        "trainer.log_every_n_steps=1", "trainer.deterministic=true", "trainer.enable_progress_bar=false",
        "callbacks.rich_progress_bar=null", "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1"]

# run `train(cfg)` in a child process that SIGKILLs itself when the given optimizer step is about to run
KILLER = textwrap.dedent("""
    import os, signal, sys
    from hydra import compose, initialize_config_dir
    from vitzoo.training import VitModule, train
    kill_at, run_dir, overrides = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    step = VitModule.training_step
    def killing_step(self, batch, batch_idx):
        if self.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self, batch, batch_idx)
    VitModule.training_step = killing_step
    with initialize_config_dir({configs!r}, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    cfg.paths.output_dir = run_dir
    train(cfg)
""").format(configs=str(CONFIGS))


pytestmark = pytest.mark.usefixtures("one_thread")

# run the `vitzoo-train` command line (`train.py <args>`) in a child process that gets Ctrl-C when the given optimizer
# step is about to run
INTERRUPTER = textwrap.dedent("""
    import sys
    import vitzoo.train
    from vitzoo.training import VitModule
    stop_at, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    step = VitModule.training_step
    def interrupted_step(self, batch, batch_idx):
        if self.global_step == stop_at:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)
    VitModule.training_step = interrupted_step
    sys.argv = [script, *args]
    vitzoo.train.main()
""")


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT)}


def run_killed(tmp_path, run_dir, kill_at, extra=()):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    proc = subprocess.run([sys.executable, str(script), str(kill_at), str(run_dir), *TINY, *extra], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["status"] == "running"  # what a SIGKILL leaves


def last_ckpt(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_auto_resume_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    every = ["callbacks.model_checkpoint.every_n_train_steps=2"]
    run_killed(tmp_path, run_dir, kill_at=STEPS_PER_EPOCH + 3, extra=every)  # epoch 1, third batch
    killed = last_ckpt(run_dir)
    assert killed["global_step"] == STEPS_PER_EPOCH + 2 and killed["epoch"] == 1  # the mid-epoch step checkpoint
    assert not list((run_dir / "checkpoints").glob("*.tmp"))

    proc = run_entry("train.py", *TINY, *every, "ckpt_path=auto", f"hydra.run.dir={run_dir}", env=env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the previous run was killed; treating it as interrupted" in proc.stdout
    assert f"ckpt_path=auto: resuming from {run_dir / 'checkpoints' / 'last.ckpt'}" in proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "finished" and results["epochs"] == EPOCHS
    assert results["previous_status"] == "interrupted" and results["resumed_from"].endswith("last.ckpt")
    final = last_ckpt(run_dir)
    assert final["global_step"] == EPOCHS * STEPS_PER_EPOCH
    log = pd.read_csv(run_dir / "csv" / "metrics.csv")  # appended across the resume (old columns kept)
    assert log["train/loss_step"].notna().sum() >= EPOCHS * STEPS_PER_EPOCH
    # (+ the final best-checkpoint validation)
    assert set(log.loc[log["val/acc"].notna(), "epoch"]) >= set(range(EPOCHS))


@pytest.mark.slow
def test_kill_at_epoch_boundary_and_resume_is_bit_exact(tmp_path):
    whole = tmp_path / "whole"
    train(compose_cfg(TINY, whole))
    resumed = tmp_path / "resumed"
    run_killed(tmp_path, resumed, kill_at=STEPS_PER_EPOCH)  # first step of epoch 1: epoch 0's checkpoint is the last
    assert last_ckpt(resumed)["global_step"] == STEPS_PER_EPOCH
    results = train(compose_cfg([*TINY, "ckpt_path=auto"], resumed))
    assert results["status"] == "finished" and results["epochs"] == EPOCHS
    a, b = last_ckpt(whole), last_ckpt(resumed)
    assert a["global_step"] == b["global_step"] == EPOCHS * STEPS_PER_EPOCH
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name


def run_files(run_dir):
    """Every file of a run folder: its bytes and modification time, by path."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_interrupted_run_of_another_backend_resumes_with_the_printed_command(tmp_path):
    """Ctrl-C prints a command; pasted as it is (from another folder), it resumes the `window` run and finishes it
    with the run's own options. Before that, a resume naming another backend or model is refused in one line
    naming the option, and no file of the run changes."""
    run_dir = tmp_path / "run"
    script = tmp_path / "interrupter.py"
    script.write_text(INTERRUPTER)
    args = ["attention=window", "attention.window_size=2", *TINY, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, str(script), str(STEPS_PER_EPOCH + 1), str(ROOT / "train.py"), *args],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    command = re.search(r"interrupted; resume with: (.+)", proc.stderr).group(1)
    assert command.split()[2:] == ["ckpt_path=auto", f"hydra.run.dir={run_dir}"], proc.stderr[-2000:]
    assert json.loads((run_dir / "results.json").read_text())["status"] == "interrupted"

    before = run_files(run_dir)
    for other, named in [("attention=global", "attention.name=global (the run has window)"),
                         ("+model.depth=2", "model.depth=2 (the run has 1)")]:
        refused = run_entry("train.py", other, "ckpt_path=auto", f"hydra.run.dir={run_dir}", env=env())
        errors = [line for line in refused.stderr.splitlines() if "error" in line.lower()]
        assert refused.returncode == 1 and len(errors) == 1 and errors[0].startswith("error: "), refused.stderr
        assert named in errors[0] and "Traceback" not in refused.stderr
        assert run_files(run_dir) == before  # .hydra/overrides.yaml, results.json, checkpoints, logs

    pasted = shlex.split(command)
    assert pasted[0] == "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = subprocess.run([sys.executable, *pasted[1:]], cwd=elsewhere, env=env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "finished" and results["attention"] == "window" and results["epochs"] == EPOCHS
    assert results["segments"] == 2 and results["previous_status"] == "interrupted"
    final = last_ckpt(run_dir)
    assert final["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert final["config"]["attention"]["name"] == "window" and final["config"]["attention"]["window_size"] == 2
    assert final["config"]["model"]["depth"] == 1
    assert (run_dir / ".hydra" / "overrides.yaml").read_bytes() == before[run_dir / ".hydra" / "overrides.yaml"][0]


def test_auto_without_checkpoint_starts_fresh_and_says_so(tmp_path, capsys):
    results = train(
        compose_cfg(
            [*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=1", "export=false", "ckpt_path=auto"], tmp_path
        )
    )
    assert results["status"] == "finished" and results["resumed_from"] is None
    assert f"ckpt_path=auto: no checkpoint in {tmp_path / 'checkpoints'}; starting fresh" in capsys.readouterr().out


def test_sigterm_marks_interrupted_and_the_run_resumes(tmp_path, monkeypatch):
    step = VitModule.training_step

    def terminated_step(self, batch, batch_idx):
        if self.global_step == STEPS_PER_EPOCH + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler stops after this batch
        return step(self, batch, batch_idx)

    monkeypatch.setattr(VitModule, "training_step", terminated_step)
    with pytest.raises(SystemExit, match=r"interrupted; resume with: vitzoo-train ckpt_path=auto hydra.run.dir=/"):
        train(compose_cfg(TINY, tmp_path))
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(VitModule, "training_step", step)
    results = train(compose_cfg([*TINY, "ckpt_path=auto"], tmp_path))
    assert results["status"] == "finished" and results["previous_status"] == "interrupted"
    assert last_ckpt(tmp_path)["global_step"] == EPOCHS * STEPS_PER_EPOCH


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    step = VitModule.training_step

    def nan_step(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        return loss * float("nan") if self.global_step == 5 else loss

    monkeypatch.setattr(VitModule, "training_step", nan_step)
    cfg = compose_cfg([*TINY, "callbacks.model_checkpoint.every_n_train_steps=2"], tmp_path)
    with pytest.raises(
        TrainingDiverged,
        match=r"train/loss is nan at step 5 \(epoch 1\); stopped before the update, "
        r"last good checkpoint: .*last.ckpt; lower optim.lr",
    ) as err:
        train(cfg)
    assert "\n" not in str(err.value)
    kept = last_ckpt(tmp_path)
    assert kept["global_step"] == 4 and all(torch.isfinite(t).all() for t in kept["state_dict"].values())
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, target)

    def crash(checkpoint, path):  # the process dies half-way through writing
        open(path, "wb").write(b"half")
        raise OSError("crash mid-write")

    monkeypatch.setattr("lightning_fabric.plugins.io.torch_io._atomic_save", crash)
    with pytest.raises(OSError, match="crash mid-write"):
        AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(2)}, target)
    assert torch.load(target, weights_only=True)["step"] == 1  # the old checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left
