"""Comparing the runs of a sweep: the table, the Pareto front, the plot, the sweep command."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS
from helpers import load_file, read_csv

from vitzoo.attention import list_attention
from vitzoo.bench.compare import compare_runs, find_run_dirs, pareto_front, plotted_runs, sweep_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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

    table = read_csv(sweep / "compare" / "runs.csv")
    assert [r["attention"] for r in table] == [r["attention"] for r in rows]
    assert float(table[0]["best_val_acc_pct"]) == pytest.approx(85.0)
    md = (sweep / "compare" / "runs.md").read_text()
    for text in ("missing results.json", "failed", "RuntimeError: NaN loss", "unfinished (running)", "85.00"):
        assert text in md

    out = tmp_path / "cmp"
    assert load_file("scripts", "compare").main([str(sweep), "--out", str(out), "--x", "infer"]) == 0
    assert (out / "accuracy_vs_throughput.png").read_bytes()[:8] == PNG_MAGIC
    assert "window" in capsys.readouterr().out


def test_pareto_front():
    pts = [(100, 0.9), (200, 0.8), (150, 0.7), (300, 0.6), (50, 0.95), (300, 0.5)]
    assert pareto_front(pts) == [4, 0, 1, 3]


def test_sweep_covers_every_backend():
    """Both zoo experiments sweep ``attention: glob(*)``: every registered backend has a YAML there."""
    from hydra import compose, initialize_config_dir

    import vitzoo.training  # noqa: F401  (registers the optim/benchmark structured configs train.yaml composes)
    yamls = {p.stem for p in (CONFIGS / "attention").glob("*.yaml")}
    assert set(list_attention()) <= yamls
    if not (CONFIGS / "train.yaml").exists():
        pytest.skip("configs/train.yaml not present")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for name, data in (("zoo_digits", "digits"), ("zoo_cifar10", "imagefolder")):
            cfg = compose("train", overrides=[f"experiment={name}"], return_hydra_config=True)
            assert cfg.hydra.sweeper.params.attention == "glob(*)"
            assert cfg.model.name == "vit_cifar" and cfg.data.name == data and cfg.task_name == name
    assert sweep_command("zoo_digits").endswith("attention=" + ",".join(list_attention()))


@pytest.mark.parametrize("content,field", [
    ("[1, 2]", "(the file)"),
    ('"finished"', "(the file)"),
    (json.dumps(_finished("global", float("nan"), 300.0, 900.0)), "best_val_acc"),
    (json.dumps(_finished("global", 1e308, 300.0, 900.0)), "best_val_acc"),
    (json.dumps(_finished("global", "0.99", 300.0, 900.0)), "best_val_acc"),
    (json.dumps({**_finished("global", 0.9, 300.0, 900.0), "attention": ["global"]}), "attention"),
    (json.dumps(_finished("global", 0.9, -1.0, 900.0)), "train_images_per_s"),
])
def test_a_bad_results_json_is_listed_not_ranked(tmp_path, capsys, content, field):
    """One job's hostile results.json: its row says which field is bad, the other jobs still rank and plot."""
    sweep = tmp_path / "sweep"
    _fake_job(sweep, "0_vit_cifar_window", "window", _finished("window", 0.85, 250.0, 700.0))
    _fake_job(sweep, "1_vit_cifar_local", "local", _finished("local", 0.80, 300.0, 600.0))
    job = _fake_job(sweep, "2_vit_cifar_global", "global", None)
    (job / "results.json").write_text(content)
    res = compare_runs(sweep)
    assert [(r["attention"], r["status"]) for r in res["rows"]] == [
        ("window", "finished"), ("local", "finished"), ("global", f"invalid results.json ({field})")]
    assert [r["attention"] for r in plotted_runs(res["rows"], "train_images_per_s")] == ["window", "local"]
    err = capsys.readouterr().err
    assert "2_vit_cifar_global/results.json" in err and field in err and len(err.strip().splitlines()) == 1


def test_compare_outputs_never_follow_a_symlink_and_a_fifo_never_blocks(tmp_path):
    import os

    sweep = tmp_path / "sweep"
    _fake_job(sweep, "0_vit_cifar_window", "window", _finished("window", 0.85, 250.0, 700.0))
    job = _fake_job(sweep, "1_vit_cifar_global", "global", None)
    os.mkfifo(job / "results.json")
    (sweep / "compare").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("runs.md", "runs.csv", "accuracy_vs_throughput.png"):
        os.symlink(victim, sweep / "compare" / name)
    res = compare_runs(sweep)
    assert victim.read_text() == "precious"
    assert not any((sweep / "compare" / n).is_symlink() for n in ("runs.md", "runs.csv", "accuracy_vs_throughput.png"))
    assert [(r["attention"], r["status"]) for r in res["rows"]] == [
        ("window", "finished"), ("global", "unreadable results.json (NotRegularFile)")]
