"""scripts/benchmark.py and scripts/compare.py (vitzoo.bench) on tiny configurations and fabricated rows.

Nothing here asserts a speed (see CONTRIBUTING.md): only that every number is there and positive,
that failures are reported with their reason, that the outputs parse, and that the pieces that turn
numbers into verdicts (ABBA timing order, goals, Pareto front, sweep table) give exactly what they should.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import require_cpu_kernel

from vitzoo.attention import list_attention
from vitzoo.bench import (
    NOT_INSTALLED,
    BenchOptions,
    Timing,
    goal_rows,
    package_version,
    run_benchmark,
    run_job,
    time_fns,
)
from vitzoo.bench.compare import compare_runs, find_run_dirs, pareto_front, plotted_runs, sweep_command
from vitzoo.bench.memory import _glibc
from vitzoo.flops import mfu as mfu_module
from vitzoo.registry import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _positive(value: str) -> bool:
    return float(value) > 0


TINY = dict(warmup=1, repeats=1, min_time=0.0, max_time=10.0, threads=1, layer_dim=32, layer_heads=2,
            layer_batch=1, layer_window=4)


def test_benchmark_end_to_end(tmp_path):
    """Two backends, one model, one size, one repeat: models, timm reference, layers, goals, files."""
    out = tmp_path / "bench"
    opts = BenchOptions(mode="all", attention=["global", "window"], models=["vit_cifar"], img_sizes=[16], batches=[2],
                        tokens=[64], isolate=False, out=str(out), **TINY)
    result = run_benchmark(opts, log=lambda msg: None)

    for name in ("environment.json", "results.json", "report.md", "layer_scaling.png", "models.csv", "models.md",
                 "layers.csv", "layers.md", "references.csv", "references.md", "goals.csv", "goals.md"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "layer_scaling.png").read_bytes()[:8] == PNG_MAGIC

    env = json.loads((out / "environment.json").read_text())
    for key in ("torch", "cpu_model", "torch_threads", "device", "memory_method", "load_average", "options"):
        assert key in env, key
    assert env["torch_threads"] == 1 and env["device"] == "cpu"
    assert env["memory_method"].startswith("in-process (--no-isolate)")

    models = _csv(out / "models.csv")
    assert [(r["backend"], r["model"], r["status"]) for r in models] == [("global", "vit_cifar", "ok"),
                                                                         ("window", "vit_cifar", "ok")]
    for r in models:
        for key in ("train_img_s", "train_img_s_min", "train_img_s_max", "infer_img_s", "latency_ms", "params_m",
                    "gmacs", "gmacs_analytic"):
            assert _positive(r[key]), (r["backend"], key)
        assert r["train_peak_mb"] != "" and r["infer_peak_mb"] != "" and r["threads"] == "1"
        assert float(r["gmacs"]) == pytest.approx(float(r["gmacs_analytic"]))

    refs = _csv(out / "references.csv")
    timm_rows = [r for r in refs if r["level"] == "model"]
    assert len(timm_rows) == 1 and timm_rows[0]["status"] == "ok"  # identical configuration: same parameter count
    assert timm_rows[0]["params_vitzoo"] == timm_rows[0]["params_reference"]
    assert all(_positive(timm_rows[0][k]) for k in ("train_speed_ratio", "infer_speed_ratio", "latency_speed_ratio"))

    layers = _csv(out / "layers.csv")
    assert {r["backend"] for r in layers} == {"global", "window"} and all(r["status"] == "ok" for r in layers)
    window = next(r for r in layers if r["backend"] == "window")
    assert _positive(window["flops_ratio"]) and _positive(window["time_ratio"]) and _positive(window["efficiency"])
    # 64 tokens <= pair_global_tokens: timed in alternation with global in its own job
    assert window["ratio_method"] == "paired" and _positive(window["ms_global_paired"])
    assert float(window["time_ratio"]) == pytest.approx(float(window["ms_global_paired"]) / float(window["ms"]))
    # the back-to-back blocks' speedups bound the ratio of the medians (each pair's global >= min x its layer time)
    assert float(window["time_ratio_min"]) <= float(window["time_ratio"]) * (1 + 1e-9)
    assert float(window["time_ratio"]) <= float(window["time_ratio_max"]) * (1 + 1e-9)
    peak = env["matmul_peak_gmacs_s"]
    for r in layers:  # MFU = analytic MACs x batch x 3 / time / peak
        assert float(r["mfu"]) == pytest.approx(float(r["gmacs_analytic"]) * 3 / (float(r["ms"]) / 1e3) / peak, rel=1e-2)
    for r in models:
        assert float(r["train_mfu"]) == pytest.approx(float(r["gmacs_analytic"]) * 3 * float(r["train_img_s"]) / peak,
                                                      rel=1e-2)
        assert _positive(r["infer_mfu"])

    md = (out / "models.md").read_text().splitlines()
    assert md[0].startswith("| backend |") and set(md[1]) <= set("|-") and len(md) == 2 + len(models)
    assert all(line.count("|") == md[0].count("|") for line in md)
    goals = _csv(out / "goals.csv")
    timm_goals = {g["goal"].split(" speed")[0]: g for g in goals if "timm VisionTransformer" in g["goal"]}
    assert sorted(timm_goals) == ["vitzoo vit `global` infer", "vitzoo vit `global` train"]
    for phase in ("train", "infer"):  # the verdict follows the measured ratio
        ratio = float(timm_rows[0][f"{phase}_speed_ratio"])
        assert timm_goals[f"vitzoo vit `global` {phase}"]["status"] == ("met" if ratio >= 1 else "missed")
    assert [g["status"] for g in goals if "4096" in g["goal"]] == [
        "not measured (4096 not in --tokens or layers mode off)"]
    assert "## goals" in (out / "report.md").read_text()
    assert result["environment"]["backends"] == ["global", "window"]


def test_layer_scaling_reports_unbuildable_sizes(tmp_path):
    """Layer mode at tiny sizes; a backend that refuses a size appears with the reason, not a crash."""
    out = tmp_path / "layers"
    opts = BenchOptions(mode="layers", attention=["global", "local"], tokens=[4, 16], isolate=False, out=str(out),
                        pair_global_tokens=0, **TINY)
    result = run_benchmark(opts, log=lambda msg: None)
    rows = {(r["backend"], r["tokens"]): r for r in result["layers"]}
    assert rows[("global", 4)]["status"] == rows[("global", 16)]["status"] == "ok"
    assert rows[("local", 16)]["status"] == "ok"
    assert rows[("local", 4)]["status"].startswith("cannot build: attention.kernel_size")  # 3x3 on a 2x2 grid
    assert rows[("global", 16)]["flops_ratio"] == 1.0
    # pair_global_tokens=0: the speedup divides the times of the two rows (separate jobs)
    assert rows[("local", 16)]["ratio_method"] == "separate processes" and "ms_global_paired" not in rows[("local", 16)]
    assert "time_ratio_min" not in rows[("local", 16)]  # no pairs, no range
    assert rows[("local", 16)]["time_ratio"] == pytest.approx(rows[("global", 16)]["ms"] / rows[("local", 16)]["ms"])
    assert "cannot build" in (out / "layers.md").read_text()
    assert (out / "layer_scaling.png").read_bytes()[:8] == PNG_MAGIC
    # natten: one row (the 16-token layer; the 4-token one did not build), a ratio or "not installed"
    expected = NOT_INSTALLED if package_version("natten") is None else "ok"
    assert [r["status"][:len(expected)] for r in result["references"] if r["backend"] == "local"] == [expected]


def test_missing_reference_package_is_reported(tmp_path, monkeypatch):
    """Without the optional extra the reference row says "not installed"; nothing crashes."""
    import vitzoo.bench.references as references

    monkeypatch.setattr(references, "package_version", lambda module: None)
    opts = BenchOptions(mode="layers", attention=["linformer"], tokens=[16], isolate=False, out=str(tmp_path), **TINY)
    result = run_benchmark(opts, log=lambda msg: None)
    assert result["layers"][0]["status"] == "ok"
    (ref,) = [r for r in result["references"] if r["backend"] == "linformer"]
    assert ref["status"].startswith("not installed")
    assert "not installed" in (tmp_path / "references.md").read_text()


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


def test_options_are_strict():
    """An unknown or bad option is a one-line ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"^unknown option bench\.batch for BenchOptions") as exc:
        BenchOptions.from_options({"batch": [8]})
    assert "\n" not in str(exc.value)
    for options, name in (({"mode": "fast"}, "--mode"), ({"tokens": [1000]}, "--tokens 1000"),
                          ({"repeats": 0}, "--repeats"), ({"amp": "fp16"}, "--amp")):
        with pytest.raises(ConfigError, match="^" + name) as exc:
            BenchOptions.from_options(options)
        assert "\n" not in str(exc.value)
    assert BenchOptions.from_options({"batches": [8]}).batches == [8]


