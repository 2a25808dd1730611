"""The benchmark's predicted training peak (vitzoo.bench.memory_rows), its ``--memory-only`` rows, and docs/results.md's
memory table generated from them (vitzoo.bench.peak_table) by ``python scripts/gen_docs.py``."""
from __future__ import annotations

import json
import shutil

import pytest
from helpers import BENCH_TINY as TINY
from helpers import ROOT, load_file, read_csv

from vitzoo.attention import list_attention
from vitzoo.bench import BenchOptions, run_benchmark
from vitzoo.bench import peak_table as pt
from vitzoo.bench.memory_rows import PREDICTION_COLUMNS, saved_groups, top_saved
from vitzoo.bench.report import MODEL_COLUMNS, write_csv
from vitzoo.bench.run import model_cases
from vitzoo.costs import Saved
from vitzoo.registry import ConfigError

TERMS = ("predicted_params_mb", "predicted_optimizer_mb", "predicted_input_mb",
         "predicted_held_mb")  # what predicted_peak_mb sums, with predicted_runtime_mb


def test_memory_only_rows_carry_the_measured_peak_and_a_positive_prediction(tmp_path):
    """Memory-only rows: the training peak and the prediction term by term, no timing, FLOPs or references."""
    opts = BenchOptions(mode="models", memory_only=True, attention=["global", "window"], amp="none,bf16",
                        models=["vit_cifar", "swin_cifar"], model_tokens=[64], batches=[2], isolate=False,
                        out=str(tmp_path), **TINY)
    run_benchmark(opts, log=lambda msg: None)
    rows = read_csv(tmp_path / "models.csv")
    assert [(r["model"], r["amp"], r["backend"], r["status"]) for r in rows] == [
        (model, amp, backend, "ok") for model in ("vit_cifar", "swin_cifar") for amp in ("none", "bf16")
        for backend in ("global", "window")]
    assert not (tmp_path / "references.csv").exists()
    assert [(r["img_size"], r["tokens"]) for r in rows] == [("32", "65")] * 4 + [("16", "64")] * 4
    by_amp = {(r["model"], r["backend"], r["amp"]): float(r["predicted_activation_mb"]) for r in rows}
    assert by_amp[("vit_cifar", "global", "bf16")] != by_amp[("vit_cifar", "global", "none")]  # autocast's saved set
    kernels = {(r["model"], r["backend"], r["amp"]): int(r["predicted_kernels"]) for r in rows}
    assert kernels[("swin_cifar", "global", "bf16")] > kernels[("vit_cifar", "global", "bf16")]  # three stages' shapes
    for r in rows:
        assert r["train_img_s"] == r["gmacs"] == r["infer_peak_mb"] == ""
        assert r["train_peak_mb"] != ""
        assert all(float(r[k]) > 0 for k in TERMS)
        # the kernel caches of the step's distinct matmul / convolution calls, replayed in a fresh process
        assert int(r["predicted_kernels"]) > 0 and float(r["predicted_runtime_mb"]) >= 0
        assert float(r["predicted_peak_mb"]) == pytest.approx(
            sum(float(r[k]) for k in TERMS) + float(r["predicted_runtime_mb"]))
        assert int(r["predicted_activation_bytes"]) == pytest.approx(float(r["predicted_activation_mb"]) * 2**20)
        assert float(r["predicted_grads_mb"]) == pytest.approx(float(r["predicted_params_mb"]))
        # the held part: every activation and the largest transient at least (the last block's backward)
        held, activations = float(r["predicted_held_mb"]), float(r["predicted_activation_mb"])
        assert activations + float(r["predicted_transient_mb"]) <= held + 1e-9
        # AdamW after two steps: two fp32 moments per parameter and one step count per parameter tensor
        assert float(r["predicted_optimizer_mb"]) > 2 * float(r["predicted_params_mb"])
        assert float(r["peak_ratio"]) == pytest.approx(float(r["train_peak_mb"]) / float(r["predicted_peak_mb"]))
        assert r["predicted_top_saved"].count(" MB") == 2
        assert float(r["resident_other_mb"]) < float(r["train_peak_mb"])
    assert list(read_csv(tmp_path / "models.csv")[0])[:len(MODEL_COLUMNS)] == MODEL_COLUMNS


