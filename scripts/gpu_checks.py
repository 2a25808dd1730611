#!/usr/bin/env python
"""Every check that needs a GPU, in one run sized to a time budget (see :mod:`vitzoo.bench.gpu_checks`).

    python scripts/gpu_checks.py --out outputs/gpu_checks --budget 300          # on the GPU machine
    python scripts/gpu_checks.py --device cpu --smoke --out /tmp/gpu_smoke      # toy sizes: test it on a CPU
    python scripts/gpu_checks.py --steps flex,timm                              # some steps only

Steps, in order: flex (FlexAttention and the blocked path against the float64 reference, gradients
included), timm (ViT/Swin against timm, fp32 and bf16), layers (4,096 tokens, flex against blocked
against global), precision (fp32 / bf16-mixed / compile), layers_large (16,384 tokens). No item starts
after --budget seconds; results.json and gpu_checks.md are rewritten after every item.
``scripts/gpu_checks.sh`` is the device command (it installs what the GPU image lacks, then packs the results).
"""
import argparse
import sys
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit deprecation notices on import (fvcore, timm)

from vitzoo.bench.gpu_checks import STEPS, GpuCheckOptions, run_gpu_checks  # noqa: E402
from vitzoo.registry import ConfigError  # noqa: E402


def main(argv=None) -> int:
    d = GpuCheckOptions.__dataclass_fields__
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="outputs/gpu_checks", help="output folder (results.json, gpu_checks.md)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=d["device"].default)
    p.add_argument("--budget", dest="budget_s", type=float, default=d["budget_s"].default,
                   help="seconds after which no new item starts")
    p.add_argument("--smoke", action="store_true", help="toy sizes (a minute on a CPU)")
    p.add_argument("--steps", type=lambda t: [s for s in t.split(",") if s], default=list(STEPS),
                   help=f"comma-separated, from {','.join(STEPS)}")
    p.add_argument("--label", default="", help="kept with the results (e.g. the commit the tree was copied at)")
    try:
        run_gpu_checks(GpuCheckOptions(**vars(p.parse_args(argv))))
    except ConfigError as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
