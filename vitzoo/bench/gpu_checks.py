"""Every check that needs a GPU, in one run sized to a time budget (``scripts/gpu_checks.py``).

The CPU suite cannot check these: FlexAttention's backward (torch has none on the CPU) and its compiled
speed, bf16 on hardware that has it, and throughput on a GPU. The steps, most valuable first:

1. ``flex``: every fixed-pattern backend (each backend whose ``impls`` include ``flex``
   in the registry, and ``local`` with its relative position bias) with ``impl=flex`` and ``impl=blocked``
   against the float64 dense reference (:meth:`reference`): the outputs and, where FlexAttention has a
   backward (CUDA), the gradients of the input and of every parameter. float32 with TF32 off.
2. ``timm``: ``vit_cifar`` + ``global`` and ``swin_cifar`` + ``window`` against timm's identical model, fp32
   and bf16 autocast, training, inference and batch-1 latency in alternating blocks
   (:func:`vitzoo.bench.jobs.model_ref_job`).
3. ``layers``: one layer of the benchmark's layer shape (:class:`~vitzoo.bench.options.BenchOptions`) at
   4,096 tokens, forward+backward, every backend timed in alternating blocks with ``global`` (fused SDPA)
   in this process; the fixed-pattern backends once with ``impl=flex`` and once with ``impl=blocked``
   (:func:`vitzoo.bench.jobs.layer_job`), then speedup, share of the FLOPs ratio and MFU.
4. ``precision``: training images/s in fp32, bf16-mixed and compiled (:mod:`vitzoo.bench.precision`).
5. ``layers_large``: the layer table at 16,384 tokens.

Before every item the run checks its deadline (``budget_s`` from its start): an item that cannot start
in time is recorded as skipped. After every item ``results.json`` and ``gpu_checks.md`` in ``out`` are
written again, so a run cut off early keeps everything it finished. ``smoke=True`` runs every
step at toy sizes (a minute on a CPU: the test of this module).
"""
from __future__ import annotations

import copy
import json
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from vitzoo.attention import MixerContext, attention_class, build_attention, list_attention
from vitzoo.bench.jobs import layer_job, model_ref_job
from vitzoo.bench.options import BenchOptions, model_img_size, resolve_device
from vitzoo.bench.precision import MODES, PrecisionOptions, measure_pair
from vitzoo.bench.references import MODEL_REFERENCES
from vitzoo.bench.report import markdown_table
from vitzoo.bench.run import add_layer_ratios, add_mfu
from vitzoo.configs import attention_options
from vitzoo.fileio import atomic_write_text
from vitzoo.flops.mfu import matmul_peak
from vitzoo.measure.environment import environment
from vitzoo.registry import ConfigError

Row = dict[str, Any]
Item = tuple[str, Callable[[], Row]]  # (what, measurement returning one row)
STEPS = ("flex", "timm", "layers", "precision", "layers_large")  # the one list of steps, in run order
# sizes of a real run and of the smoke test; the layer shape and timing otherwise come from BenchOptions
SIZES: dict[str, dict[str, Any]] = {
    "full": dict(flex_grid=(16, 16), flex_dim=64, flex_heads=4, tokens=4096, tokens_large=16384, model_batch=256,
                 timing=dict(warmup=3, repeats=5, min_time=0.2, max_time=20.0), layer_amp="bf16",
                 precision=dict(batch=256, warmup=3, steps=10, rounds=3),
                 precision_pairs=[("vit_cifar", "global"), ("swin_cifar", "window"), ("vit_cifar", "local")]),
    "smoke": dict(flex_grid=(6, 6), flex_dim=32, flex_heads=2, tokens=64, tokens_large=144, model_batch=4,
                  timing=dict(warmup=1, repeats=1, min_time=0.0, max_time=5.0), layer_amp="none",
                  precision=dict(batch=4, warmup=0, steps=1, rounds=1, compile_backend="eager",
                                 model_options={"depth": 1}),
                  precision_pairs=[("vit_cifar", "global")]),
}
FLEX_EXTRA = [("local", {"rel_pos_bias": True})]  # options with a path of their own (score_mod)
TOLERANCE = 1e-4  # largest |difference| / largest |reference value| of float32 against float64


