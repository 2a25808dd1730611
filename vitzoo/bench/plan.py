"""Plan a training run before it runs: memory, fit and time from a model built on the meta device.

:func:`footprint` builds the model of a composed train config with its parameters on ``meta`` (no weight
storage), counts its multiply-adds with the analytic ``model.flops()`` and the bytes autograd saves for
backward with :class:`~vitzoo.measure.activations.SavedTensorCounter` on ``meta`` at batch 1 and batch 2,
with and without ``model.grad_checkpointing``. Saved activations grow linearly in the batch: the batch-2
minus batch-1 difference is the per-image part, the rest is fixed.

The **peak model** (:func:`peak_bytes`) of one training step at batch ``b``, in bytes::

    16·P (fp32 parameters, gradients and AdamW's two moments: 4 + 4 + 8 bytes per parameter)
    + fixed + b·per_image                 (saved activations)
    + b·transient_per_image               (allowance for what one step holds beside them)

The transient allowance is the largest single saved tensor of one block (per image); with checkpointing
it adds one block's whole saved set, which the block's backward recomputes and holds while it runs. CUDA's
context, the allocator's fragmentation and the data loader are not in it.

Time (:func:`images_per_second`): a training step is about 3 forward passes, so images/s =
``peak MACs/s × utilisation ÷ (3 × MACs per image)``. The device peaks are datasheet dense-matmul figures
(``cpu-2core``: this machine's measured :func:`~vitzoo.flops.mfu.matmul_peak`); the utilisation is an
assumption, labelled as one wherever it is printed.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from vitzoo.measure.activations import SavedTensorCounter, storage_nbytes
from vitzoo.measure.predicted import ADAMW_STATE_BYTES
from vitzoo.models import create_model
from vitzoo.registry import ConfigError

OPTIMIZER_BYTES = 4 + 4 + ADAMW_STATE_BYTES  # per parameter: fp32 weight + gradient + AdamW's two moments (16)
GB = 1e9  # device memory is sold in decimal gigabytes
ASSUMED_UTILISATION = 0.4  # fraction of the matmul peak a ViT training step reaches (an assumption, labelled)
BLOCK = re.compile(r"^((?:.*\.)?)blocks\.(\d+)(?:\.|$)")  # a module inside block i of a block list (prefix, i)


@dataclass(frozen=True)
class Device:
    """A device the planner knows: memory and dense matmul peaks in multiply-adds per second."""

    memory: float  # bytes the run may use (nominal capacity)
    peak_bf16: float  # MACs/s, bf16 tensor cores (half the datasheet FLOP/s)
    peak_fp32: float  # MACs/s, fp32 without TF32
    source: str  # where the peaks come from


DEVICES = {  # datasheet dense (no sparsity) peaks, FLOP/s ÷ 2
    "h100-80gb": Device(80 * GB, 989.4e12 / 2, 66.9e12 / 2, "H100 SXM datasheet"),
    "a100-80gb": Device(80 * GB, 312e12 / 2, 19.5e12 / 2, "A100 datasheet"),
    "a100-40gb": Device(40 * GB, 312e12 / 2, 19.5e12 / 2, "A100 datasheet"),
    "l4": Device(24 * GB, 121e12 / 2, 30.3e12 / 2, "L4 datasheet"),
    "cpu-2core": Device(0.0, 0.0, 0.0, "this machine: matmul_peak and total RAM"),
}


def device(name: str) -> Device:
    """The :data:`DEVICES` entry ``name``; ``cpu-2core`` reads this machine's RAM and measured matmul peaks.

    Args:
        name: a key of :data:`DEVICES` (``--device``).
    """
    if name not in DEVICES:
        raise ConfigError(f"--device {name!r} is not one of: {', '.join(DEVICES)}")
    if name != "cpu-2core":
        return DEVICES[name]
    from vitzoo.flops.mfu import matmul_peak

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Device(float(memory), matmul_peak("cpu", "bf16"), matmul_peak("cpu", "fp32"), DEVICES[name].source)


@dataclass
class Activations:
    """Saved activation bytes of a training step, linear in the batch: ``fixed + b · per_image``."""

    fixed: int  # bytes at batch 0 (batch-1 count minus per_image)
    per_image: int  # batch-2 count minus batch-1 count
    transient_per_image: int  # allowance per image beside the saved set (see the module docstring)

    def at(self, batch: int) -> int:
        """Saved activation bytes at ``batch``."""
        return self.fixed + batch * self.per_image


@dataclass
class Footprint:
    """What the planner knows of one model: parameters, MACs and saved activations with and without checkpointing."""

    label: str  # model and attention
    params: int
    macs: int  # multiply-adds per image, forward (analytic model.flops())
    plain: Activations
    checkpointed: Activations
    build: str  # "meta" (built on the meta device) or "meta parameters" (index buffers computed on CPU, moved)
    proxy: Optional[str] = None  # how a smaller model stood in (None: the model itself was counted)

    def activations(self, checkpointing: bool) -> Activations:
        """The saved activations with or without ``model.grad_checkpointing``."""
        return self.checkpointed if checkpointing else self.plain


def meta_model(name: str, attention: Any, options: dict[str, Any]) -> tuple[nn.Module, str]:
    """Build ``create_model(name, attention, **options)`` without weight storage.

    Under ``torch.device("meta")`` first. A backend that computes index tables from data while it is built
    (``.item()`` on a meta tensor fails) is built instead on CPU with every parameter replaced by a meta tensor
    as it is registered: the CPU tensor it came from (one at a time) is dropped before any init runs, init runs
    on meta, and the buffers (index tables) move to meta after.

    Args:
        name: model variant.
        attention: the attention config (a dict with ``name``).
        options: model config fields.

    Returns:
        The model (every parameter and buffer on meta) and how it was built (``meta`` or ``meta parameters``).
    """
    try:
        with torch.device("meta"):
            return create_model(name, attention=attention, **options), "meta"
    except (RuntimeError, NotImplementedError):
        pass
    register = nn.Module.register_parameter

    def to_meta(module: nn.Module, key: str, param: Optional[nn.Parameter]) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, key, param)

    nn.Module.register_parameter = to_meta  # nn.Module.__setattr__ of a Parameter goes through it
    try:
        model = create_model(name, attention=attention, **options)
    finally:
        nn.Module.register_parameter = register
    return model.to("meta"), "meta parameters"


@contextmanager
def meta_autocast() -> Iterator[None]:
    """``torch.autocast("meta", ...)`` and ``torch.is_autocast_enabled("meta")`` answered as for ``cpu``.

    Backends that keep a float32 core under autocast turn it off for their input's device type, which meta
    does not have; CPU's autocast state (off in the planner) leaves meta tensors as they are.
    """
    autocast, is_enabled = torch.autocast, torch.is_autocast_enabled

    class MetaAutocast(autocast):
        def __init__(self, device_type: str, *args: Any, **kwargs: Any):
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    def enabled(*args: Any) -> bool:
        return is_enabled(*["cpu" if a == "meta" else a for a in args])

    torch.autocast, torch.is_autocast_enabled = MetaAutocast, enabled
    try:
        yield
    finally:
        torch.autocast, torch.is_autocast_enabled = autocast, is_enabled


@dataclass
class Count:
    """One counted training forward: the counter and the bytes of each block's input (what a checkpoint keeps)."""

    counter: SavedTensorCounter
    block_inputs: dict[tuple[str, int], int]  # (list prefix, index) -> bytes of the input tensor's storage

    def scaled(self, scale: Weights, checkpointing: bool) -> float:
        """Activation bytes with each block counted as the ``scale[(prefix, index)]`` blocks it stands for.

        Args:
            scale: the blocks each block stands for (a stand-in, see :func:`proxy_options`).
            checkpointing: the count ran with checkpointing: a block's saved set is its input, which the
                checkpoint saves from the block's parent (no record names the block).
        """
        blocks = self.block_inputs if checkpointing else block_bytes(self.counter)
        return self.counter.activation_bytes + sum((scale.get(k, 1.0) - 1.0) * b for k, b in blocks.items())

    def derived_checkpointed(self, scale: Weights) -> float:
        """What a checkpointed run saves, from this run without checkpointing: each block's saved set replaced
        by its input (equal to a counted checkpointed run for every backend of ``vit_base`` and ``swin_tiny``)."""
        blocks, inputs = block_bytes(self.counter), self.block_inputs
        return self.scaled(scale, False) + sum(scale.get(k, 1.0) * (inputs.get(k, 0) - blocks.get(k, 0))
                                               for k in set(blocks) | set(inputs))