def test_timed_rows_carry_the_prediction_of_their_training_steps(tmp_path):
    opts = BenchOptions(mode="models", attention=["global"], models=["vit_cifar"], img_sizes=[16], batches=[2],
                        references=False, isolate=False, out=str(tmp_path), **TINY)
    row = run_benchmark(opts, log=lambda msg: None)["models"][0]
    assert row["status"] == "ok" and row["train_img_s"] > 0
    assert row["predicted_peak_mb"] > row["predicted_activation_mb"] > 0


def test_memory_only_needs_models_mode_and_parses_from_the_command_line():
    for options, name in (({"mode": "all", "memory_only": True}, "--memory-only"),
                          ({"amp": "none,bf16"}, "--amp none,bf16: several precisions"),
                          ({"amp": "bf16,fp16", "memory_only": True, "mode": "models"}, "--amp must be"),
                          ({"jobs": 2}, "--jobs 2"),
                          ({"jobs": 2, "memory_only": True, "mode": "models", "isolate": False}, "--jobs 2"),
                          ({"jobs": 0}, "--jobs 0")):
        with pytest.raises(ConfigError, match="^" + name) as exc:
            BenchOptions.from_options(options)
        assert "\n" not in str(exc.value)
    opts = load_file("scripts", "benchmark").parse_args(
        ["--mode", "models", "--memory-only", "--amp", "none,bf16", "--jobs", "2"])
    assert opts.memory_only and opts.amp == "none,bf16" and opts.jobs == 2


def test_model_tokens_set_each_models_side_from_its_patch():
    opts = BenchOptions(mode="models", model_tokens=[64, 1024, 4096], batches=[16, 4, 1], batch_per_size=True)
    assert model_cases(opts, "vit_cifar") == [(32, 16), (128, 4), (256, 1)]  # patch 4
    assert model_cases(opts, "swin_cifar") == [(16, 16), (64, 4), (128, 1)]  # patch 2
    for options, name in (({"model_tokens": [1000]}, "--model-tokens 1000"),
                          ({"model_tokens": [64], "img_sizes": [32]}, "--model-tokens"),
                          ({"model_tokens": [64, 256], "batches": [8], "batch_per_size": True}, "--batch-per-size")):
        with pytest.raises(ConfigError, match="^" + name):
            BenchOptions.from_options(options)
    assert load_file("scripts", "benchmark").parse_args(["--model-tokens", "64,1024"]).model_tokens == [64, 1024]


def test_saved_tensors_are_named_once_for_all_blocks():
    items = [Saved("blocks.0.mlp: GELU input", 100, 4), Saved("blocks.1.mlp: GELU input", 100, 4),
             Saved("stages.0.blocks.1.attn: scores", 300, 2), Saved("blocks.1: drop_path (mlp) keep mask", 2, 4),
             Saved("head input", 10, 4)]
    assert saved_groups(items) == [("mlp: GELU input", 800), ("attn: scores", 600), ("head input", 40),
                                   ("drop_path (mlp) keep mask", 8)]
    assert top_saved([Saved("blocks.0.mlp: fc2 input", 2**19, 4)] * 2) == "mlp: fc2 input 4.0 MB"


ENV = {"device": "cpu", "cpu_model": "AMD EPYC", "cpu_count": 2, "torch": "2.14.1", "git_commit": "abc1234",
       "date": "2026-12-07T09:00:00+00:00"}


def _row(backend, model, tokens, predicted, measured, top="attn: scores 3.0 MB; mlp: GELU input 2.0 MB"):
    return {"backend": backend, "model": model, "img_size": 16, "batch": 2, "tokens": tokens, "status": "ok",
            "train_peak_mb": measured, "predicted_peak_mb": predicted, "predicted_top_saved": top}


