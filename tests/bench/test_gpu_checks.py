"""The GPU check run (vitzoo.bench.gpu_checks) at smoke sizes on the CPU: every step runs and reports, the
budget stops new items, a failing item does not lose the others, and the FlexAttention check can fail."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
import torch
from helpers import BENCH_TINY, native_bf16

from vitzoo.attention import build_attention
from vitzoo.attention.sparse import flex
from vitzoo.bench import gpu_checks
from vitzoo.bench.gpu_checks import SIZES, STEPS, GpuCheckOptions, fixed_pattern_backends, run_gpu_checks
from vitzoo.bench.options import BenchOptions
from vitzoo.registry import ConfigError

ROOT = gpu_checks.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of every step, on one thread: the layer steps at the tiny layer shape of the benchmark tests
    (``BENCH_TINY``), the timm step at batch 1 where bf16 is emulated (its bf16 items are most of the run there)."""
    out = tmp_path_factory.mktemp("gpu_checks")
    mp = pytest.MonkeyPatch()
    mp.setenv("VITZOO_CACHE", str(out / "cache"))
    mp.setattr(gpu_checks, "BenchOptions",
               functools.partial(BenchOptions, **{k: v for k, v in BENCH_TINY.items() if k.startswith("layer_")}))
    mp.setitem(SIZES, "smoke", {**SIZES["smoke"], "model_batch": SIZES["smoke"]["model_batch"] if native_bf16() else 1})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = run_gpu_checks(GpuCheckOptions(out=str(out), device="cpu", smoke=True, budget_s=600), log=lambda m: None)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return run, out


def test_every_step_reports_and_passes_on_the_cpu(smoke):
    run, out = smoke
    result = json.loads((out / "results.json").read_text())
    assert set(STEPS) <= set(result) and result["environment"]["device"] == "cpu"
    flex = result["flex"]
    assert [r["backend"] for r in flex][:len(fixed_pattern_backends())] == fixed_pattern_backends()
    for r in flex:  # forward only on the CPU: both impls agree with the float64 reference
        assert r["status"] == "ok" and r["flex_output_err"] < 1e-5 and r["blocked_output_err"] < 1e-5, r
        assert "flex_grad_err" not in r
    assert {(r["model"], r["amp"]) for r in result["timm"]} == {(m, a) for m in ("vit_cifar", "swin_cifar")
                                                                for a in ("none", "bf16")}
    assert all(r["status"].startswith("ok") and r["train_speed_ratio"] > 0 for r in result["timm"])
    for step, tokens in (("layers", SIZES["smoke"]["tokens"]), ("layers_large", SIZES["smoke"]["tokens_large"])):
        rows = {r["backend"]: r for r in result[step]}
        assert all(r["status"] == "ok" and r["tokens"] == tokens for r in rows.values()), step
        assert rows["global"]["time_ratio"] == 1 and rows["performer"]["mfu"] > 0
        assert "local (blocked)" in rows and "local (flex)" not in rows  # no FlexAttention backward on the CPU
    assert result["precision"][0]["status"] == "ok" and result["precision"][0]["fp32"] > 0
    md = (out / "gpu_checks.md").read_text()
    assert md.startswith(f"# GPU checks: {run.env['cpu_model']}") and all(f"## {s}" in md for s in STEPS)


def test_cuda_layers_time_both_impls():
    specs = dict(gpu_checks._layer_specs("cuda"))
    for name in fixed_pattern_backends():
        assert specs[f"{name} (flex)"]["impl"] == "flex" and specs[f"{name} (blocked)"]["impl"] == "blocked"
    assert "impl" not in specs["global"]


def test_flex_check_fails_on_a_wrong_output(monkeypatch):
    run = flex.run_flex
    monkeypatch.setattr(flex, "run_flex", lambda *a, **k: run(*a, **k) * 1.001)
    row = gpu_checks.flex_agreement("local", {}, SIZES["smoke"], "cpu")
    assert row["status"].startswith("MISMATCH") and row["blocked_output_err"] < 1e-5 < row["flex_output_err"]


@pytest.mark.parametrize("name", fixed_pattern_backends())
def test_blocked_gradients_agree_with_the_reference(name, one_thread):
    """The gradient half of the check (what runs on CUDA for both impls), on the CPU's blocked path."""
    row = gpu_checks.flex_agreement(name, {}, SIZES["smoke"], "cpu", impls=("blocked",), backward=True)
    assert row["status"] == "ok" and row["blocked_grad_err"] < 1e-5, row


def test_gradient_check_fails_on_a_wrong_gradient(monkeypatch):
    """A forward hook leaves the output as it is and scales every gradient by 1.001: the check says so."""
    def build(spec, ctx):
        attn = build_attention(spec, ctx)
        attn.register_forward_hook(lambda mod, inp, out: out + 1e-3 * (out - out.detach()))
        return attn

    monkeypatch.setattr(gpu_checks, "build_attention", build)
    row = gpu_checks.flex_agreement("bigbird", {}, SIZES["smoke"], "cpu", impls=("blocked",), backward=True)
    assert row["blocked_output_err"] < 1e-5 and row["blocked_grad_err"] > 5e-4 and row["status"].startswith("MISMATCH")


def test_budget_skips_and_failures_stay_items(tmp_path, monkeypatch):
    def boom(*args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(gpu_checks, "flex_agreement", boom)
    run = run_gpu_checks(GpuCheckOptions(out=str(tmp_path), device="cpu", smoke=True, steps=["flex"]),
                         log=lambda m: None)
    assert all(r["status"] == "error: RuntimeError: kernel exploded" for r in run.rows["flex"])
    run = run_gpu_checks(GpuCheckOptions(out=str(tmp_path), device="cpu", smoke=True, steps=["timm"], budget_s=1e-9),
                         log=lambda m: None)
    assert run.rows["timm"] and all(r["status"].startswith("skipped: budget") for r in run.rows["timm"])
    assert json.loads((tmp_path / "results.json").read_text())["timm"] == run.rows["timm"]


@pytest.mark.parametrize("options,match", [({"steps": ["flex", "nope"]}, "--steps: unknown nope"),
                                           ({"budget_s": 0}, "--budget must be positive")])
def test_bad_options_are_one_line_errors(tmp_path, options, match):
    with pytest.raises(ConfigError, match=match):
        GpuCheckOptions(out=str(tmp_path), device="cpu", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cli_without_cuda_names_the_option(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_checks.py"), "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--device cuda: no CUDA device is available" in proc.stderr
