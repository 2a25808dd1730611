#!/usr/bin/env python
"""FLOPs you can trust: analytic next to measured multiply-adds (MACs), per module, for vitzoo models.

    python scripts/flops.py model=swin_tiny attention=window     # the per-module table
    python scripts/flops.py --all | --scaling | --formulas | --published
    python scripts/flops.py --help                               # every override and example

The logic lives in :mod:`vitzoo.flops.cli`; conventions in ``docs/flops.md`` and :mod:`vitzoo.flops`.
"""
import sys
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit deprecation notices on import (fvcore, timm)

from vitzoo.flops.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