def _fixture_runs(root):
    """Two memory-only runs (fp32, bf16) of vit_cifar at 64 and 4,096 grid tokens under ``root/FOLDER``."""
    for name, amp, scale in (("fp32", "none", 1.0), ("bf16", "bf16", 0.5)):
        folder = root / pt.FOLDER / name
        folder.mkdir(parents=True)
        rows = [_row("global", "vit_cifar", 65, 50.0 * scale, 45.0 * scale),
                _row("global", "vit_cifar", 4097, 400.0 * scale, 420.0 * scale),
                _row("local", "vit_cifar", 65, 60.0 * scale, 80.0 * scale),
                {**_row("local", "vit_cifar", 4097, "", ""), "status": "out of memory during training"}]
        rows = [{**r, "amp": amp, "resident_other_mb": 20.0 * scale if r["backend"] == "local" else 0.0} for r in rows]
        write_csv(rows, MODEL_COLUMNS, folder / "models.csv")
        command = f"python scripts/benchmark.py --mode models --memory-only --amp {amp}"
        (folder / "environment.json").write_text(json.dumps({**ENV, "command": command, "options": {"amp": amp}}))


def test_memory_table_lists_predicted_measured_and_ratio_per_backend_tokens_and_precision(tmp_path):
    _fixture_runs(tmp_path)
    text = pt.block_text(tmp_path, list_attention())
    lines = text.splitlines()
    assert lines[0] == ("> **Machine:** AMD EPYC, 2 cores, torch 2.14.1 · **Command:** `python scripts/benchmark.py "
                        "--mode models --memory-only --amp bf16` · **Commit:** `abc1234` · **Date:** 2026-12-07")
    assert "--amp none` · **Commit:**" in lines[1]
    assert ("| backend | 64 tokens, fp32 | 64 tokens, bf16 | 4,096 tokens, fp32 | 4,096 tokens, bf16 "
            "| largest saved tensors, 4,096 tokens |") in lines
    assert ("| `global` | 50.0 / 45.0 (0.90) | 25.0 / 22.5 (0.90) | 400 / 420 (1.05) | 200 / 210 (1.05) "
            "| attn: scores 3.0 MB; mlp: GELU input 2.0 MB |") in lines
    assert ("| `local` | 60.0 / 80.0 (1.33) | 30.0 / 40.0 (1.33) | out of memory during training "
            "| out of memory during training |  |") in lines
    assert lines[-1] == ("4 of 6 configurations within 15 % of the prediction (measured ÷ predicted 0.90–1.33); "
                         "outside: `local` vit_cifar 64 tokens bf16 (1.33), `local` vit_cifar 64 tokens fp32 (1.33). "
                         "With what the process keeps beyond its tensors and the predicted kernel caches added to "
                         "the prediction (measured after the steps, `resident_other_mb` − `predicted_runtime_mb`): "
                         "6 of 6 within 15 %.")


def test_the_resident_line_adds_only_what_the_kernel_cache_term_leaves_out():
    row = {**_row("global", "swin_cifar", 64, "30.0", "60.0"), "precision": "bf16", "resident_other_mb": "28.0"}
    assert pt.ratios([row], other=True)[0][0] == pytest.approx(60 / 58)
    row["predicted_runtime_mb"] = "25.0"  # already in predicted_peak_mb: 3 MB left to add
    assert pt.ratios([row], other=True)[0][0] == pytest.approx(60 / 33)
    assert pt.ratios([{**row, "predicted_runtime_mb": "40.0"}], other=True)[0][0] == pytest.approx(2.0)