def test_goals_mark_met_and_missed():
    """Fabricated reference and layer rows: each goal's verdict, and the rows that are no goal, exactly."""
    refs = [{"level": "model", "backend": "global", "case": "vit_cifar 32px b64", "train_speed_ratio": 1.25,
             "train_speed_ratio_min": 1.1, "train_speed_ratio_max": 1.3, "infer_speed_ratio": 0.8,
             "infer_speed_ratio_min": 0.7, "infer_speed_ratio_max": 1.05},
            {"level": "layer", "backend": "performer", "fwd_bwd_speed_ratio": 3.0}]
    layers = [{"backend": "global", "tokens": 4096, "status": "ok", "linear_cost": False, "peak_mb": 200.0},
              {"backend": "performer", "tokens": 4096, "status": "ok", "linear_cost": True, "efficiency": 0.9,
               "time_ratio": 5.0, "time_ratio_min": 4.4, "time_ratio_max": 5.3, "flops_ratio": 5.55,
               "ratio_method": "paired", "peak_mb": 150.0},
              {"backend": "linformer", "tokens": 4096, "status": "ok", "linear_cost": True, "efficiency": 0.4,
               "time_ratio": 2.0, "flops_ratio": 5.0, "ratio_method": "paired", "peak_mb": 250.0},
              {"backend": "nystrom", "tokens": 4096, "status": "out of memory during forward+backward",
               "linear_cost": True},
              {"backend": "window", "tokens": 1024, "status": "ok", "linear_cost": True, "efficiency": 0.1},
              {"backend": "window", "tokens": 16384, "status": "ok", "linear_cost": True, "time_ratio": 12.0,
               "ratio_method": "separate processes"}]
    goals = goal_rows([], layers, refs, BenchOptions(mode="all"))
    assert [(g["goal"], g["measured"], g["target"], g["status"]) for g in goals] == [
        ("vitzoo vit `global` train speed vs timm VisionTransformer (amp none) (vit_cifar 32px b64)",
         "1.25 (1.10–1.30)", ">= 1.00", "met"),
        ("vitzoo vit `global` infer speed vs timm VisionTransformer (amp none) (vit_cifar 32px b64)",
         "0.80 (0.70–1.05)", ">= 1.00", "missed (within noise: the paired blocks straddle the target)"),
        ("vitzoo swin `window` train speed vs timm SwinTransformer (amp none)", "", ">= 1.00",
         "not measured (needs a swin_* model and the window backend)"),
        ("vitzoo swin `window` infer speed vs timm SwinTransformer (amp none)", "", ">= 1.00",
         "not measured (needs a swin_* model and the window backend)"),
        ("`performer` at 4096 tokens: time ratio / FLOPs ratio over global",
         "0.90 (5.00x of 5.55x, paired 4.40–5.30x)", ">= 0.5", "met"),  # every pair keeps >= 0.79
        ("`performer` at 4096 tokens: speedup over global", "5.00x, paired 4.40–5.30x", ">= 4.5",
         "met (within noise: the paired blocks straddle the target)"),
        ("`linformer` at 4096 tokens: time ratio / FLOPs ratio over global", "0.40 (2.00x of 5.00x, paired)", ">= 0.5",
         "missed"),
        ("`nystrom` at 4096 tokens: time ratio / FLOPs ratio over global", "", ">= 0.5",
         "not measured (out of memory during forward+backward)"),
        ("`performer` at 4096 tokens: peak memory vs global", "150 MB vs 200 MB", "<= global", "met"),
        ("`linformer` at 4096 tokens: peak memory vs global", "250 MB vs 200 MB", "<= global", "missed"),
        ("`nystrom` at 4096 tokens: peak memory vs global", "", "<= global",
         "not measured (global or this backend not measured)"),
        ("`window` at 16384 tokens: speedup over global", "12.00x, separate processes", ">= 10.0", "met")]


