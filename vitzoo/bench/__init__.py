"""Accuracy versus throughput: the benchmark behind ``scripts/benchmark.py`` and the sweep comparison
behind ``scripts/compare.py`` (:mod:`vitzoo.bench.compare`).

Benchmark (:func:`run_benchmark`):

* **models**: for each backend × model × image size × batch, training throughput (forward, backward
  and AdamW step), inference throughput (no grad), batch-1 latency, peak memory, parameters and
  fvcore-measured GMACs (with the analytic count beside it).
* **layers**: one attention layer (default C=128, 4 heads, batch 4) at several token counts:
  forward+backward time and peak memory, with the analytic FLOPs ratio to ``global`` beside the
  measured time ratio.
* **references** (optional extras): timm's ``VisionTransformer`` / ``SwinTransformer`` built with the
  same configuration as vitzoo's ``global`` ViT / ``window`` Swin, and the performer-pytorch,
  linformer and natten layers beside vitzoo's ``performer``, ``linformer`` and ``local`` layers.
  Each pair is built in one process and timed in alternating repeats (ABBA order); the result is a
  speed ratio vitzoo/reference (> 1: vitzoo faster).

How things are measured:

* Timing: untimed warm-up calls (at least one, also used to calibrate), then ``repeats`` timed
  blocks of ``iters`` calls each (``iters`` chosen so a block lasts about ``min_time`` seconds);
  the median block gives the number, the fastest and slowest blocks give min/max. On CUDA the
  blocks are timed with CUDA events, on CPU with ``time.perf_counter``.
* Peak memory: every configuration runs in its own Python process (``python -m vitzoo.bench
  --worker``). On CUDA: ``torch.cuda.max_memory_allocated`` during the phase minus what was
  allocated before the model was built. On CPU (Linux): the peak resident set size of the phase
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the resident size measured
  after imports and before the model was built. It therefore includes parameters, gradients,
  optimizer state, activations and what the allocator keeps cached; elsewhere ``ru_maxrss`` (the
  process-lifetime peak) minus the same baseline is used and the method says so.
* On CPU a worker runs under an address-space limit (``mem_limit_gb`` over its start-up size), so a
  configuration that does not fit fails with "out of memory" instead of swapping the machine.

Comparison (:func:`compare_runs`): reads a Hydra multirun folder whose jobs wrote ``results.json``
and draws the accuracy/throughput bubble chart with its Pareto front.

Modules: ``options`` (:class:`BenchOptions`, backend/model names), ``references`` (timm,
performer-pytorch, linformer, natten), ``jobs`` (one measurement each), ``worker`` (one process per
job), ``run`` (:func:`run_benchmark`), ``report`` (tables, chart) and ``compare``. The measuring tools they
use (timing, peak memory, the machine's description) are :mod:`vitzoo.measure`, which training uses too;
this package imports training, never the other way.
"""
from vitzoo.bench.compare import compare_runs, find_run_dirs, pareto_front, plot_bubbles, read_run, sweep_command
from vitzoo.bench.jobs import JOBS, layer_job, layer_ref_job, model_job, model_ref_job
from vitzoo.bench.options import BenchOptions, model_family, resolve_device, select_backends
from vitzoo.bench.references import (
                                     LAYER_REFERENCES,
                                     MODEL_REFERENCES,
                                     NOT_INSTALLED,
                                     ReferenceUnavailable,
                                     layer_reference,
                                     timm_reference,
)
from vitzoo.bench.report import markdown_table, plot_scaling, write_csv, write_outputs
from vitzoo.bench.run import run_benchmark
from vitzoo.bench.worker import run_job

__all__ = ["BenchOptions", "JOBS", "LAYER_REFERENCES", "MODEL_REFERENCES", "NOT_INSTALLED", "ReferenceUnavailable",
           "compare_runs", "find_run_dirs", "layer_job", "layer_ref_job", "layer_reference", "markdown_table",
           "model_family", "model_job", "model_ref_job", "pareto_front", "plot_bubbles", "plot_scaling", "read_run",
           "resolve_device", "run_benchmark", "run_job", "select_backends", "sweep_command", "timm_reference",
           "write_csv", "write_outputs"]