def test_gen_docs_writes_the_memory_table_and_check_fails_on_a_number_changed_by_hand(tmp_path, capsys):
    gen_docs = load_file("scripts", "gen_docs")
    (tmp_path / "docs").mkdir()
    for name in ("README.md", "docs/results.md"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "results" / "docs", tmp_path / "results" / "docs")
    assert gen_docs.main(["--check"], root=tmp_path) == 0
    assert f"skipped the {pt.BLOCK} block of docs/results.md: no {pt.FOLDER} committed" in capsys.readouterr().out
    _fixture_runs(tmp_path)
    assert gen_docs.main(["--check"], root=tmp_path) == 1
    assert gen_docs.main([], root=tmp_path) == 0
    results = tmp_path / "docs" / "results.md"
    written = results.read_text(encoding="utf-8")
    assert "| `global` | 50.0 / 45.0 (0.90) |" in written
    assert gen_docs.main(["--check"], root=tmp_path) == 0
    capsys.readouterr()
    results.write_text(written.replace("| `global` | 50.0 / 45.0 (0.90) |", "| `global` | 50.0 / 44.0 (0.88) |"),
                       encoding="utf-8")
    assert gen_docs.main(["--check"], root=tmp_path) == 1
    assert f"docs/results.md: the {pt.BLOCK} block differs from {pt.FOLDER}" in capsys.readouterr().err


def test_prediction_columns_follow_the_measured_peak():
    i = MODEL_COLUMNS.index("train_peak_mb")
    assert MODEL_COLUMNS[i + 1:i + 1 + len(PREDICTION_COLUMNS)] == PREDICTION_COLUMNS


def test_memory_only_jobs_run_side_by_side_each_in_its_own_process(tmp_path):
    opts = BenchOptions(mode="models", memory_only=True, attention=["global", "window"], models=["vit_cifar"],
                        model_tokens=[64], batches=[2], jobs=2, out=str(tmp_path), **TINY)
    rows = run_benchmark(opts, log=lambda msg: None)["models"]
    assert [(r["backend"], r["status"]) for r in rows] == [("global", "ok"), ("window", "ok")]
    assert all(r["train_peak_mb"] > 0 and r["predicted_peak_mb"] > 0 for r in rows)
    assert sorted(json.loads(line)["backend"] for line in (tmp_path / "rows.jsonl").read_text().splitlines()) == [
        "global", "window"]


def test_sparse_table_divides_each_peak_by_globals_and_names_those_over_the_bound(tmp_path):
    folder = tmp_path / pt.SPARSE_FOLDER
    folder.mkdir(parents=True)
    rows = [{**_row(b, "vit_cifar", 4097, pred, meas), "amp": amp}
            for amp, scale in (("none", 1.0), ("bf16", 0.5))
            for b, pred, meas in (("local", 150.0, 130.0 * scale), ("global", 160.0, 100.0 * scale),
                                  ("axial", 200.0, 125.0 * scale))]
    rows[-1] = {**rows[-1], "train_peak_mb": 61.0}  # axial in bf16: 1.22 x global's 50
    write_csv(rows, MODEL_COLUMNS, folder / "models.csv")
    (folder / "environment.json").write_text(json.dumps({**ENV, "command": "python scripts/benchmark.py x"}))
    lines = pt.sparse_text(tmp_path).splitlines()
    assert lines[0].startswith("> **Machine:** AMD EPYC, 2 cores") and "`python scripts/benchmark.py x`" in lines[0]
    assert lines[2].startswith("| backend | fp32: measured MB (÷ global) | bf16: measured MB (÷ global) |")
    assert lines[4].startswith("| `global` | 100 (1.00) | 50.0 (1.00) | 160 | 160 |")  # global first
    assert lines[5].startswith("| `local` | 130 (1.30) | 65.0 (1.30) |")
    assert lines[6].startswith("| `axial` | 125 (1.25) | 61.0 (1.22) |")
    assert lines[-1] == ("0 of 4 sparse configurations at most 1.2× `global`'s measured peak; over: `local` fp32 "
                         "(1.30), `local` bf16 (1.30), `axial` fp32 (1.25), `axial` bf16 (1.22).")
