"""A/B training speed of two model configurations of one variant, in alternating blocks in one process.

Builds the variant twice (``--a`` and ``--b``: JSON objects of model options, e.g. the CIFAR-10 recipe's stem and
pooling against the plain patchify ViT), then times full training steps (forward, backward and an AdamW step,
bf16 autocast with ``--amp``) in alternating blocks (ABBA, :func:`vitzoo.measure.timing.time_fns`) and prints the
images/s of each and the per-block ratios: the machine's drift cancels in a ratio measured this way.

    python tools/ab_recipe.py --model vit_cifar --b '{"stem": "conv", "global_pool": "avg"}' --batch 128 --amp
    python tools/ab_recipe.py --b '{"stem": "conv"}' --batch 128 --batch-b 64 --amp   # each recipe at its own batch
"""
from __future__ import annotations

import argparse
import json
import platform

import torch

from vitzoo.measure.environment import cpu_model
from vitzoo.measure.timing import time_fns
from vitzoo.models import create_model


def train_step(model: str, options: dict, x: torch.Tensor, y: torch.Tensor, amp: bool):
    """A function doing one training step of ``model`` built with ``options`` (AdamW, cross entropy).

    Args:
        model: a registered model variant.
        options: model config fields.
        x: images ``[B, 3, H, W]``; y: labels ``[B]``.
        amp: bf16 autocast.
    """
    torch.manual_seed(0)
    net = create_model(model, **options).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def call():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        loss.backward()
        opt.step()
    return call, net.flops() / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_cifar", help="model variant")
    p.add_argument("--a", default="{}", help="model options of A (JSON)")
    p.add_argument("--b", required=True, help="model options of B (JSON)")
    p.add_argument("--batch", type=int, default=128, help="images per step (A, and B unless --batch-b)")
    p.add_argument("--batch-b", type=int, default=None, help="images per step of B (default: --batch)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per side (alternating)")
    p.add_argument("--steps", type=int, default=5, help="steps per block")
    args = p.parse_args()
    opts = {"A": json.loads(args.a), "B": json.loads(args.b)}
    size = create_model(args.model).cfg.img_size
    batch = {"A": args.batch, "B": args.batch_b or args.batch}
    fns, gmacs = {}, {}
    for name, o in opts.items():
        x, y = torch.randn(batch[name], 3, size, size), torch.randint(0, 10, (batch[name],))
        fns[name], gmacs[name] = train_step(args.model, o, x, y, args.amp)
    t = time_fns(fns, torch.device("cpu"), warmup=2, repeats=args.blocks, min_time=0, max_time=0, iters=args.steps)
    print(f"{cpu_model()} ({platform.machine()}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'bf16' if args.amp else 'fp32'}")
    for name in opts:
        print(f"{name} {opts[name]}, batch {batch[name]}: {gmacs[name]:.4f} GMACs/image, "
              f"{batch[name] / t[name].median:.1f} train img/s")
    speed = {name: [batch[name] / s for s in t[name].seconds] for name in opts}  # images/s per block
    pairs = ", ".join(f"{b / a:.3f}" for a, b in zip(speed["A"], speed["B"]))
    print(f"B / A speed (images/s): {batch['B'] / t['B'].median / (batch['A'] / t['A'].median):.3f} "
          f"(per block: {pairs})")


if __name__ == "__main__":
    main()
