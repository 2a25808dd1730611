"""The benchmark's worker process: one job per process measures its own peak memory; a broken job answers."""
from __future__ import annotations

from pathlib import Path

from helpers import BENCH_TINY as TINY

from vitzoo.bench import run_job


def test_worker_process_measures_memory():
    """The default path: one configuration in its own process, peak memory from that process.

    1024 tokens, C = 64, batch 8: the float32 qkv projection alone is 6 MiB, so the phase's peak must show it
    (the CPU flash kernel never stores the attention matrix).
    """
    job = dict(kind="layer", backend="global", spec={"name": "global"}, tokens=1024, dim=64, heads=2, batch=8,
               prefix=1, window=4, device="cpu", mem_limit_gb=4,
               **{k: v for k, v in TINY.items() if not k.startswith("layer")})
    row = run_job(job, isolate=True, timeout=300)
    assert row["status"] == "ok", row
    assert row["ms"] > 0 and row["peak_mb"] > 4 and row["threads"] == 1
    if Path("/proc/self/clear_refs").exists():
        assert row["memory_method"].startswith("VmHWM (reset per phase) - baseline VmRSS")


def test_worker_reports_a_broken_job():
    """A job the worker cannot run answers with its reason instead of crashing the benchmark."""
    row = run_job(dict(kind="layer", backend="nope", spec={"name": "nope"}, tokens=16, dim=32, heads=2, batch=1,
                       prefix=0, window=4, device="cpu", warmup=1, repeats=1, min_time=0.0), isolate=False)
    assert row["status"].startswith("cannot build: unknown attention 'nope'"), row
