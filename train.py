"""Train a model: ``python train.py attention=window`` (the ``vitzoo-train`` command; options:
configs/train.yaml; ``-m`` sweeps)."""
from vitzoo.train import main

if __name__ == "__main__":
    main()
