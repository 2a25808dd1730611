"""A/B timing of vitzoo's compiled CPU kernels against the PyTorch path, in one process.

Alternating blocks (ABBA, :func:`vitzoo.measure.timing.time_fns`) of one attention layer as
``tools/ab_module.py`` builds it (C = 128, 4 heads, batch 4, a square grid), the kernels
(:mod:`vitzoo.cpu_kernels.loader`: block attention for the fixed patterns, random features for performer and rfa)
switched by ``VITZOO_CPU_KERNELS`` between blocks; training steps (forward + backward) or inference
(``torch.no_grad``).
Prints the largest difference of the input gradient (train) or output (infer) and the per-block ratios
(PyTorch path time / kernel time).

    python tools/ab_cpu_kernel.py --attention bigbird,local,performer,rfa --tokens 4096 --mode train infer
"""
from __future__ import annotations

import argparse
import os
from typing import Callable

import torch
from ab_module import layer_step  # tools/ is the script's import path

from vitzoo.cpu_kernels import loader
from vitzoo.measure.memory import _malloc_live
from vitzoo.measure.timing import time_fns


def switched(step: Callable[[], torch.Tensor], kernel: bool) -> Callable[[], torch.Tensor]:
    """``step`` with the kernels on or off (the environment variable is read at every call)."""
    def call() -> torch.Tensor:
        os.environ[loader.ENV] = "1" if kernel else "0"
        return step()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", default="bigbird,local,performer,rfa",
                        help="comma-separated backends with a compiled kernel (fixed patterns, performer, rfa)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per image (a square grid)")
    parser.add_argument("--mode", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    parser.add_argument("--blocks", type=int, default=6, help="timed blocks per side (alternating)")
    parser.add_argument("--steps", type=int, default=3, help="calls per block")
    args = parser.parse_args()
    missing = [stem for stem in ("block_attention", "feature_attention") if loader.extension(stem) is None]
    if missing:
        raise SystemExit(f"the {', '.join(missing)} kernel is not available here (a C++ compiler and ninja are "
                         f"needed; {loader.ENV} must not be 0)")
    _malloc_live(False)  # the benchmark's steady thresholds: freed tensors stay in the heap
    for name in args.attention.split(","):
        for mode in args.mode:
            step, _ = layer_step(name, args.tokens, train=mode == "train")
            fns = {"torch": switched(step, False), "kernel": switched(step, True)}
            diff = (fns["kernel"]() - fns["torch"]()).abs().max().item()
            t = time_fns(fns, torch.device("cpu"), warmup=1, repeats=args.blocks, min_time=0, max_time=0,
                         iters=args.steps)
            ratio = t["torch"].median / t["kernel"].median
            pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(t["torch"].seconds, t["kernel"].seconds))
            print(f"{name} {mode}, {args.tokens} tokens: kernel faster by {ratio:.3f}x (blocks {pairs}); "
                  f"max |kernel - torch| {diff:.2e}")


if __name__ == "__main__":
    main()
