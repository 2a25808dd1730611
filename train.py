"""Train a model: ``python train.py attention=window`` (options: configs/train.yaml; ``-m`` sweeps)."""
import hydra
from omegaconf import DictConfig

from vitzoo.training import run_entry, train
from vitzoo.training.cli import check_command_line


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_entry(train, cfg)


if __name__ == "__main__":
    check_command_line()  # attention=bogus: one line naming the choices
    main()