@dataclass
class GpuCheckOptions:
    """What one run of the GPU checks does.

    Args:
        out: output folder (``results.json``, ``gpu_checks.md``).
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        budget_s: seconds from the start after which no new item starts (the share of the machine's time for this run).
        smoke: toy sizes, to test the run on a CPU.
        steps: which of :data:`STEPS` to run, in their order.
        label: free text kept with the results (the commit the tree was copied at: the device has no ``.git``).
    """

    out: str
    device: str = "auto"
    budget_s: float = 300.0
    smoke: bool = False
    steps: list[str] = field(default_factory=lambda: list(STEPS))
    label: str = ""

    def __post_init__(self):
        self.device = resolve_device(self.device)
        unknown = sorted(set(self.steps) - set(STEPS))
        if unknown:
            raise ConfigError(f"--steps: unknown {', '.join(unknown)} (choose from {', '.join(STEPS)})")
        if self.budget_s <= 0:
            raise ConfigError(f"--budget must be positive seconds (got {self.budget_s})")


def fixed_pattern_backends() -> list[str]:
    """Registered backends with a FlexAttention implementation (``"flex"`` among their ``impls``)."""
    return [n for n in list_attention() if "flex" in attention_class(n).impls]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest ``|got - want|`` over the largest ``|want|``, at least 0.01 (compared in float64): a gradient that is
    zero in exact arithmetic (the key bias's under softmax) is held to float32 rounding, not to a 0 denominator."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(0.01))


def _outputs(attn: torch.nn.Module, x: torch.Tensor, g: torch.Tensor, grid: tuple[int, int],
             backward: bool, forward: Optional[Callable] = None) -> list[torch.Tensor]:
    """``[output]``, then with ``backward`` the input's and every parameter's gradient (``out·g`` summed)."""
    x = x.detach().clone().requires_grad_(backward)
    attn.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(backward):
        out = (forward or attn)(x, grid)
    if not backward:
        return [out]
    out.backward(g.to(out.dtype))
    return [out, x.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in attn.parameters()]


def flex_agreement(name: str, options: dict[str, Any], sizes: dict[str, Any], device: str,
                   impls: tuple[str, ...] = ("flex", "blocked"), backward: Optional[bool] = None) -> Row:
    """``impl=flex`` and ``impl=blocked`` of one fixed-pattern backend against its float64 dense reference.

    Args:
        name: backend. options: extra attention options.
        sizes: :data:`SIZES` entry (grid, dim, heads). device: where the impls run (the reference too).
        impls: the ``attention.impl`` values to check.
        backward: compare gradients too (None: on CUDA, where FlexAttention has a backward).
    """
    torch.manual_seed(0)
    grid = tuple(sizes["flex_grid"])
    backward = torch.device(device).type == "cuda" if backward is None else backward
    ctx = MixerContext(sizes["flex_dim"], sizes["flex_heads"], grid, 1, qkv_bias=True, layer_index=0, window=4)
    attn = build_attention({**attention_options(name), **options, "impl": "blocked"}, ctx).to(device).eval()
    with torch.no_grad():
        for p in attn.parameters():  # visible values for zero-initialised tables (relative position bias)
            if p.abs().max() == 0:
                p.normal_()
    x = torch.randn(2, 1 + grid[0] * grid[1], ctx.dim, device=device)
    g = torch.randn_like(x)
    ref = copy.deepcopy(attn).double()
    want = _outputs(ref, x.double(), g.double(), grid, backward, forward=ref.reference)
    row: Row = {"backend": name, "options": options, "grid": f"{grid[0]}x{grid[1]}", "prefix": 1,
                "checked": "output, input and parameter gradients" if backward else "output (no backward here)"}
    for impl in impls:
        layer = build_attention({**attention_options(name), **options, "impl": impl}, ctx).to(device).eval()
        layer.load_state_dict(attn.state_dict())
        got = _outputs(layer, x, g, grid, backward)
        row[f"{impl}_output_err"] = _relative_error(got[0], want[0])
        if backward:
            row[f"{impl}_grad_err"] = max(_relative_error(a, b) for a, b in zip(got[1:], want[1:]))
    worst = max(v for k, v in row.items() if k.endswith("_err"))
    row["status"] = "ok" if worst <= TOLERANCE else f"MISMATCH: {worst:.2e} > {TOLERANCE:g}"
    return row


def _flex_items(sizes: dict[str, Any], device: str) -> Iterator[Item]:
    for name, options in [(n, {}) for n in fixed_pattern_backends()] + FLEX_EXTRA:
        what = f"flex {name}" + "".join(f" {k}={v}" for k, v in options.items())
        yield what, lambda n=name, o=options: _fresh(flex_agreement, n, o, sizes, device)


def _fresh(fn: Callable, *args: Any) -> Row:
    """``fn(*args)`` after forgetting compiled code: every backend's ``mask_mod`` compiles anew, so a run of
    many backends never reaches torch.compile's recompile limit (which would fall back to eager)."""
    torch._dynamo.reset()
    return fn(*args)


def _timing(sizes: dict[str, Any]) -> dict[str, Any]:
    return dict(seed=0, threads=None, compile=False, **sizes["timing"])


def _timm_items(sizes: dict[str, Any], device: str) -> Iterator[Item]:
    for model, family in (("vit_cifar", "vit"), ("swin_cifar", "swin")):
        backend, reference = MODEL_REFERENCES[family]
        for amp in ("none", "bf16"):
            job = dict(device=device, amp=amp, model=model, backend=backend, spec=attention_options(backend),
                       img_size=model_img_size(model), batch=sizes["model_batch"], reference=reference,
                       **_timing(sizes))
            yield f"timm {model} amp={amp}", lambda j=job: {"model": j["model"], "amp": j["amp"], **model_ref_job(j)}


def _layer_specs(device: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, spec) of every backend; on CUDA the fixed-pattern backends twice, ``impl=flex`` and ``impl=blocked``
    (elsewhere ``blocked`` alone: FlexAttention has no CPU backward)."""
    fixed, impls, specs = set(fixed_pattern_backends()), ("flex", "blocked") if device == "cuda" else ("blocked",), []
    for name in list_attention():
        if name not in fixed:
            specs.append((name, attention_options(name)))
        else:
            specs += [(f"{name} ({impl})", {**attention_options(name), "impl": impl}) for impl in impls]
    return specs


def _layer_items(sizes: dict[str, Any], device: str, tokens: int) -> Iterator[Item]:
    d = BenchOptions()
    for label, spec in _layer_specs(device):
        job = dict(kind="layer", backend=label, spec=spec, tokens=tokens, dim=d.layer_dim, heads=d.layer_heads,
                   batch=d.layer_batch, prefix=d.layer_prefix, window=d.layer_window, pair_global_tokens=tokens,
                   device=device, amp=sizes["layer_amp"], **_timing(sizes))
        yield f"layer {label} {tokens}", lambda j=job: _fresh(layer_job, j)


def _precision_items(sizes: dict[str, Any], device: str) -> Iterator[Item]:
    opts = PrecisionOptions(device=device, **sizes["precision"])
    for model, backend in sizes["precision_pairs"]:
        yield f"precision {model} {backend}", lambda m=model, b=backend: _fresh(measure_pair, m, b, opts)


def _error_row(what: str, exc: BaseException) -> Row:
    lines = traceback.format_exception_only(type(exc), exc)
    return {"item": what, "status": f"error: {lines[-1].strip()[:300]}"}


COLUMNS = {  # the Markdown columns of each step's table
    "flex": ["backend", "grid", "checked", "flex_output_err", "blocked_output_err", "flex_grad_err",
             "blocked_grad_err", "status"],
    "timm": ["model", "amp", "reference", "train_speed_ratio", "train_speed_ratio_min", "train_speed_ratio_max",
             "infer_speed_ratio", "latency_speed_ratio", "train_ms_vitzoo", "train_ms_reference", "status"],
    "layers": ["backend", "tokens", "amp", "ms", "ms_global_paired", "time_ratio", "flops_ratio", "efficiency",
               "peak_mb", "gmacs_s", "mfu", "status"],
    "precision": ["model", "attention", *MODES, "status"],
}
COLUMNS["layers_large"] = COLUMNS["layers"]


class GpuCheckRun:
    """The rows of every step, the deadline, and the two output files.

    Args:
        opts: the run's options.
    """

    def __init__(self, opts: GpuCheckOptions):
        self.opts, self.start = opts, time.time()
        self.out = Path(opts.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.sizes = SIZES["smoke" if opts.smoke else "full"]
        self.env = environment(opts.device)
        self.rows: dict[str, list[Row]] = {step: [] for step in opts.steps}

    def left(self) -> float:
        return self.opts.budget_s - (time.time() - self.start)

    def items(self, step: str) -> Iterator[Item]:
        dev, sizes = self.opts.device, self.sizes
        if step == "flex":
            return _flex_items(sizes, dev)
        if step == "timm":
            return _timm_items(sizes, dev)
        if step == "precision":
            return _precision_items(sizes, dev)
        return _layer_items(sizes, dev, sizes["tokens"] if step == "layers" else sizes["tokens_large"])

    def run_step(self, step: str, log: Callable[[str], None]) -> None:
        for what, measure in self.items(step):
            if self.left() <= 0:
                row = {"item": what, "status": f"skipped: budget of {self.opts.budget_s:g} s spent"}
            else:
                t0 = time.time()
                try:
                    row = {"item": what, **measure()}
                except Exception as exc:  # noqa: BLE001 - one failed item must not lose the others
                    row = _error_row(what, exc)
                row["seconds"] = round(time.time() - t0, 1)
            self.rows[step].append(row)
            if step.startswith("layers"):
                self._layer_figures(self.rows[step])
            log(f"  {what}: {row.get('status')} ({row.get('seconds', 0)} s, {max(self.left(), 0):.0f} s left)")
            self.write()

    def _layer_figures(self, rows: list[Row]) -> None:
        """Speedup and FLOPs share (:func:`add_layer_ratios`), MFU against this device's measured peak."""
        add_layer_ratios(rows)
        if "peak" not in self.env:
            dtype = "bf16" if self.sizes["layer_amp"] == "bf16" else "fp32"
            peak = matmul_peak(self.opts.device, dtype, refresh=not self.opts.smoke)  # fresh on the device
            self.env["peak"] = {"dtype": dtype, "gmacs_s": peak / 1e9}
        add_mfu([], rows, self.env["peak"]["gmacs_s"] * 1e9)

    def write(self) -> None:
        result = {"options": asdict(self.opts), "environment": self.env, "seconds": round(time.time() - self.start, 1),
                  **self.rows}
        atomic_write_text(self.out / "results.json", json.dumps(result, indent=1, default=str))
        atomic_write_text(self.out / "gpu_checks.md", self.markdown())

    def markdown(self) -> str:
        env = self.env
        where = env.get("gpu") or env.get("cpu_model")
        lines = [f"# GPU checks: {where}", "",
                 f"{env['date']}, torch {env['torch']}, timm {env['timm']}, device {env['device']}, "
                 f"{self.opts.label or 'no label'}, budget {self.opts.budget_s:g} s"
                 f"{' (smoke sizes)' if self.opts.smoke else ''}.", ""]
        for step, rows in self.rows.items():
            lines += [f"## {step}", "", markdown_table(rows, ["item", *COLUMNS[step][1:], "seconds"]), ""]
        return "\n".join(lines)


def run_gpu_checks(opts: GpuCheckOptions, log: Callable[[str], None] = print) -> GpuCheckRun:
    """Run the steps of ``opts`` in order within its budget; returns the run (rows and environment).

    Args:
        opts: what to run.
        log: receives one line per item.
    """
    run = GpuCheckRun(opts)
    if opts.device == "cuda":  # float32 means float32 in the agreement checks (the layers run bf16 autocast)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    log(f"GPU checks on {run.env.get('gpu') or run.env.get('cpu_model')} -> {run.out} (budget {opts.budget_s:g} s)")
    for step in opts.steps:
        log(f"{step}:")
        run.run_step(step, log)
    log(f"done in {time.time() - run.start:.0f} s: {run.out / 'gpu_checks.md'}")
    return run
