#!/usr/bin/env python
"""Throughput, latency, memory and FLOPs of vitzoo's attention backends, and the reference comparisons.

Examples (from the repository root):

    # everything: models (vit_cifar, swin_cifar x every backend), timm references, layer scaling
    python scripts/benchmark.py
    # only the single-layer scaling at 256..16384 tokens
    python scripts/benchmark.py --mode layers
    # a few backends, ImageNet-size models, on GPU with bf16 autocast and torch.compile
    python scripts/benchmark.py --mode models --attention global,window,performer \
        --models vit_tiny,swin_tiny --batch 128 --amp bf16 --compile
    # docs/results.md's memory table: predicted versus measured training peak, fp32 and bf16, no timing; two
    # configurations side by side, one thread each (a peak is its own process's)
    python scripts/benchmark.py --mode models --memory-only --model-tokens 64,1024,4096 --batch 16,4,1 \
        --batch-per-size --amp none,bf16 --jobs 2 --threads 1 --out results/benchmark/memory
    # README's backend guide (scripts/backend_guide.py): vit_cifar at 1,024 and 4,096 grid tokens, one batch each
    python scripts/benchmark.py --mode models --models vit_cifar --img-size 128,256 --batch 4,1 --batch-per-size \
        --amp bf16 --no-references --out results/benchmark/whole_model

Outputs go to ``outputs/benchmark/<timestamp>/`` (``--out``): ``models``, ``layers`` and ``references``
as ``.csv`` and ``.md``, ``report.md`` with all of them, ``layer_scaling.png``, ``environment.json``
(versions, CPU/GPU, threads, load, options), ``results.json`` (every row); how each is measured: :mod:`vitzoo.bench`.
"""
import argparse
import json
import shlex
import sys

from vitzoo.bench import BenchOptions, run_benchmark
from vitzoo.registry import ConfigError


def _list(kind):
    """Argparse type: a comma-separated list of ``kind``."""
    return lambda text: [kind(t) for t in text.split(",") if t.strip()]


def parse_args(argv=None) -> BenchOptions:
    """The command line as :class:`BenchOptions` (a bad value exits with its one-line message)."""
    d = BenchOptions()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=["all", "models", "layers"], default=d.mode,
                   help="models: full networks; layers: one attention layer versus tokens; all: both")
    p.add_argument("--attention", type=_list(str), default=None,
                   help="comma-separated backends (default: every registered backend, vitzoo.list_attention())")
    p.add_argument("--models", type=_list(str), default=d.models, help="comma-separated model variants")
    p.add_argument("--img-size", dest="img_sizes", type=_list(int), default=d.img_sizes,
                   help="comma-separated input sides (default: each model's own)")
    p.add_argument("--model-tokens", type=_list(int), default=d.model_tokens,
                   help="models mode: comma-separated grid token counts (squares) instead of --img-size: each model "
                        "at sqrt(N) x its patch size")
    p.add_argument("--token-reduction", default=d.token_reduction,
                   help="models mode: model.token_reduction of every model (tome, evit, tokenlearner)")
    p.add_argument("--model-options", type=json.loads, default={},
                   help="models mode: JSON object of model config fields on top of each variant, e.g. "
                        "'{\"stem\": \"conv\", \"global_pool\": \"avg\"}' (rows keep the variant's name)")
    p.add_argument("--batch", dest="batches", type=_list(int), default=d.batches, help="comma-separated batch sizes")
    p.add_argument("--batch-per-size", action="store_true",
                   help="models mode: the i-th --batch at the i-th --img-size only (default: every size x every batch)")
    p.add_argument("--tokens", type=_list(int), default=d.tokens, help="layer mode: token counts (squares)")
    for name, what in (("dim", "channels C"), ("heads", "heads"), ("batch", "batch"),
                       ("prefix", "prefix (class) tokens")):
        p.add_argument(f"--layer-{name}", type=int, default=getattr(d, f"layer_{name}"), help=f"layer mode: {what}")
    p.add_argument("--layer-window", type=int, default=d.layer_window,
                   help="layer mode: natural window side for backends whose window option is null")
    p.add_argument("--no-references", dest="references", action="store_false",
                   help="skip timm / performer-pytorch / linformer / natten comparisons")
    p.add_argument("--memory-only", action="store_true",
                   help="models mode: the training peak of two untimed steps and its prediction only (no timing, "
                        "FLOPs or references; seconds per configuration)")
    p.add_argument("--pair-global-tokens", type=int, default=d.pair_global_tokens,
                   help="layer mode: up to this token count time each layer alternating with global in one process")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed calls before timing (at least 1)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed blocks; the median is reported")
    p.add_argument("--min-time", type=float, default=d.min_time, help="target seconds per timed block")
    p.add_argument("--max-time", type=float, default=d.max_time,
                   help="cap on seconds per measurement (lowers --repeats, not below 3)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads per worker (default: torch's)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=d.device)
    p.add_argument("--amp", default=d.amp, help="autocast dtype: none or bf16; with --memory-only also none,bf16")
    p.add_argument("--jobs", type=int, default=d.jobs,
                   help="with --memory-only: configurations measured side by side, each in its own process")
    p.add_argument("--compile", action="store_true", help="torch.compile the models/layers")
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="run every configuration in this process (faster, memory numbers less clean)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds per configuration before it is stopped")
    p.add_argument("--mem-limit-gb", type=float, default=None,
                   help="CPU: memory budget per configuration (default: 80%% of available memory)")
    p.add_argument("--out", default=None, help="output folder (default: outputs/benchmark/<timestamp>)")
    p.add_argument("--seed", type=int, default=d.seed)
    try:
        return BenchOptions.from_options(vars(p.parse_args(argv)))
    except ConfigError as exc:
        p.error(str(exc))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    run_benchmark(parse_args(argv), command=shlex.join(["python", "scripts/benchmark.py", *argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
