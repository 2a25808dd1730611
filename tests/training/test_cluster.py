"""Multi-node configs compose without a cluster: ``hydra/launcher=slurm`` produces the sbatch script submitit
would submit (nodes, tasks and GPUs follow the trainer), ``trainer=fsdp`` builds Lightning's FSDPStrategy."""
from __future__ import annotations

import os

import pytest
from helpers import compose_cfg
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

import vitzoo.training  # noqa: F401  (registers the optim/benchmark structured configs train.yaml composes)

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")


def test_slurm_launcher_generates_the_submitit_job(tmp_path, monkeypatch):
    import submitit

    cfg = compose_cfg(["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2",
                       "hydra.launcher.partition=gpu", f"hydra.sweep.dir={tmp_path}"], hydra=True)
    HydraConfig.instance().set_config(cfg)  # what a running `-m` has; the launcher reads hydra.* from it
    launcher = instantiate(cfg.hydra.launcher)
    assert launcher.params["nodes"] == 2 and launcher.params["tasks_per_node"] == 4 == launcher.params["gpus_per_node"]
    launcher.setup(hydra_context=None, task_function=lambda c: None, config=cfg)
    submitted = {}

    def capture(self, fn, *args):  # stop where submitit would call sbatch
        submitted["executor"] = self
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
    fake_bin = tmp_path / "bin"  # submitit looks for srun on PATH before it writes anything
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    launcher.launch([["seed=1"]], initial_job_idx=0)
    script = submitted["executor"]._executor._make_submission_file_text("python train.py", "0")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --time=1440", "#SBATCH --signal=USR2@120", "srun"):
        assert line in script, f"{line} not in:\n{script}"


def test_fsdp_composes_and_wraps_every_block():
    from pytorch_lightning.strategies import FSDPStrategy

    from vitzoo.layers.block import Block
    from vitzoo.training.safe_load import check_targets

    cfg = compose_cfg(["trainer=fsdp", "model=vit_base"])
    check_targets(cfg.trainer, "trainer", "trainer")  # the strategy's _target_ is allow-listed
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy) and cfg.trainer.accelerator == "gpu"
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy.sharding_strategy.name == "FULL_SHARD" and strategy._state_dict_type == "full"
