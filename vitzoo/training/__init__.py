"""Training and evaluation with Lightning + Hydra: ``train(cfg)`` and ``evaluate(cfg)`` are what the
thin entry points ``train.py`` / ``eval.py`` call (configs in ``configs/train.yaml``, ``configs/eval.yaml``)."""
from hydra.core.config_store import ConfigStore

from vitzoo.training.data import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from vitzoo.training.evaluate import evaluate
from vitzoo.training.module import OptimConfig, VitModule
from vitzoo.training.train import fit, train
from vitzoo.training.utils import BenchmarkConfig, run_entry

# `optim: default` and `benchmark: default` in configs/train.yaml and eval.yaml: the dataclasses are the one
# source of their defaults (Hydra checks keys and types; `optim.lr=3e-4` works without a `+`)
ConfigStore.instance().store(group="optim", name="default", node=OptimConfig)
ConfigStore.instance().store(group="benchmark", name="default", node=BenchmarkConfig)

__all__ = ["BenchmarkConfig", "CIFARDataModule", "DigitsDataModule", "ImageDataModule", "ImageFolderDataModule",
           "OptimConfig", "VitModule", "evaluate", "fit", "run_entry", "train"]
