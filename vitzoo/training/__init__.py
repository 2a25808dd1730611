"""Training and evaluation with Lightning + Hydra: ``train(cfg)`` and ``evaluate(cfg)`` are what the
thin entry points ``train.py`` / ``eval.py`` call (configs in ``configs/train.yaml``, ``configs/eval.yaml``)."""
from vitzoo.training.data import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from vitzoo.training.evaluate import evaluate
from vitzoo.training.module import VitModule
from vitzoo.training.train import fit, train
from vitzoo.training.utils import run_entry

__all__ = ["CIFARDataModule", "DigitsDataModule", "ImageDataModule", "ImageFolderDataModule", "VitModule", "evaluate",
           "fit", "run_entry", "train"]
