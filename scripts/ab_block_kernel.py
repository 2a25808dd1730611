"""A/B timing of vitzoo's compiled block-attention kernel against the PyTorch path, in one process.

Alternating blocks of one attention layer (C = 128, 4 heads, batch 4, a square grid), the kernel switched by
``VITZOO_BLOCK_KERNEL`` between blocks; training steps (forward + backward) or inference (``torch.no_grad``).
Prints the largest output difference and the per-block ratios (PyTorch path time / kernel time).

    python scripts/ab_block_kernel.py --attention bigbird,local --tokens 4096 --mode train infer
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

from vitzoo.attention import MixerContext, _block_kernel, build_attention
from vitzoo.bench.memory import _malloc_live


def layer_call(name: str, tokens: int, mode: str):
    """One call of the layer: a training step returning the input gradient, or an inference forward."""
    side = math.isqrt(tokens)
    ctx = MixerContext(128, 4, (side, side), 0, qkv_bias=True, layer_index=0, window=8)
    layer = build_attention(name, ctx).train(mode == "train")
    x = torch.randn(4, side * side, 128, requires_grad=mode == "train")
    gy = torch.randn_like(x)

    def train() -> torch.Tensor:
        x.grad = None
        layer(x, (side, side)).backward(gy)
        return x.grad

    def infer() -> torch.Tensor:
        with torch.no_grad():
            return layer(x, (side, side))
    return train if mode == "train" else infer


def timed(fn, kernel: bool, steps: int) -> tuple[float, torch.Tensor]:
    os.environ[_block_kernel.ENV] = "1" if kernel else "0"
    t = time.perf_counter()
    for _ in range(steps):
        out = fn()
    return (time.perf_counter() - t) / steps, out.detach().clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", default="bigbird,local", help="comma-separated fixed-pattern backends")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per image (a square grid)")
    parser.add_argument("--mode", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    parser.add_argument("--blocks", type=int, default=6, help="block pairs (kernel, PyTorch path alternating)")
    parser.add_argument("--steps", type=int, default=3, help="calls per block")
    args = parser.parse_args()
    if _block_kernel.kernel() is None:
        raise SystemExit(f"the block attention kernel is not available here (a C++ compiler and ninja are needed; "
                         f"{_block_kernel.ENV} must not be 0)")
    _malloc_live(False)
    for name in args.attention.split(","):
        for mode in args.mode:
            fn = layer_call(name, args.tokens, mode)
            for kernel in (True, False):
                timed(fn, kernel, 1)  # warm-up of both paths
            ratios, fast, slow = [], [], []
            for block in range(args.blocks):
                order = (True, False) if block % 2 == 0 else (False, True)
                times = {}
                for kernel in order:
                    times[kernel], out = timed(fn, kernel, args.steps)
                    (fast if kernel else slow).append(out)
                ratios.append(times[False] / times[True])
            diff = (fast[-1] - slow[-1]).abs().max().item()
            print(f"{name} {mode}, {args.tokens} tokens: kernel faster by {statistics.median(ratios):.3f}x "
                  f"(blocks {', '.join(f'{r:.3f}' for r in ratios)}); max |kernel - torch| {diff:.2e}")


if __name__ == "__main__":
    main()
