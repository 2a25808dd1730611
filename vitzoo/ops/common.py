"""What the fast paths share: the exp2 scale, (image, head) chunking of the CPU cores, ranges of a fixed step, and
whether a call is being traced or compiled (:func:`vitzoo.cpu_kernels.tracing`)."""
from __future__ import annotations

import math

import torch

from vitzoo.cpu_kernels import tracing

__all__ = ["CHUNK_ELEMENTS", "LOG2E", "chunk_budget", "head_chunks", "slices", "tracing"]

# exp(x) = 2^(x·log2 e): the CPU kernels (window, block and kernel attention) fold log2 e into a scale they
# apply anyway and call exp2_. torch's CPU exp (MKL's vector exp) is 1.8x slower than exp2 on ordinary inputs,
# 4-5x on -inf (masked scores) and ~30x on inputs that underflow (Swin's -100 mask); exp2 has no such
# slow path (2-core AMD EPYC, Zen 2).
LOG2E = math.log2(math.e)

CHUNK_ELEMENTS = 1 << 18  # features per chunk and CPU thread (1 MB in float32): cache-sized


def chunk_budget(scale: int = 1) -> int:
    """Features per chunk: ``scale`` × :data:`CHUNK_ELEMENTS` per thread, so that each op keeps every thread busy."""
    return CHUNK_ELEMENTS * scale * max(1, torch.get_num_threads())


def head_chunks(B: int, h: int, per_pair: int, device: torch.device, scale: int = 1) -> list[tuple[slice, slice]]:
    """(image, head) index blocks of about :func:`chunk_budget` features; one block on accelerators,
    under ``torch.compile``/``torch.export`` and tracing (the loop would fix the batch size).

    Args:
        B: images.
        h: heads.
        per_pair: features one (image, head) pair holds.
        device: device of the call.
        scale: multiple of :data:`CHUNK_ELEMENTS` per thread.
    """
    if device.type != "cpu" or tracing():
        return [(slice(None), slice(None))]
    budget = chunk_budget(scale)
    if per_pair * h <= budget:  # several images with all their heads
        bc = max(1, budget // (per_pair * h))
        return [(slice(b, b + bc), slice(None)) for b in range(0, B, bc)]
    hc = max(1, budget // per_pair)  # heads of one image
    return [(slice(b, b + 1), slice(j, j + hc)) for b in range(B) for j in range(0, h, hc)]


def slices(n: int, step: int) -> list[slice]:
    """``range(n)`` in consecutive slices of ``step`` (the last one shorter)."""
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]
