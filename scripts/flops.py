#!/usr/bin/env python
"""FLOPs you can trust: analytic next to measured multiply-adds (MACs), per module, for vitzoo models.

    python scripts/flops.py model=swin_tiny attention=window     # the per-module table
    python scripts/flops.py --all | --scaling | --formulas | --published
    python scripts/flops.py --help                               # every override and example

The logic lives in :mod:`vitzoo.flops.cli`; conventions in ``docs/flops.md`` and :mod:`vitzoo.flops`.
"""
import sys

from vitzoo.flops.cli import main

if __name__ == "__main__":
    sys.exit(main())
