"""Peak memory of a measurement: the worker process, live bytes, file-backed pages, a broken job."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BENCH_TINY as TINY

from vitzoo.bench import (
    run_job,
)
from vitzoo.bench.memory import _glibc


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


_RSS_AFTER_FREE = """
import torch
from vitzoo.bench.memory import _malloc_live, _proc_status_kb
def rss_after_free_kb(mib):
    before = _proc_status_kb("VmRSS")
    t = torch.ones(mib * 2 ** 18)  # float32: mib MiB, touched
    del t
    return _proc_status_kb("VmRSS") - before
assert _malloc_live(False)
steady = rss_after_free_kb(4)
assert _malloc_live(True)
print(steady, rss_after_free_kb(4))
"""


@pytest.mark.skipif(_glibc() is None or not Path("/proc/self/status").exists(), reason="needs glibc and /proc")
def test_live_phase_gives_freed_tensors_back_to_the_os():
    """In a live phase a freed tensor leaves the resident set (the RSS peak is the live peak); in the steady
    mode used for timing malloc keeps it for the next step. Own process: mallopt changes the process."""
    out = subprocess.run([sys.executable, "-c", _RSS_AFTER_FREE], capture_output=True, text=True, check=True)
    steady_kb, live_kb = map(int, out.stdout.split())
    assert steady_kb > 3 * 1024 and live_kb < 512, (steady_kb, live_kb)


_PEAK_WITH_FILE_PAGES = """
import mmap, sys, torch
from vitzoo.bench.memory import PeakMemory
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(bytes(16 * 2 ** 20))
memory = PeakMemory(torch.device("cpu"), live=True)
memory.start()
kept = torch.ones(4 * 2 ** 18)  # 4 MiB of tensor memory
with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
    touched = sum(m[i] for i in range(0, len(m), 4096))  # 16 MiB of file pages become resident
    print(memory.peak_mb())
"""


@pytest.mark.skipif(_glibc() is None or not Path("/proc/self/status").exists(), reason="needs glibc and /proc")
def test_live_peak_leaves_out_file_backed_pages(tmp_path):
    """Library code paged in by an operator's first call is file-backed: the live peak counts the 4 MiB
    tensor, not the 16 MiB of file pages mapped during the phase."""
    out = subprocess.run([sys.executable, "-c", _PEAK_WITH_FILE_PAGES, str(tmp_path / "pages")],
                         capture_output=True, text=True, check=True)
    assert 2.5 < float(out.stdout) < 8, out.stdout


def test_worker_reports_a_broken_job():
    """A job the worker cannot run answers with its reason instead of crashing the benchmark."""
    row = run_job(dict(kind="layer", backend="nope", spec={"name": "nope"}, tokens=16, dim=32, heads=2, batch=1,
                       prefix=0, window=4, device="cpu", warmup=1, repeats=1, min_time=0.0), isolate=False)
    assert row["status"].startswith("cannot build: unknown attention 'nope'"), row