def test_matmul_peak_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE_DIR", str(tmp_path / "cache"))
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


def test_benchmark_cli_parses_lists():
    opts = _script("benchmark").parse_args(["--attention", "global,window", "--tokens", "256,1024", "--batch", "8,16",
                                            "--no-references", "--no-isolate"])
    assert opts.attention == ["global", "window"] and opts.tokens == [256, 1024] and opts.batches == [8, 16]
    assert not opts.references and not opts.isolate
    with pytest.raises(SystemExit):
        _script("benchmark").parse_args(["--tokens", "1000"])  # not a square grid


def _fake_job(root: Path, name: str, attention: str, results: dict | None) -> Path:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"attention={attention}", "experiment=zoo_digits"]))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"runtime": {"choices": {"attention": attention, "model": "vit_cifar", "data": "digits"}}}}))
    if results is not None:
        (job / "results.json").write_text(json.dumps(results))
    return job


def _finished(attention: str, acc: float, speed: float, mem: float) -> dict:
    return {"status": "finished", "model": "vit_cifar", "attention": attention, "data": "digits", "best_val_acc": acc,
            "best_val_acc5": 0.99, "val_loss": 0.5, "train_images_per_s": speed, "infer_images_per_s": 4 * speed,
            "peak_memory_mb": mem, "params": 1806538, "gmacs": 0.126, "gmacs_analytic": 0.126, "epochs": 3,
            "best_ckpt": "x.ckpt", "export_dir": "export", "error": None}


