"""Train a model: ``vitzoo-train attention=window`` or ``python -m vitzoo.train ...`` (options:
``configs/train.yaml``; ``-m`` sweeps). Output folders are relative to the launch folder."""
import sys

import hydra
from omegaconf import DictConfig

from vitzoo.configs import CONFIG_DIR
from vitzoo.registry import ConfigError
from vitzoo.training import run_entry, train
from vitzoo.training.cli import check_command_line
from vitzoo.training.run_overrides import resume_arguments


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def hydra_main(cfg: DictConfig) -> None:
    run_entry(train, cfg)


def main() -> None:
    """The ``vitzoo-train`` command: a bad ``group=option`` is one line naming the choices; ``ckpt_path=auto
    hydra.run.dir=<run>`` takes the run's own options (a contradicting one is one line); then Hydra runs."""
    check_command_line()
    try:
        sys.argv[1:] = resume_arguments(sys.argv[1:])
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    hydra_main()


if __name__ == "__main__":
    main()
