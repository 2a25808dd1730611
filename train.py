"""Train a model: ``python train.py attention=window`` (options: configs/train.yaml; ``-m`` sweeps)."""
import hydra
from omegaconf import DictConfig

from vitzoo.training import run_entry, train


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_entry(train, cfg)


if __name__ == "__main__":
    main()
