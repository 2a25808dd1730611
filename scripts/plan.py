#!/usr/bin/env python
"""Plan a training run before it runs: parameters, GMACs, activation and peak memory, fit and hours per epoch.

    python scripts/plan.py model=vit_base attention=local model.img_size=1024 data.batch_size=64 --device h100-80gb
    python scripts/plan.py model=vit_base model.img_size=1024 --all [--csv]   # every backend
    python scripts/plan.py --help                                             # flags and devices

The model is built and counted on the meta device; the logic lives in :mod:`vitzoo.bench.plan_cli`.
"""
import sys
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit deprecation notices on import (fvcore, timm)

from vitzoo.bench.plan_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
