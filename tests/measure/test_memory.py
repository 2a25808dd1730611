"""Peak memory of a phase (vitzoo.measure.memory): live bytes, file-backed pages left out."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vitzoo.measure.memory import _glibc

_RSS_AFTER_FREE = """
import torch
from vitzoo.measure.memory import _malloc_live, _proc_status_kb
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
from vitzoo.measure.memory import PeakMemory
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