def count(model: nn.Module, batch: int) -> Count:
    """Count the saved tensors of one training forward of ``model`` (on meta) at ``batch``, loss kept alive."""
    cfg = model.cfg
    x = torch.empty(batch, cfg.in_chans, cfg.img_size, cfg.img_size, device="meta")
    inputs: dict[tuple[str, int], int] = {}

    def hook(key: tuple[str, int]) -> Any:
        def record(module: nn.Module, args: Any) -> None:  # returns None: the block's inputs stay as they are
            inputs.setdefault(key, storage_nbytes(args[0]))

        return record

    handles = [m.register_forward_pre_hook(hook(block_of(n))) for n, m in model.named_modules() if BLOCK.fullmatch(n)]
    model.train()
    try:
        with meta_autocast(), SavedTensorCounter(model) as counter:
            loss = model(x).float().sum()  # noqa: F841 - its graph holds what is counted
    finally:
        for h in handles:
            h.remove()
    return Count(counter, inputs)


def scaled_params(model: nn.Module, scale: Weights) -> int:
    """Parameters with each block counted as the ``scale[(prefix, index)]`` blocks it stands for (a stand-in)."""
    total = 0.0
    for name, p in model.named_parameters():
        key = block_of(name)
        total += p.numel() * scale.get(key, 1.0)
    return round(total)


