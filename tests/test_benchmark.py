"""scripts/benchmark.py and scripts/compare.py on tiny configurations: files are produced and well formed.

Nothing here asserts a speed (see CONTRIBUTING.md): only that every number is there and positive,
that failures are reported with their reason, and that the outputs parse.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from vitzoo.attention import list_attention
from vitzoo.bench import (BenchOptions, compare_runs, find_run_dirs, pareto_front, run_benchmark, run_job,
                          sweep_command, time_fns)

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

    models = _csv(out / "models.csv")
    assert [(r["backend"], r["model"], r["status"]) for r in models] == [("global", "vit_cifar", "ok"),
                                                                         ("window", "vit_cifar", "ok")]
    for r in models:
        for key in ("train_img_s", "train_img_s_min", "train_img_s_max", "infer_img_s", "latency_ms", "params_m",
                    "gmacs", "gmacs_analytic"):
            assert _positive(r[key]), (r["backend"], key)
        assert float(r["train_img_s_min"]) <= float(r["train_img_s"]) <= float(r["train_img_s_max"])
        assert float(r["train_peak_mb"]) >= 0 and r["threads"] == "1"
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

    md = (out / "models.md").read_text().splitlines()
    assert md[0].startswith("| backend |") and set(md[1]) <= set("|-") and len(md) == 2 + len(models)
    assert all(line.count("|") == md[0].count("|") for line in md)
    goals = _csv(out / "goals.csv")
    assert {g["status"].split(":")[0].split(" (")[0] for g in goals} <= {"met", "missed", "not measured"}
    assert any("4096" in g["goal"] and g["status"].startswith("not measured") for g in goals)
    assert "## goals" in (out / "report.md").read_text()
    assert result["environment"]["backends"] == ["global", "window"]


def test_layer_scaling_reports_unbuildable_sizes(tmp_path):
    """Layer mode at tiny sizes; a backend that refuses a size appears with the reason, not a crash."""
    out = tmp_path / "layers"
    opts = BenchOptions(mode="layers", attention=["global", "local"], tokens=[4, 16], isolate=False, out=str(out),
                        **TINY)
    result = run_benchmark(opts, log=lambda msg: None)
    rows = {(r["backend"], r["tokens"]): r for r in result["layers"]}
    assert rows[("global", 4)]["status"] == rows[("global", 16)]["status"] == "ok"
    assert rows[("local", 16)]["status"] == "ok"
    assert rows[("local", 4)]["status"].startswith("cannot build: attention.kernel_size")  # 3x3 on a 2x2 grid
    assert rows[("global", 16)]["flops_ratio"] == 1.0
    assert "cannot build" in (out / "layers.md").read_text()
    assert (out / "layer_scaling.png").read_bytes()[:8] == PNG_MAGIC
    local_refs = [r for r in result["references"] if r["backend"] == "local"]
    assert local_refs and all(r["status"] for r in local_refs)  # natten: a ratio, forward only, or "not installed"


def test_missing_reference_package_is_reported(tmp_path, monkeypatch):
    """Without the optional extra the reference row says "not installed"; nothing crashes."""
    import vitzoo.bench as bench

    monkeypatch.setattr(bench, "package_version", lambda module: None)
    opts = BenchOptions(mode="layers", attention=["linformer"], tokens=[16], isolate=False, out=str(tmp_path), **TINY)
    result = run_benchmark(opts, log=lambda msg: None)
    assert result["layers"][0]["status"] == "ok"
    (ref,) = [r for r in result["references"] if r["backend"] == "linformer"]
    assert ref["status"].startswith("not installed")
    assert "not installed" in (tmp_path / "references.md").read_text()


def test_worker_process_measures_memory():
    """The default path: one configuration in its own process, peak memory from that process."""
    job = dict(kind="layer", backend="global", spec={"name": "global"}, tokens=16, dim=32, heads=2, batch=1, prefix=1,
               window=4, device="cpu", mem_limit_gb=4, **{k: v for k, v in TINY.items() if not k.startswith("layer")})
    row = run_job(job, isolate=True, timeout=300)
    assert row["status"] == "ok", row
    assert row["ms"] > 0 and row["peak_mb"] >= 0 and row["threads"] == 1
    assert row["memory_method"]


def test_time_fns_alternates_and_counts_repeats():
    import torch

    calls = []
    t = time_fns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, torch.device("cpu"),
                 warmup=1, repeats=4, min_time=0.0)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then ABBA
    assert len(t["a"].seconds) == 4 and t["a"].iters == 1
    assert t["a"].min <= t["a"].median <= t["a"].max


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
    (sweep / "multirun.yaml").write_text("hydra: {}\n")

    assert [d.name for d in find_run_dirs(sweep)] == ["0_vit_cifar_global", "1_vit_cifar_window",
                                                     "2_vit_cifar_performer", "3_vit_cifar_linformer",
                                                     "10_vit_cifar_local"]
    res = compare_runs(sweep)
    rows = res["rows"]
    assert [r["attention"] for r in rows[:2]] == ["window", "global"]  # sorted by accuracy
    status = {r["attention"]: r["status"] for r in rows}
    assert status == {"window": "finished", "global": "finished", "performer": "failed",
                      "linformer": "missing results.json", "local": "unfinished (running)"}
    assert next(r for r in rows if r["attention"] == "linformer")["model"] == "vit_cifar"  # from .hydra
    assert res["png"].read_bytes()[:8] == PNG_MAGIC

    table = _csv(sweep / "compare" / "runs.csv")
    assert len(table) == 5 and table[0]["attention"] == "window"
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
