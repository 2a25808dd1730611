"""A/B timing of the kernel-attention core (performer, rfa, linear): a git revision's
``vitzoo/attention/_kernel_core.py`` against the working tree's, in alternating blocks in one process.

One (image, head)-chunked forward + backward of ``feature_attention_qkv`` on ``qkv[B, N, 3C]`` (C = 128,
4 heads, batch 4 by default), as the layer benchmark runs it, with the benchmark's steady malloc
thresholds. Prints both versions' largest output/gradient difference and the median time of each,
and the ratio per block pair (the machine's drift cancels in a ratio measured this way). Where the compiled
kernel is built, both sides run it for ``exp`` and ``fourier``: set ``VITZOO_CPU_KERNELS=0`` to time the PyTorch
paths (``tools/ab_cpu_kernel.py`` times the kernel against the PyTorch path).

    python tools/ab_kernel_core.py --kind exp --tokens 4096 --rev HEAD~1
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

import torch
from revision import load_revision  # tools/ is the script's import path

from vitzoo.measure.memory import _malloc_live
from vitzoo.measure.timing import time_fns

CORE = "vitzoo.ops.feature"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--kind", choices=["exp", "fourier", "elu"], default="exp", help="feature map (performer, rfa, linear)"
    )
    p.add_argument("--tokens", type=int, default=4096, help="sequence length N")
    p.add_argument("--features", type=int, default=256, help="random features m (exp, fourier)")
    p.add_argument("--rev", default="HEAD", help="git revision of the A side")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per side (alternating)")
    args = p.parse_args()
    _malloc_live(False)  # the benchmark's steady thresholds: freed tensors stay in the heap
    try:
        a = load_revision(CORE, args.rev)
    except ValueError as e:
        sys.exit(f"{e} (pass --rev a revision of this repository)")
    b = importlib.import_module(CORE)

    torch.manual_seed(0)
    B, h, d, m, N = 4, 4, 32, args.features, args.tokens
    qkv = (0.5 * torch.randn(B, N, 3 * h * d)).requires_grad_()
    omega = {"exp": torch.randn(m, d), "fourier": torch.randn(h, m // 2, d), "elu": None}[args.kind]
    scale = torch.rand(h, 1, d) + 0.5 if args.kind == "fourier" else None
    eps = {"exp": 1e-6, "fourier": 1e-3, "elu": None}[args.kind]
    factor = 2 / m if args.kind == "fourier" else 1.0
    grad = torch.randn(B, N, h * d)

    def step(core: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
        qkv.grad = None
        out = core.feature_attention_qkv(args.kind, qkv, h, omega, scale, eps, factor)
        out.backward(grad)
        return out.detach(), qkv.grad

    (ya, ga), (yb, gb) = (tuple(t.clone() for t in step(core)) for core in (a, b))
    print(f"max |A - B|: output {(ya - yb).abs().max().item():.3g}, qkv gradient {(ga - gb).abs().max().item():.3g}")
    t = time_fns(
        {"a": lambda: step(a), "b": lambda: step(b)},
        torch.device("cpu"),
        warmup=2,
        repeats=args.blocks,
        min_time=0,
        max_time=0,
        iters=4,
    )  # alternating blocks (ABBA)
    pairs = [round(x / y, 3) for x, y in zip(t["a"].seconds, t["b"].seconds)]
    print(
        f"{args.kind} N={N} m={m}: A ({args.rev}) {t['a'].median * 1e3:.1f} ms, B (working tree) "
        f"{t['b'].median * 1e3:.1f} ms, B faster by {t['a'].median / t['b'].median:.3f}x (per block pair {pairs})"
    )


if __name__ == "__main__":
    main()
