#!/usr/bin/env python
"""Training images/s of vit_cifar and swin_cifar with every backend: fp32 vs bf16-mixed vs torch.compile.

    python scripts/precision_table.py --out precision.md                  # every backend, both models
    python scripts/precision_table.py --attention global,window --steps 10

Run it on a quiet machine: the modes alternate in blocks within one process (see :mod:`vitzoo.bench.precision`).
"""
import sys
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit deprecation notices on import (fvcore, timm)

from vitzoo.bench.precision import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
