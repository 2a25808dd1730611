"""``python -m vitzoo.bench --worker``: the benchmark's worker process (see :mod:`vitzoo.bench.worker`)."""
import sys

from vitzoo.bench.worker import worker_main

if "--worker" not in sys.argv:
    sys.exit("python -m vitzoo.bench --worker reads one job (JSON) on stdin; run scripts/benchmark.py instead")
worker_main()
