"""Timing (vitzoo.measure.timing): alternating blocks (ABBA), fixed or calibrated calls per block, medians."""
from __future__ import annotations

import pytest
import torch

from vitzoo.measure.timing import Timing, time_fns


def test_time_fns_alternates_and_counts_repeats():

    calls = []
    t = time_fns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, torch.device("cpu"),
                 warmup=1, repeats=4, min_time=0.0)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then ABBA
    assert len(t["a"].seconds) == len(t["b"].seconds) == 4 and t["a"].iters == 1


def test_timing_rate_uses_median_and_extremes():
    t = Timing(seconds=[0.2, 0.1, 0.4], iters=7)
    assert (t.median, t.min, t.max) == (0.2, 0.1, 0.4)
    assert t.rate(8) == pytest.approx((40.0, 20.0, 80.0))  # median, slowest block, fastest block


def test_time_fns_fixed_calls_per_block_alternate():
    """``iters`` fixes the calls per block (precision table, data-speed check); blocks alternate A B B A."""


    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timings = time_fns(fns, torch.device("cpu"), warmup=2, repeats=2, max_time=0, iters=3)
    assert [t.iters for t in timings.values()] == [3, 3] and [len(t.seconds) for t in timings.values()] == [2, 2]
    assert "".join(calls) == "aabb" + "aaa" + "bbb" + "bbb" + "aaa"
