"""Evaluate a checkpoint: ``vitzoo-eval ckpt_path=outputs/…/checkpoints/last.ckpt`` or ``python -m vitzoo.eval ...``
(options: ``configs/eval.yaml``)."""
import hydra
from omegaconf import DictConfig

from vitzoo.configs import CONFIG_DIR
from vitzoo.training import evaluate, run_entry
from vitzoo.training.cli import check_command_line


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval")
def hydra_main(cfg: DictConfig) -> None:
    run_entry(evaluate, cfg)


def main() -> None:
    """The ``vitzoo-eval`` command: a bad ``group=option`` is one line naming the choices, then Hydra runs."""
    check_command_line(config_name="eval")
    hydra_main()


if __name__ == "__main__":
    main()