def scaled_macs(model: nn.Module, scale: Weights) -> int:
    """``model.flops()`` with each block counted as the ``scale[(prefix, index)]`` blocks it stands for (a stand-in).

    The blocks are found through ``flops_children`` (the model's, and one level down: Swin's stages), with the
    token grid each runs at.
    """
    total = float(model.flops())
    for name, child, size in model.flops_children():
        parts = [(name, child, size)]
        if not BLOCK.fullmatch(name) and hasattr(child, "flops_children"):
            parts = [(f"{name}.{n}", c, s) for n, c, s in child.flops_children(size)]
        for full, part, grid in parts:
            if BLOCK.fullmatch(full):
                total += (scale.get(block_of(full), 1.0) - 1.0) * part.flops(grid)
    return round(total)


def block_of(module: str) -> Optional[tuple[str, int]]:
    """``("stages.2.", 5)`` for a module inside ``stages.2.blocks.5``; None outside every block list."""
    m = BLOCK.match(module)
    return (m.group(1), int(m.group(2))) if m else None


def block_bytes(counter: SavedTensorCounter) -> dict[tuple[str, int], int]:
    """Activation bytes per block (``(list prefix, index)``) of a counter's records."""
    out: dict[tuple[str, int], int] = {}
    for r in counter.records:
        key = block_of(r.module)
        if key is not None and r.kind == "activation" and not r.freed:
            out[key] = out.get(key, 0) + r.nbytes
    return out


def largest_block_tensor(counter: SavedTensorCounter) -> int:
    """Bytes of the largest saved activation storage inside a block (0 when no block saved one)."""
    return max((r.nbytes for r in counter.records
                if r.kind == "activation" and not r.freed and block_of(r.module) is not None), default=0)


def activations(model: nn.Module, scale: Weights, derive: bool = False) -> tuple[Activations, Activations]:
    """Count at batch 1 and 2, without and with checkpointing, and fit ``fixed + b · per_image`` to each.

    Args:
        model: on meta.
        scale: the blocks each block stands for (a stand-in, see :func:`proxy_options`).
        derive: take the checkpointed figures from the counts without checkpointing
            (:meth:`Count.derived_checkpointed`) instead of counting two more forwards.

    Returns:
        ``(without checkpointing, with checkpointing)``.
    """
    model.grad_checkpointing = False
    one, two = count(model, 1), count(model, 2)
    largest = math.ceil(largest_block_tensor(two.counter) / 2)
    block = math.ceil(max(block_bytes(two.counter).values(), default=0) / 2)
    if derive:
        ckpt = one.derived_checkpointed(scale), two.derived_checkpointed(scale)
    else:
        model.grad_checkpointing = True
        ckpt = count(model, 1).scaled(scale, True), count(model, 2).scaled(scale, True)
        model.grad_checkpointing = False
    plain = fit(one.scaled(scale, False), two.scaled(scale, False), largest)
    # the block its backward recomputes holds that block's whole saved set meanwhile
    return plain, fit(*ckpt, largest + block)


