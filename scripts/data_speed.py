#!/usr/bin/env python
"""Does the data pipeline keep up with the model? Training images/s of ``experiment=cifar10_vit`` fed by its
DataModule (uint8 cache + batched device augmentation) against the same model on in-memory tensors, same batch,
alternating blocks in one process (:mod:`vitzoo.bench.data_speed`). Goal: ratio >= 0.95.

    VITZOO_CIFAR10=/path/to/cifar10 python scripts/data_speed.py --device cuda --amp bf16
    python scripts/data_speed.py --blocks 2 --steps 2 data.root=/tmp/tiny model.depth=1   # smoke test
"""
import argparse
import json
import sys
from dataclasses import asdict

from vitzoo.bench.data_speed import measure
from vitzoo.registry import ConfigError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the experiment, e.g. data.batch_size=256")
    p.add_argument("--experiment", default="cifar10_vit", help="configs/experiment/ name")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per arm (alternating)")
    p.add_argument("--steps", type=int, default=50, help="training steps per block")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per arm first")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--amp", choices=["none", "bf16"], default="none", help="autocast dtype")
    a = p.parse_args(argv)
    try:
        result = measure(a.experiment, a.overrides, a.blocks, a.steps, a.warmup, a.device, a.amp)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