def test_compare_fabricated_multirun(tmp_path, capsys):
    """Finished, failed, unfinished and result-less jobs: all in the table, only finished ones plotted."""
    sweep = tmp_path / "multirun" / "zoo_digits" / "2024-01-01" / "12-00-00"
    _fake_job(sweep, "0_vit_cifar_global", "global", _finished("global", 0.80, 300.0, 900.0))
    _fake_job(sweep, "1_vit_cifar_window", "window", _finished("window", 0.85, 250.0, 700.0))
    _fake_job(sweep, "2_vit_cifar_performer", "performer",
              {"status": "failed", "model": "vit_cifar", "attention": "performer", "data": "digits",
               "error": "RuntimeError: NaN loss"})
    _fake_job(sweep, "3_vit_cifar_linformer", "linformer", None)  # crashed before writing results.json
    _fake_job(sweep, "10_vit_cifar_local", "local", {"status": "running", "model": "vit_cifar", "attention": "local"})
    _fake_job(sweep, "4_vit_cifar_linear", "linear", _finished("linear", 0.70, 280.0, 500.0))  # dominated by global
    (sweep / "multirun.yaml").write_text("hydra: {}\n")

    assert [d.name for d in find_run_dirs(sweep)] == ["0_vit_cifar_global", "1_vit_cifar_window",
                                                     "2_vit_cifar_performer", "3_vit_cifar_linformer",
                                                     "4_vit_cifar_linear", "10_vit_cifar_local"]
    res = compare_runs(sweep)
    rows = res["rows"]
    # finished runs by accuracy, then the others by name, each with its reason
    assert [(r["attention"], r["status"]) for r in rows] == [
        ("window", "finished"), ("global", "finished"), ("linear", "finished"),
        ("linformer", "missing results.json"), ("local", "unfinished (running)"), ("performer", "failed")]
    plotted = plotted_runs(rows, "train_images_per_s")
    front = pareto_front([(r["train_images_per_s"], r["best_val_acc"]) for r in plotted])
    assert [plotted[i]["attention"] for i in front] == ["window", "global"]
    assert next(r for r in rows if r["attention"] == "linformer")["model"] == "vit_cifar"  # from .hydra
    assert res["png"].read_bytes()[:8] == PNG_MAGIC

    table = _csv(sweep / "compare" / "runs.csv")
    assert [r["attention"] for r in table] == [r["attention"] for r in rows]
    assert float(table[0]["best_val_acc_pct"]) == pytest.approx(85.0)
    md = (sweep / "compare" / "runs.md").read_text()
    for text in ("missing results.json", "failed", "RuntimeError: NaN loss", "unfinished (running)", "85.00"):
        assert text in md

    out = tmp_path / "cmp"
    assert _script("compare").main([str(sweep), "--out", str(out), "--x", "infer"]) == 0
    assert (out / "accuracy_vs_throughput.png").read_bytes()[:8] == PNG_MAGIC
    assert "window" in capsys.readouterr().out


