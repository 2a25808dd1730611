"""Two CPU processes (DDP over gloo) train like one process with the same global batch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT
from hydra import compose, initialize_config_dir

from vitzoo.training import train

# one fixed batch of 32 digits (overfit_batches=1: no shuffling, so the 2 ranks' shards of 16 are exactly the
# single process's batch of 32), no stochastic depth (its draws would differ per rank), 6 optimizer steps
COMMON = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2", "model.drop_path_rate=0.0",
          "trainer.overfit_batches=1", "trainer.max_epochs=6", "trainer.num_sanity_val_steps=0",
          "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null",
          "optim.warmup_epochs=0", "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1"]


def weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_two_cpu_processes_match_one_process_with_the_same_global_batch(tmp_path):
    ddp_dir, one_dir = tmp_path / "ddp", tmp_path / "one"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            *COMMON,
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "data.batch_size=16",
            f"hydra.run.dir={ddp_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[*COMMON, "data.batch_size=32"])
    cfg.paths.output_dir = str(one_dir)
    one = train(cfg)

    ddp = json.loads((ddp_dir / "results.json").read_text())
    assert ddp["status"] == "finished" and ddp["epochs"] == one["epochs"] == 6
    # rank 0 alone wrote the run's files: no per-rank copies, one metrics.csv with reduced metrics
    assert sorted(p.name for p in (ddp_dir / "checkpoints").iterdir()) == sorted(
        p.name for p in (one_dir / "checkpoints").iterdir()
    )
    assert not list(ddp_dir.rglob("*rank*")) and (ddp_dir / "export" / "model.safetensors").is_file()
    # The same 32 images, the same initial weights, gradients averaged over 2x16 instead of 1x32: they differ
    # only by float32 summation order (~1e-7 relative). AdamW divides by sqrt(v), so after 6 steps of lr 1e-3 a
    # weight may differ by ~1e-6; 1e-4 is 10% of one step, far below what a wrong reduction (a rank's half
    # batch only, or a summed instead of averaged gradient) produces: each of those moves weights by ~lr.
    a, b = weights(ddp_dir), weights(one_dir)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-4, msg=name)
    assert one["val_loss"] == pytest.approx(ddp["val_loss"], abs=1e-4)  # val/loss reduced over both ranks (sync_dist)
