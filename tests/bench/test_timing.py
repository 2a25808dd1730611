"""Timing: alternating blocks, medians and extremes, the CPU model, the cached matmul peak."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitzoo.bench import (
    Timing,
    time_fns,
)
from vitzoo.flops import mfu as mfu_module


def test_time_fns_alternates_and_counts_repeats():
    import torch

    calls = []
    t = time_fns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, torch.device("cpu"),
                 warmup=1, repeats=4, min_time=0.0)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then ABBA
    assert len(t["a"].seconds) == len(t["b"].seconds) == 4 and t["a"].iters == 1


def test_timing_rate_uses_median_and_extremes():
    t = Timing(seconds=[0.2, 0.1, 0.4], iters=7)
    assert (t.median, t.min, t.max) == (0.2, 0.1, 0.4)
    assert t.rate(8) == pytest.approx((40.0, 20.0, 80.0))  # median, slowest block, fastest block


def test_matmul_peak_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(mfu_module, "_time_matmul", lambda n, dtype, device: calls.append(dtype) or 0.5)
    first = mfu_module.matmul_peak("cpu", "bf16")
    assert first == pytest.approx(128 ** 3 / 0.5) and calls == [torch.bfloat16]
    assert mfu_module.matmul_peak("cpu", "bf16") == first and len(calls) == 1  # cached
    assert mfu_module.cache_file().parent == tmp_path / "cache"
    mfu_module.matmul_peak("cpu", "bf16", refresh=True)
    mfu_module.matmul_peak("cpu", "fp32")
    assert calls == [torch.bfloat16, torch.bfloat16, torch.float32]
    with pytest.raises(ValueError, match="dtype"):
        mfu_module.matmul_peak("cpu", "int8")
    assert [mfu_module.precision_dtype(p) for p in ("32-true", "bf16-mixed", "16-mixed", "none", None, "bf16")] == [
        "fp32", "bf16", "fp16", "fp32", "fp32", "bf16"]
    assert mfu_module.mfu(6e9, 2.0, 1e10) == pytest.approx(0.3) and mfu_module.mfu(6e9, 2.0, None) is None


def test_time_fns_fixed_calls_per_block_alternate():
    """``iters`` fixes the calls per block (precision table, data-speed check); blocks alternate A B B A."""
    import torch

    from vitzoo.bench.timing import time_fns

    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timings = time_fns(fns, torch.device("cpu"), warmup=2, repeats=2, max_time=0, iters=3)
    assert [t.iters for t in timings.values()] == [3, 3] and [len(t.seconds) for t in timings.values()] == [2, 2]
    assert "".join(calls) == "aabb" + "aaa" + "bbb" + "bbb" + "aaa"


def test_cpu_model_names_family_and_vector_isa():
    """"AMD EPYC" alone covers Zen 2 (AVX2) to Zen 4 (AVX512-BF16): environment.json names the ISA torch uses."""
    from vitzoo.bench.environment import cpu_model

    name = cpu_model()
    assert f"{torch.backends.cpu.get_cpu_capability()}" in name and name.endswith(")")
    if Path("/proc/cpuinfo").exists() and "cpu family" in Path("/proc/cpuinfo").read_text():
        assert "family " in name and " model " in name