def test_pareto_front():
    pts = [(100, 0.9), (200, 0.8), (150, 0.7), (300, 0.6), (50, 0.95), (300, 0.5)]
    assert pareto_front(pts) == [4, 0, 1, 3]


def test_sweep_covers_every_backend():
    """Both zoo experiments sweep ``attention: glob(*)``: every registered backend has a YAML there."""
    from hydra import compose, initialize_config_dir

    import vitzoo.training  # noqa: F401  (registers the optim/benchmark structured configs train.yaml composes)
    yamls = {p.stem for p in (ROOT / "configs" / "attention").glob("*.yaml")}
    assert set(list_attention()) <= yamls
    if not (ROOT / "configs" / "train.yaml").exists():
        pytest.skip("configs/train.yaml not present")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for name, data in (("zoo_digits", "digits"), ("zoo_cifar10", "imagefolder")):
            cfg = compose("train", overrides=[f"experiment={name}"], return_hydra_config=True)
            assert cfg.hydra.sweeper.params.attention == "glob(*)"
            assert cfg.model.name == "vit_cifar" and cfg.data.name == data and cfg.task_name == name
    assert sweep_command("zoo_digits").endswith("attention=" + ",".join(list_attention()))


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


def test_ab_kernel_core_compares_a_revision_with_the_working_tree():
    """scripts/ab_kernel_core.py runs both versions of the core on the same input (tiny size, two blocks)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_kernel_core.py"), "--kind", "exp", "--tokens", "64",
                          "--features", "16", "--rev", "HEAD", "--blocks", "2"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "max |A - B|: output" in out.stdout and "B faster by" in out.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_kernel_core.py"), "--rev", "no-such-revision"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "pass --rev a revision of this repository" in bad.stderr


def test_ab_module_swaps_a_revision_of_a_module_into_its_importers():
    """scripts/ab_module.py times a layer with a revision's module in place of the working tree's (tiny size):
    the names other modules imported from it are swapped; a bad module is a one-line error."""
    cmd = [sys.executable, str(ROOT / "scripts" / "ab_module.py"), "--rev", "HEAD", "--attention", "bigbird",
           "--tokens", "64", "--blocks", "2", "--steps", "1"]
    out = subprocess.run(cmd + ["--module", "vitzoo.attention.sparse.gather"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "vitzoo.attention.sparse.pattern.block_attention" in out.stdout and "B faster by" in out.stdout
    bad = subprocess.run(cmd + ["--module", "vitzoo.no_such_module"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "pass --rev a revision of this repository and --module" in bad.stderr


def test_ab_cpu_kernel_times_the_kernels_against_the_torch_path():
    """scripts/ab_cpu_kernel.py alternates the compiled kernels and the PyTorch path on one layer (tiny size) and
    prints their difference and ratio for training and inference."""
    for stem in ("block_attention", "feature_attention"):
        require_cpu_kernel(stem)
    cmd = [sys.executable, str(ROOT / "scripts" / "ab_cpu_kernel.py"), "--attention", "local,performer", "--tokens",
           "64", "--blocks", "2", "--steps", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "kernel faster by" in ln]
    assert [ln.split(",")[0] for ln in lines] == ["local train", "local infer", "performer train", "performer infer"]
    assert all(float(ln.rsplit(" ", 1)[1]) < 1e-4 for ln in lines)  # max |kernel - torch|
