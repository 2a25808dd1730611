"""The benchmark end to end on tiny sizes (tables, chart, references, unbuildable sizes), its options and CLI."""
from __future__ import annotations

import json

import pytest
from helpers import BENCH_TINY as TINY
from helpers import load_file, read_csv

import vitzoo
from vitzoo.bench import (
    NOT_INSTALLED,
    BenchOptions,
    run_benchmark,
)
from vitzoo.measure.environment import package_version
from vitzoo.registry import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _positive(value: str) -> bool:
    return float(value) > 0



def test_benchmark_end_to_end(tmp_path):
    """Two backends, one model, one size, one repeat: models, timm reference, layers, files; then the goals of
    ``tools/goals.py`` on its folder."""
    out = tmp_path / "bench"
    opts = BenchOptions(mode="all", attention=["global", "window"], models=["vit_cifar"], img_sizes=[16], batches=[2],
                        tokens=[64], isolate=False, out=str(out), **TINY)
    result = run_benchmark(opts, log=lambda msg: None)

    for name in ("environment.json", "results.json", "report.md", "layer_scaling.png", "models.csv", "models.md",
                 "layers.csv", "layers.md", "references.csv", "references.md"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "layer_scaling.png").read_bytes()[:8] == PNG_MAGIC

    env = json.loads((out / "environment.json").read_text())
    for key in ("torch", "cpu_model", "torch_threads", "device", "memory_method", "load_average", "options"):
        assert key in env, key
    assert env["torch_threads"] == 1 and env["device"] == "cpu"
    assert env["memory_method"].startswith("in-process (--no-isolate)")

    models = read_csv(out / "models.csv")
    assert [(r["backend"], r["model"], r["status"]) for r in models] == [("global", "vit_cifar", "ok"),
                                                                         ("window", "vit_cifar", "ok")]
    for r in models:
        for key in ("train_img_s", "train_img_s_min", "train_img_s_max", "infer_img_s", "latency_ms", "params_m",
                    "gmacs", "gmacs_analytic"):
            assert _positive(r[key]), (r["backend"], key)
        assert r["train_peak_mb"] != "" and r["infer_peak_mb"] != "" and r["threads"] == "1"
        assert float(r["gmacs"]) == pytest.approx(float(r["gmacs_analytic"]))

    refs = read_csv(out / "references.csv")
    timm_rows = [r for r in refs if r["level"] == "model"]
    assert len(timm_rows) == 1 and timm_rows[0]["status"] == "ok"  # identical configuration: same parameter count
    assert timm_rows[0]["params_vitzoo"] == timm_rows[0]["params_reference"]
    assert all(_positive(timm_rows[0][k]) for k in ("train_speed_ratio", "infer_speed_ratio", "latency_speed_ratio"))

    layers = read_csv(out / "layers.csv")
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
        assert float(r["mfu"]) == pytest.approx(
            float(r["gmacs_analytic"]) * 3 / (float(r["ms"]) / 1e3) / peak, rel=1e-2
        )
    for r in models:
        assert float(r["train_mfu"]) == pytest.approx(
            float(r["gmacs_analytic"]) * 3 * float(r["train_img_s"]) / peak, rel=1e-2
        )
        assert _positive(r["infer_mfu"])

    md = (out / "models.md").read_text().splitlines()
    assert md[0].startswith("| backend |") and set(md[1]) <= set("|-") and len(md) == 2 + len(models)
    assert all(line.count("|") == md[0].count("|") for line in md)
    load_file("tools", "goals").write_goals(out)
    for name in ("goals.csv", "goals.md"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    goals = read_csv(out / "goals.csv")
    timm_goals = {g["goal"].split(" speed")[0]: g for g in goals if "timm VisionTransformer" in g["goal"]}
    assert sorted(timm_goals) == ["vitzoo vit `global` infer", "vitzoo vit `global` train"]
    for phase in ("train", "infer"):  # the verdict follows the measured ratio
        ratio = float(timm_rows[0][f"{phase}_speed_ratio"])
        assert timm_goals[f"vitzoo vit `global` {phase}"]["status"] == ("met" if ratio >= 1 else "missed")
    assert [g["status"] for g in goals if "4096" in g["goal"]] == [
        "not measured (4096 not in --tokens or layers mode off)"
    ]
    assert "## goals" in (out / "report.md").read_text()
    assert result["environment"]["backends"] == ["global", "window"]


def test_layer_scaling_reports_unbuildable_sizes(tmp_path):
    """Layer mode at tiny sizes; a backend that refuses a size appears with the reason, not a crash."""
    out = tmp_path / "layers"
    opts = BenchOptions(
        mode="layers",
        attention=["global", "local"],
        tokens=[4, 16],
        isolate=False,
        out=str(out),
        pair_global_tokens=0,
        **TINY,
    )
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
    assert [r["status"][: len(expected)] for r in result["references"] if r["backend"] == "local"] == [expected]


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


def test_token_reduction_rows_name_the_reduced_model(tmp_path):
    """``--token-reduction tome``: the row is ``vit_cifar+tome`` (the training records' label, so the ranking
    joins it), it costs fewer MACs than the plain model with measured = analytic, and no timm twin runs."""
    rows = {}
    for reduction in (None, "tome"):
        out = tmp_path / str(reduction)
        opts = BenchOptions(mode="models", attention=["global"], models=["vit_cifar"], img_sizes=[16], batches=[2],
                            token_reduction=reduction, isolate=False, out=str(out), **TINY)
        run_benchmark(opts, log=lambda msg: None)
        (row,) = read_csv(out / "models.csv")
        assert row["status"] == "ok" and _positive(row["train_img_s"])
        assert float(row["gmacs"]) == pytest.approx(float(row["gmacs_analytic"]))
        rows[reduction] = row
        refs = read_csv(out / "references.csv") if (out / "references.csv").is_file() else []
        assert [r["level"] for r in refs if r.get("status") == "ok"] == ([] if reduction else ["model"])
    assert rows[None]["model"] == "vit_cifar" and rows["tome"]["model"] == "vit_cifar+tome"
    assert float(rows["tome"]["gmacs"]) < float(rows[None]["gmacs"])


def test_model_options_reach_the_benchmarked_model(tmp_path):
    """``--model-options``: the fast recipe's model levers are built into every row's model (its MACs are the
    conv stem's model's), the row keeps the variant's name so the ranking joins it, and no timm twin runs."""
    levers = {"stem": "conv", "stem_full_res_convs": 2, "global_pool": "avg", "pos_embed": "sincos"}
    out = tmp_path / "fast"
    opts = BenchOptions(mode="models", attention=["global"], models=["vit_cifar"], img_sizes=[16], batches=[2],
                        model_options=levers, isolate=False, out=str(out), **TINY)
    run_benchmark(opts, log=lambda msg: None)
    (row,) = read_csv(out / "models.csv")
    assert row["status"] == "ok" and row["model"] == "vit_cifar"
    expected = vitzoo.create_model("vit_cifar", img_size=16, **levers).flops() / 1e9
    assert float(row["gmacs_analytic"]) == pytest.approx(expected)
    assert float(row["gmacs_analytic"]) != pytest.approx(vitzoo.create_model("vit_cifar", img_size=16).flops() / 1e9)
    assert not (out / "references.csv").is_file() or not read_csv(out / "references.csv")
    cli = load_file("scripts", "benchmark").parse_args(["--models", "vit_cifar", "--model-options", '{"stem": "conv"}'])
    assert cli.model_options == {"stem": "conv"}


def test_options_are_strict():
    """An unknown or bad option is a one-line ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"^unknown option bench\.batch for BenchOptions") as exc:
        BenchOptions.from_options({"batch": [8]})
    assert "\n" not in str(exc.value)
    for options, name in (
        ({"mode": "fast"}, "--mode"),
        ({"tokens": [1000]}, "--tokens 1000"),
        ({"repeats": 0}, "--repeats"),
        ({"amp": "fp16"}, "--amp"),
        ({"token_reduction": "merge"}, "--token-reduction"),
        ({"model_options": {"stem": "convs"}}, "model.stem"),
    ):
        with pytest.raises(ConfigError, match="^" + name) as exc:
            BenchOptions.from_options(options)
        assert "\n" not in str(exc.value)
    assert BenchOptions.from_options({"batches": [8]}).batches == [8]


def test_benchmark_cli_parses_lists():
    opts = load_file("scripts", "benchmark").parse_args(
        ["--attention", "global,window", "--tokens", "256,1024", "--batch", "8,16", "--no-references", "--no-isolate"]
    )
    assert opts.attention == ["global", "window"] and opts.tokens == [256, 1024] and opts.batches == [8, 16]
    assert not opts.references and not opts.isolate
    with pytest.raises(SystemExit):
        load_file("scripts", "benchmark").parse_args(["--tokens", "1000"])  # not a square grid
