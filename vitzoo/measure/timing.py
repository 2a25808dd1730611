"""Timing: warm-up, calibrated blocks of calls, and several functions timed in alternation (ABBA)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class Timing:
    """Seconds per call of each timed block (one entry per repeat) and calls per block.

    Args:
        seconds: seconds per call, one entry per timed block.
        iters: calls per block.
    """

    seconds: list[float]
    iters: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    def rate(self, items: int) -> tuple[float, float, float]:
        """Items per second: median, min (slowest block), max (fastest block).

        Args:
            items: items one call processes (the batch size).
        """
        return items / self.median, items / self.max, items / self.min


def _time_block(fn: Callable[[], Any], iters: int, device: torch.device) -> float:
    """Seconds for ``iters`` calls of ``fn`` (CUDA events on GPU, perf_counter on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def _warm_up(fn: Callable[[], Any], device: torch.device, warmup: int, max_time: float) -> float:
    """Untimed calls (at least one); returns the seconds of the last, which calibrates the blocks."""
    spent, last = 0.0, 0.0
    for i in range(max(1, warmup)):  # the 2nd call calibrates when the 1st compiled (torch.compile)
        last = _time_block(fn, 1, device)
        spent += last
        if max_time and spent > max_time / 4 and i >= 1:  # slow calls: two warm-up calls are enough
            break
    return last


def time_fns(fns: Mapping[str, Callable[[], Any]], device: torch.device, warmup: int = 3, repeats: int = 5,
             min_time: float = 0.5, max_time: float = 60.0, iters: Optional[int] = None) -> dict[str, Timing]:
    """Time one function, or several in alternating blocks (ABBA order), after a warm-up.

    Args:
        fns: name -> function doing one call (a training step, a forward pass ...).
        device: torch device the functions run on.
        warmup: untimed calls per function (at least 1; the last one calibrates ``iters``); fewer
            when two of them already took ``max_time / 4``.
        repeats: timed blocks per function.
        min_time: target seconds per block (sets the calls per block, the same for all functions).
        max_time: cap on the seconds of all blocks together; lowers ``repeats`` (to 3 at least).
        iters: calls per block, fixed (None: calibrated from ``min_time``).
    """
    per_call = {name: _warm_up(fn, device, warmup, max_time) for name, fn in fns.items()}
    slowest = max(per_call.values())
    if iters is None:
        iters = max(1, int(min_time / max(slowest, 1e-9))) if min_time > 0 else 1
    block = sum(per_call.values()) * iters
    reps = repeats
    if max_time and block * repeats > max_time:
        reps = max(min(3, repeats), int(max_time / max(block, 1e-9)))
    names = list(fns)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds[name].append(_time_block(fns[name], iters, device) / iters)
    return {n: Timing(seconds[n], iters) for n in names}
