"""A/B timing of a ViT with and without token reduction, in alternating blocks in one process.

Builds the model twice from the same weights seed (``model.token_reduction`` null and the chosen reducer),
prints both analytic GMACs per image, then times inference (``torch.no_grad``, eval mode) or training steps
(forward + backward) in alternating blocks (ABBA, :func:`vitzoo.measure.timing.time_fns`) and prints the
per-block ratios (without / with): the machine's drift cancels in a ratio measured this way.

    python tools/ab_token_reduction.py --model vit_small --img-size 224 --reduction tome --r 13 --batch 8
"""
from __future__ import annotations

import argparse
import platform

import torch

from vitzoo.measure.environment import cpu_model
from vitzoo.measure.timing import time_fns
from vitzoo.models import create_model


def build(model: str, img_size: int, reduction) -> tuple[torch.nn.Module, float]:
    """The model in eval mode and its analytic GMACs per image.

    Args:
        model: a registered model variant.
        img_size: input side in pixels.
        reduction: ``model.token_reduction`` (None or a dict with ``name`` and its options).
    """
    torch.manual_seed(0)
    net = create_model(model, img_size=img_size, token_reduction=reduction).eval()
    return net, net.flops(img_size) / 1e9


def step(net: torch.nn.Module, x: torch.Tensor, train: bool, amp: bool):
    """One call: inference under ``no_grad`` or a training step (forward + backward of the logits' sum)."""
    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            if not train:
                with torch.no_grad():
                    return net(x)
            net.zero_grad(set_to_none=True)
            out = net(x)
        out.float().sum().backward()
        return out
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_small", help="model variant")
    p.add_argument("--img-size", type=int, default=224, help="input side in pixels")
    p.add_argument("--reduction", default="tome", help="model.token_reduction: tome, evit or tokenlearner")
    p.add_argument("--r", type=int, default=13, help="tome: tokens merged per block")
    p.add_argument("--batch", type=int, default=8, help="images per call")
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per side (alternating)")
    p.add_argument("--steps", type=int, default=3, help="calls per block")
    args = p.parse_args()
    reduction = {"name": args.reduction, **({"r": args.r} if args.reduction == "tome" else {})}
    plain, g_plain = build(args.model, args.img_size, None)
    reduced, g_reduced = build(args.model, args.img_size, reduction)
    x = torch.randn(args.batch, 3, args.img_size, args.img_size)
    train = args.mode == "train"
    plain.train(train), reduced.train(train)
    fns = {"plain": step(plain, x, train, args.amp), "reduced": step(reduced, x, train, args.amp)}
    t = time_fns(fns, torch.device("cpu"), warmup=1, repeats=args.blocks, min_time=0, max_time=0, iters=args.steps)
    ratio = t["plain"].median / t["reduced"].median
    pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(t["plain"].seconds, t["reduced"].seconds))
    print(f"{cpu_model()} ({platform.machine()}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{args.model} {args.img_size}px, {reduction}: {g_plain:.3f} -> {g_reduced:.3f} GMACs per image "
          f"({1 - g_reduced / g_plain:.1%} fewer)")
    print(f"{args.mode}, batch {args.batch}{', bf16' if args.amp else ''}: plain {t['plain'].median * 1e3:.1f} ms, "
          f"reduced {t['reduced'].median * 1e3:.1f} ms per call; faster by {ratio:.3f}x (blocks {pairs})")


if __name__ == "__main__":
    main()
