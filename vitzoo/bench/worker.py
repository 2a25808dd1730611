"""One job per process: :func:`run_job` starts ``python -m vitzoo.bench --worker`` (:func:`worker_main`),
so each configuration's peak memory is its own, and a crash or a timeout costs one row."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitzoo.bench.jobs import JOBS
from vitzoo.measure.memory import limit_address_space

# the folder the running vitzoo package is imported from (a checkout, or site-packages of an installed wheel)
IMPORT_ROOT = Path(__file__).resolve().parents[2]  # <IMPORT_ROOT>/vitzoo/bench/worker.py

RESULT_MARKER = "@@VITZOO_BENCH_RESULT@@"


def worker_main() -> None:
    """``python -m vitzoo.bench --worker``: read one job (JSON) on stdin, print its row (JSON)."""
    job = json.loads(sys.stdin.read())
    if job.get("device") == "cpu":
        limit_address_space(job.get("mem_limit_gb"))
    try:
        row = JOBS[job["kind"]](job)
    except Exception as exc:  # noqa: BLE001 - a broken job still answers
        traceback.print_exc()
        row = {"status": f"error: {type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(row, default=str) + "\n")
    sys.stdout.flush()


def _worker_env(job: Mapping[str, Any]) -> dict[str, str]:
    """This environment, with :data:`IMPORT_ROOT` first on ``PYTHONPATH`` (the worker imports the same vitzoo)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if job.get("threads"):
        env["OMP_NUM_THREADS"] = str(job["threads"])
    return env


def _in_process(job: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return JOBS[job["kind"]](job)
    except Exception as exc:  # noqa: BLE001
        return {"status": f"error: {type(exc).__name__}: {exc}"}


def run_job(job: Mapping[str, Any], isolate: bool = True, timeout: float = 1800.0) -> dict[str, Any]:
    """Run one job in a fresh process (``isolate``) or in this one; never raises.

    Args:
        job: the job dict (``kind`` selects the function in :data:`vitzoo.bench.jobs.JOBS`).
        isolate: run it in its own process (honest peak memory).
        timeout: seconds before the process is stopped (``isolate`` only).
    """
    if not isolate:
        return _in_process(job)
    try:
        proc = subprocess.run([sys.executable, "-m", "vitzoo.bench", "--worker"], input=json.dumps(job),
                              env=_worker_env(job), cwd=IMPORT_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
    if proc.returncode in (-9, 137):
        return {"status": "killed (SIGKILL: out of memory?)"}
    return {"status": f"worker failed (exit {proc.returncode}): {last[:300]}"}
