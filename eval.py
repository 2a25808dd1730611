"""Evaluate a checkpoint: ``python eval.py ckpt_path=outputs/…/checkpoints/last.ckpt`` (configs/eval.yaml)."""
import hydra
from omegaconf import DictConfig

from vitzoo.training import evaluate, run_entry
from vitzoo.training.cli import check_command_line


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    run_entry(evaluate, cfg)


if __name__ == "__main__":
    check_command_line()  # attention=bogus: one line naming the choices
    main()
