"""Evaluate a checkpoint: ``python eval.py ckpt_path=outputs/…/checkpoints/last.ckpt`` (the ``vitzoo-eval``
command; options: configs/eval.yaml)."""
from vitzoo.eval import main

if __name__ == "__main__":
    main()
