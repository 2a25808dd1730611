"""A/B timing of whole modules: a git revision's version of vitzoo modules against the working tree's,
on one attention layer or one model training step, in alternating blocks in one process.

The revision's files are imported as separate modules; for the A blocks every vitzoo module that imported
one of their functions or classes (``from vitzoo.ops.gather import block_attention``) is pointed at
the revision's object of the same name, for the B blocks back at the working tree's. Both run the same
weights on the same input with the benchmark's steady malloc thresholds. Prints the largest difference of
the input gradient (layer) or of the parameter gradients (model), the median time of each side and the
ratio per block pair (the machine's drift cancels in a ratio measured this way).

    python tools/ab_module.py --rev HEAD~1 --module vitzoo.ops.gather --attention bigbird --tokens 4096
    python tools/ab_module.py --rev HEAD~1 --module vitzoo.ops.window \
        --model swin_cifar --attention window
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from types import ModuleType
from typing import Callable

import torch
from revision import load_revision  # tools/ is the script's import path

from vitzoo.measure.memory import _malloc_live
from vitzoo.measure.timing import time_fns


def importer_slots(name: str, old: ModuleType) -> list[tuple[ModuleType, str, object, object]]:
    """``(module, attribute, new object, old object)`` for each vitzoo module attribute bound to a function or
    class of module ``name`` that the revision ``old`` also has."""
    new = importlib.import_module(name)
    ours = {id(v): k for k, v in vars(new).items() if getattr(v, "__module__", None) == name}
    slots = []
    for module in [m for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("vitzoo")]:
        if module is new:
            continue
        for attr, value in vars(module).items():
            key = ours.get(id(value))
            if key is not None and hasattr(old, key):
                slots.append((module, attr, value, getattr(old, key)))
    return slots


def layer_step(attention: str, tokens: int, train: bool = True) -> tuple[Callable[[], torch.Tensor], torch.nn.Module]:
    """One forward + backward of one layer (C = 128, 4 heads, batch 4, a square grid), returning the input
    gradient; with ``train=False`` one inference forward (``torch.no_grad``, eval mode), returning the output."""
    from vitzoo.attention import MixerContext, build_attention

    side = math.isqrt(tokens)
    ctx = MixerContext(128, 4, (side, side), 0, qkv_bias=True, layer_index=0, window=8)
    layer = build_attention(attention, ctx).train(train)
    x = torch.randn(4, side * side, 128, requires_grad=train)
    gy = torch.randn_like(x)

    def step() -> torch.Tensor:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x, (side, side)).backward(gy)
        return x.grad.clone()

    @torch.no_grad()
    def infer() -> torch.Tensor:
        return layer(x, (side, side))

    return (step if train else infer), layer


def model_step(model: str, attention: str) -> tuple[Callable[[], torch.Tensor], torch.nn.Module]:
    """One training step's forward + backward of ``model`` (batch 64, 32 px): returns the flat parameter gradients."""
    import vitzoo

    net = vitzoo.create_model(model, attention=attention).train()
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step() -> torch.Tensor:
        net.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same drop-path draws on both sides
        torch.nn.functional.cross_entropy(net(x), y).backward()
        return torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])

    return step, net


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="HEAD", help="git revision of the A side")
    p.add_argument(
        "--module", nargs="+", required=True, help="dotted vitzoo modules to swap (e.g. vitzoo.ops.gather)"
    )
    p.add_argument("--attention", default="global", help="attention backend")
    p.add_argument("--model", default=None, help="time a model's training step (e.g. swin_cifar) instead of one layer")
    p.add_argument("--tokens", type=int, default=4096, help="layer mode: sequence length (a square grid)")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per side (alternating)")
    p.add_argument("--steps", type=int, default=3, help="steps per block")
    args = p.parse_args()
    _malloc_live(False)  # the benchmark's steady thresholds: freed tensors stay in the heap
    torch.manual_seed(0)
    step, _ = model_step(args.model, args.attention) if args.model else layer_step(args.attention, args.tokens)
    try:
        slots = [s for name in args.module for s in importer_slots(name, load_revision(name, args.rev))]
    except ValueError as e:
        sys.exit(f"{e} (pass --rev a revision of this repository and --module a dotted vitzoo module)")
    if not slots:
        sys.exit(
            f"no vitzoo module imports anything from {args.module}: nothing to swap (pass --module a module "
            "whose functions or classes other modules import)"
        )

    def call(side: str) -> torch.Tensor:
        """One step with the revision's objects (A) or the working tree's (B) bound to the importers' names."""
        for module, attr, new, old in slots:
            setattr(module, attr, old if side == "A" else new)
        try:
            return step()
        finally:
            for module, attr, new, _old in slots:
                setattr(module, attr, new)

    ga, gb = call("A"), call("B")  # both sides' gradients
    print(f"swapped {len(slots)} names: {sorted({f'{m.__name__}.{a}' for m, a, _, _ in slots})}")
    print(
        f"max |A - B| of the gradients: {(ga - gb).abs().max().item():.3g} (largest |A|: {ga.abs().max().item():.3g})"
    )
    t = time_fns(
        {"A": lambda: call("A"), "B": lambda: call("B")},
        torch.device("cpu"),
        warmup=2,
        repeats=args.blocks,
        min_time=0,
        max_time=0,
        iters=args.steps,
    )  # alternating blocks (ABBA)
    a, b = t["A"].median, t["B"].median
    pairs = [round(x / y, 3) for x, y in zip(t["A"].seconds, t["B"].seconds)]
    what = f"{args.model} + {args.attention}" if args.model else f"{args.attention} layer, {args.tokens} tokens"
    print(
        f"{what}: A ({args.rev}) {a * 1e3:.1f} ms, B (working tree) {b * 1e3:.1f} ms per step; "
        f"B faster by {a / b:.3f}x (blocks {pairs})"
    )


if __name__ == "__main__":
    main()