def fit(one: float, two: float, transient: int) -> Activations:
    """``fixed + b · per_image`` through the counts at batch 1 and 2."""
    per_image = round(two - one)
    return Activations(round(one) - per_image, per_image, transient)


Weights = dict[tuple[str, int], float]  # (block list prefix, block index) -> how many blocks it stands for


def stand_in_weights(prefix: str, depth: int) -> Weights:
    """How many blocks of a list of ``depth`` each of the first ``min(depth, 3)`` stands for.

    Block 0 (unshifted, and the network's first has no stochastic depth) stands for itself, block 1 for every
    odd block (shifted), block 2 for every even block after 0.
    """
    if depth <= 3:
        return {}
    return {(prefix, 0): 1.0, (prefix, 1): float(depth // 2), (prefix, 2): float((depth - 1) // 2)}


def proxy_options(name: str, options: dict[str, Any]) -> tuple[dict[str, Any], Weights, Optional[str]]:
    """Options of a shallower stand-in (at most three blocks per block list) and the blocks each stands for.

    Blocks of one list see the same token grid and differ only in being shifted (odd blocks) and in having
    stochastic depth (all but the network's first), so three blocks hold every kind. A model with token
    reduction (the grid shrinks block by block) is not replaced.

    Returns:
        ``(options, weights, description)``; the options themselves, ``{}`` and None when no stand-in applies.
    """
    from vitzoo.models import model_config

    cfg = model_config(name, **options)
    if getattr(cfg, "token_reduction", None):
        return options, {}, None
    if hasattr(cfg, "depths"):
        depths = list(cfg.depths)
        small = [min(d, 3) for d in depths]
        if small == depths:
            return options, {}, None
        weights = {k: v for i, d in enumerate(depths) for k, v in stand_in_weights(f"stages.{i}.", d).items()}
        return {**options, "depths": small}, weights, f"depths {small} scaled to {depths}"
    if getattr(cfg, "depth", 0) > 3:
        return {**options, "depth": 3}, stand_in_weights("", cfg.depth), f"depth 3 scaled to {cfg.depth}"
    return options, {}, None


def footprint(name: str, attention: dict[str, Any], options: dict[str, Any], proxy: bool = False) -> Footprint:
    """Parameters, MACs per image and saved activations of a model, counted on meta.

    Args:
        name: model variant.
        attention: the attention config (a dict with ``name``).
        options: model config fields (``img_size``, ``num_classes`` ...).
        proxy: count a three-blocks-per-list stand-in and scale its blocks (:func:`proxy_options`), and derive
            the checkpointed figures from the same counts: faster, the same bytes for blocks that repeat;
            parameters and analytic MACs scale the same way, exactly.
    """
    small, scale, described = proxy_options(name, options) if proxy else (options, {}, None)
    model, how = meta_model(name, attention, small)
    params, macs = scaled_params(model, scale), scaled_macs(model, scale)
    plain, ckpt = activations(model, scale, derive=proxy)
    return Footprint(f"{name} + {attention.get('name')}", params, macs, plain, ckpt, how, described)


def peak_bytes(fp: Footprint, batch: int, checkpointing: bool = False) -> int:
    """The peak model (see the module docstring) of one training step at ``batch``, in bytes."""
    act = fp.activations(checkpointing)
    return OPTIMIZER_BYTES * fp.params + act.at(batch) + batch * act.transient_per_image


def largest_batch(fp: Footprint, memory: float, checkpointing: bool = False) -> int:
    """The largest ``b`` with ``peak_bytes(fp, b) <= memory`` (0: not even one image fits)."""
    act = fp.activations(checkpointing)
    room = memory - OPTIMIZER_BYTES * fp.params - act.fixed
    slope = act.per_image + act.transient_per_image
    if room < slope:
        return 0
    b = int(room // slope)
    while peak_bytes(fp, b + 1, checkpointing) <= memory:  # guard the float division at the edge
        b += 1
    while b and peak_bytes(fp, b, checkpointing) > memory:
        b -= 1
    return b


def images_per_second(macs: int, dev: Device, dtype: str, utilisation: float) -> float:
    """Training images per second at ``utilisation`` of the device's ``dtype`` peak (training = 3 forwards)."""
    peak = dev.peak_bf16 if dtype in ("bf16", "fp16") else dev.peak_fp32
    return peak * utilisation / (3 * macs) if macs else 0.0
