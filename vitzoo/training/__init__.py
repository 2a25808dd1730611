"""Training and evaluation with Lightning + Hydra: ``train(cfg)`` and ``evaluate(cfg)`` are what the
thin entry points ``train.py`` / ``eval.py`` call (configs in ``configs/train.yaml``, ``configs/eval.yaml``)."""
from hydra.core.config_store import ConfigStore

from vitzoo.training.evaluate import evaluate
from vitzoo.training.module import OptimConfig, VitModule, load_checkpoint_net
from vitzoo.training.train import fit, train
from vitzoo.training.utils import BenchmarkConfig, run_entry

# `optim: default` and `benchmark: default` in configs/train.yaml and eval.yaml: the dataclasses are the one
# source of their defaults (Hydra checks keys and types; `optim.lr=3e-4` works without a `+`)
ConfigStore.instance().store(group="optim", name="default", node=OptimConfig)
ConfigStore.instance().store(group="benchmark", name="default", node=BenchmarkConfig)

__all__ = [
    "BenchmarkConfig",
    "OptimConfig",
    "VitModule",
    "evaluate",
    "fit",
    "load_checkpoint_net",
    "run_entry",
    "train",
]
