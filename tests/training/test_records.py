"""Result records (vitzoo.training.records) and the ranking built from them (vitzoo.bench.ranking)."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from helpers import compose_cfg
from matplotlib.legend import Legend
from omegaconf import OmegaConf

from vitzoo.bench.ranking import (
    BEGIN,
    END,
    _legend_sizes,
    aggregate,
    place_labels,
    rank_records,
    ranking_figure,
    top_backends,
)
from vitzoo.registry import ConfigError
from vitzoo.training import train
from vitzoo.training.callbacks import SweepSummary
from vitzoo.training.records import (
    check_record_dir,
    model_label,
    read_records,
    record_path,
    save_record,
    wilson_interval,
    write_record,
)

TINY = ["+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2", "trainer.max_epochs=1",
        "trainer.limit_train_batches=2", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
        "callbacks.rich_progress_bar=null", "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1",
        "export=false"]


@pytest.mark.parametrize("acc,n,low,high", [(0.5, 100, 0.40383, 0.59617), (0.9, 5000, 0.89138, 0.90801),
                                            (0.0, 50, 0.0, 0.07135), (1.0, 10, 0.72246, 1.0)])
def test_wilson_interval_matches_hand_computed_values(acc, n, low, high):
    got = wilson_interval(acc, n)
    assert got == pytest.approx((low, high), abs=2e-5)


def test_wilson_interval_without_images_is_nan():
    assert all(math.isnan(v) for v in wilson_interval(0.5, 0))


def test_record_path_names_model_attention_seed(tmp_path):
    assert record_path(tmp_path, "vit_cifar", "window", 3) == tmp_path / "vit_cifar" / "window" / "seed3.json"
    with pytest.raises(ConfigError, match="seed"):
        record_path(tmp_path, "vit_cifar", "window", "abc")


def test_write_record_refuses_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    link = tmp_path / "rec" / "seed0.json"
    link.parent.mkdir()
    os.symlink(target, link)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_record(link, {"version": 1})
    assert target.read_text() == "keep"


def test_a_finished_run_writes_its_record_and_a_rerun_skips_it(tmp_path):
    records = tmp_path / "records"
    first = train(compose_cfg([*TINY, f"record_dir={records}"], tmp_path / "run1"))
    path = records / "vit_cifar" / "global" / "seed0.json"
    rec = json.loads(path.read_text())
    assert rec["top1"] == first["best_val_acc"] and rec["val_images"] == 180  # digits: 180 validation images
    low, high = rec["top1_ci95"]
    assert low <= rec["top1"] <= high
    assert rec["epochs"] == 1 and rec["steps"] == 2 and rec["images_seen"] == 2 * rec["batch_size"]
    assert rec["precision"] == "32-true" and rec["cpu"] and rec["data"] == "digits"
    again = train(compose_cfg([*TINY, f"record_dir={records}"], tmp_path / "run2"))
    assert again == rec
    assert not (tmp_path / "run2" / "results.json").exists()  # nothing trained


@pytest.mark.parametrize("model,label", [
    ({"name": "vit_cifar"}, "vit_cifar"),
    ({"name": "vit_cifar", "token_reduction": None}, "vit_cifar"),
    ({"name": "vit_cifar", "token_reduction": "tome"}, "vit_cifar+tome"),
    ({"name": "vit_small", "token_reduction": {"name": "evit"}}, "vit_small+evit"),
])
def test_model_label_names_the_token_reducer(model, label):
    assert model_label(model) == label


def test_a_token_reducing_run_keeps_its_own_record(tmp_path):
    """The same backend with and without ToMe: two records, the second run is trained, not skipped."""
    records = tmp_path / "records"
    train(compose_cfg([*TINY, f"record_dir={records}"], tmp_path / "plain"))
    reduced = train(compose_cfg([*TINY, f"record_dir={records}", "model.token_reduction=tome"], tmp_path / "tome"))
    rec = json.loads((records / "vit_cifar+tome" / "global" / "seed0.json").read_text())
    assert rec["model"] == "vit_cifar+tome" and rec["top1"] == reduced["best_val_acc"]
    assert (tmp_path / "tome" / "results.json").exists()  # trained, not skipped by the plain run's record


def _record(folder, attention, seed, top1, epochs=3, model="vit_cifar", top5=0.95, commit="abc1234",
            experiment="zoo_test"):
    rec = {"version": 1, "model": model, "attention": attention, "seed": seed, "img_size": 32, "epochs": epochs,
           "experiment": experiment, "top1": top1, "top1_ci95": list(wilson_interval(top1, 5000)), "top5": top5,
           "val_images": 5000,
           "precision": "bf16-mixed", "commit": commit, "cpu": "Test CPU", "wall_s": 600.0}
    write_record(record_path(folder / f"{epochs}ep", model, attention, seed), rec)


def _benchmark(path, rows, model="vit_cifar"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["backend", "model", "img_size", "batch", "status", "train_img_s", "infer_img_s",
                               "train_peak_mb", "amp"])
        w.writeheader()
        for backend, train_s, mb in rows:
            w.writerow(dict(backend=backend, model=model, img_size=32, batch=128, status="ok",
                            train_img_s=train_s, infer_img_s=3 * train_s, train_peak_mb=mb, amp="bf16"))


def test_ranking_joins_records_with_the_benchmark(tmp_path):
    _record(tmp_path, "global", 0, 0.60)
    _record(tmp_path, "global", 1, 0.62, top5=0.97, commit="def5678")
    _record(tmp_path, "linear", 0, 0.55)
    _record(tmp_path, "window", 0, 0.58)
    _record(tmp_path, "global", 0, 0.70, epochs=10)
    _benchmark(tmp_path / "benchmark" / "models.csv", [("global", 100.0, 900), ("linear", 150.0, 700)])
    docs = tmp_path / "results.md"
    docs.write_text(f"# Results\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    res = rank_records(tmp_path, docs=docs)
    rows = {(r["attention"], r["epochs"]): r for r in res["rows"]}
    assert rows[("global", 3)]["top1"] == pytest.approx(61.0)
    cells = [f"{100 * a:.1f} ({100 * lo:.1f}–{100 * hi:.1f})"
             for a in (0.60, 0.62) for lo, hi in [wilson_interval(a, 5000)]]
    assert rows[("global", 3)]["seeds"] == " / ".join(cells)  # each seed with its own interval
    assert rows[("global", 3)]["top5"] == pytest.approx(96.0)  # the mean, like top-1
    assert rows[("global", 3)]["commit"] == "abc1234, def5678"  # every seed's commit
    low, high = wilson_interval(0.61, 5000)  # the mean's interval over the same 5,000 images
    assert (rows[("global", 3)]["ci_low"], rows[("global", 3)]["ci_high"]) == pytest.approx((100 * low, 100 * high))
    assert rows[("linear", 3)]["top1_ci95"] == "{:.1f}–{:.1f}".format(*(100 * v for v in wilson_interval(0.55, 5000)))
    assert rows[("linear", 3)]["train_img_s"] == 150.0 and rows[("linear", 3)]["train_peak_mb"] == 700
    assert rows[("window", 3)]["train_img_s"] is None  # not benchmarked: left empty, never guessed
    assert [r["attention"] for r in res["rows"] if r["epochs"] == 3] == ["global", "window", "linear"]
    assert {p.name for p in res["charts"]} == {"accuracy_vs_throughput_3ep.png", "accuracy_vs_throughput_10ep.png"}
    text = docs.read_text()
    assert "old" not in text and text.endswith("after\n") and "| global | dense | vit_cifar | 3 | 61.00 |" in text
    # the recipe named; both seeds of global count, 600 s each
    assert "**3 epochs of experiment=zoo_test** (4 runs in 3 rows, 0.7 hours of training wall time" in text
    assert top_backends(tmp_path / "3ep", 1, exclude=["global"]) == ["window"]


def test_each_recipe_folder_fills_its_own_docs_block(tmp_path):
    _record(tmp_path / "fast", "global", 0, 0.80, epochs=10, experiment="zoo_cifar10")
    _record(tmp_path / "short", "global", 0, 0.55, epochs=3, experiment="zoo_cifar10_short")
    docs = tmp_path / "results.md"
    docs.write_text(f"{BEGIN}\nx\n{END}\nmiddle\n<!-- short-ranking:begin -->\ny\n<!-- short-ranking:end -->\n")
    rank_records(tmp_path / "fast", docs=docs)
    rank_records(tmp_path / "short", docs=docs, block="short-ranking")
    fast, short = docs.read_text().split("middle")
    assert "experiment=zoo_cifar10**" in fast and "zoo_cifar10_short" not in fast
    assert "experiment=zoo_cifar10_short**" in short and "| 80.00 |" not in short
    with pytest.raises(ConfigError, match="--block 'Bad Name'"):
        rank_records(tmp_path / "fast", docs=docs, block="Bad Name")


def test_a_folder_mixing_two_recipes_is_refused_with_one_line(tmp_path):
    """No table mixes two recipes: the records of one folder share one experiment."""
    _record(tmp_path, "global", 0, 0.60, epochs=10, experiment="zoo_cifar10")
    _record(tmp_path, "window", 0, 0.65, epochs=10, experiment="zoo_cifar10_short")
    with pytest.raises(ConfigError, match="2 experiments .zoo_cifar10, zoo_cifar10_short.") as err:
        rank_records(tmp_path)
    assert "\n" not in str(err.value) and not (tmp_path / "ranking.md").exists()


def test_ranking_joins_every_benchmark_run_under_the_folder(tmp_path):
    """One benchmark run per model (vit_cifar/models.csv, swin_cifar/models.csv): both are joined."""
    _record(tmp_path, "global", 0, 0.60)
    _record(tmp_path, "window", 0, 0.65, epochs=10, model="swin_cifar")
    _benchmark(tmp_path / "benchmark" / "vit_cifar" / "models.csv", [("global", 100.0, 900)])
    _benchmark(tmp_path / "benchmark" / "swin_cifar" / "models.csv", [("window", 200.0, 400)], model="swin_cifar")
    res = rank_records(tmp_path)
    rows = {(r["model"], r["attention"]): r for r in res["rows"]}
    assert rows[("vit_cifar", "global")]["train_img_s"] == 100.0
    assert rows[("swin_cifar", "window")]["train_img_s"] == 200.0
    text = (tmp_path / "ranking.md").read_text()
    assert "swin_cifar/models.csv" in text and "vit_cifar/models.csv" in text


@pytest.mark.parametrize("peaks,sizes", [([203.4, 468.1], [200, 500]), ([80.0, 95.0], [80, 100]),
                                         ([350.0, 350.0], [400]), ([0.0], [])])
def test_bubble_legend_sizes_span_the_peaks(peaks, sizes):
    assert _legend_sizes(peaks) == sizes


def test_ranking_rows_name_the_family_from_the_registry(tmp_path):
    """The family column comes from the backend's subpackage; a record of an unregistered backend is left out."""
    for name in ("global", "linear", "longformer", "mixer"):
        _record(tmp_path, name, 0, 0.5)
    _record(tmp_path, "retired_backend", 0, 0.5)
    res = rank_records(tmp_path)
    families = {r["attention"]: r["family"] for r in res["rows"]}
    assert families == {"global": "dense", "linear": "linear", "longformer": "sparse", "mixer": "token_mixing"}
    assert len(res["skipped"]) == 1 and "retired_backend/seed0.json: field attention" in res["skipped"][0]


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_chart_labels_of_close_bubbles_do_not_overlap():
    """Four labels anchored at one point take the four free spots around it, inside the axes."""
    anchors, widths, height = [(100.0, 100.0)] * 4, [40.0, 30.0, 50.0, 20.0], 10.0
    offsets = place_labels(anchors, widths, height, (0.0, 0.0, 300.0, 300.0))
    boxes = [(x + dx, y + dy, x + dx + w, y + dy + height) for (x, y), (dx, dy), w in zip(anchors, offsets, widths)]
    assert all(not _overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # at the right edge the label goes to the left of its point rather than outside the axes
    (dx, _), = place_labels([(295.0, 100.0)], [40.0], height, (0.0, 0.0, 300.0, 300.0))
    assert dx + 40.0 <= 0


def test_chart_legends_lie_right_of_the_axes():
    """No bubble, interval or label can fall under a legend: both sit outside the plotting area."""
    rows = [{"attention": a, "model": "vit_cifar", "family": f, "top1": t, "ci_low": t - 1.4, "ci_high": t + 1.4,
             "train_img_s": s, "train_peak_mb": mb}
            for a, f, t, s, mb in [("global", "dense", 68.4, 188.0, 337.0),
                                   ("mixer", "token_mixing", 70.0, 396.0, 300.0)]]
    fig = ranking_figure(rows, "test")
    fig.canvas.draw()
    ax, = fig.axes
    legends = [a for a in ax.get_children() if isinstance(a, Legend)]
    assert len(legends) == 2  # the families and the bubble sizes with the Pareto front
    right = ax.get_window_extent().x1
    assert all(leg.get_window_extent().x0 >= right for leg in legends)
    assert all(leg.get_clip_path() is None or not leg.get_clip_on() for leg in legends)  # drawn, not clipped away


def test_ranking_of_an_empty_folder_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no result records"):
        rank_records(tmp_path)


@pytest.mark.parametrize("recipe", ["cifar10", "cifar10_short"])
def test_committed_records_are_readable(recipe):
    folder = ROOT / "results" / recipe
    if not any(folder.rglob("seed*.json")):
        pytest.skip(f"no committed records yet (results/{recipe})")
    skipped: list[str] = []
    rows = aggregate(read_records(folder, skipped))
    assert skipped == [] and rows and all(0.0 <= r["top1"] <= 100.0 for r in rows)


def test_every_committed_record_holds_the_command_that_reruns_it():
    paths = sorted((ROOT / "results").rglob("seed*.json"))
    if not paths:
        pytest.skip("no committed records yet (results/)")
    missing = [str(p.relative_to(ROOT)) for p in paths if not str(json.loads(p.read_text()).get("command") or "")
               .startswith("python train.py ")]
    assert not missing, f"records without their command: {missing}"


# ---- sweeps check before they train ---------------------------------------------------------------------------------
def test_an_unwritable_record_dir_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="record_dir=.*a_file/records is not writable"):
        check_record_dir(blocker / "records")
    assert check_record_dir(tmp_path / "new" / "records").is_dir()
    assert list((tmp_path / "new" / "records").iterdir()) == []  # the probe is gone


def _finished_job(folder):
    folder.mkdir(parents=True)
    results = {"status": "finished", "model": "vit_cifar", "attention": "global", "data": "digits", "best_val_acc": 0.9,
               "best_val_acc5": 1.0, "val_images": 180, "epochs": 1, "steps": 2, "wall_s": 3.0, "error": None}
    (folder / "results.json").write_text(json.dumps(results))
    return results


def test_a_record_that_cannot_be_written_fails_the_job_and_the_summary_says_so(tmp_path):
    job = tmp_path / "sweep" / "0_vit_cifar_global"
    results = _finished_job(job)
    run = {"model": {"name": "vit_cifar", "img_size": 32}, "attention": {"name": "global"}, "seed": 0,
           "data": {"name": "digits", "batch_size": 4}, "trainer": {"precision": "32-true"}}
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write .*seed0.json"):
        save_record(blocker / "records", results, run, job / "results.json")
    saved = json.loads((job / "results.json").read_text())
    assert saved["status"] == "failed" and "record is missing" in saved["error"]
    with pytest.raises(SystemExit, match="1 of 1 jobs failed: 0_vit_cifar_global"):
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}}))
    assert save_record(tmp_path / "records", results, run, job / "results.json").is_file()


def test_a_run_into_an_unwritable_record_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="record_dir=.* is not writable"):
        train(compose_cfg([*TINY, f"record_dir={blocker / 'records'}"], tmp_path / "run"))
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["status"] == "failed" and "not writable" in saved["error"]
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained


def _multirun(records, root, *task):
    """The config a multirun's callbacks get: the sweep's overrides under hydra, the base values at the top."""
    return OmegaConf.create({
        "record_dir": str(records), "model": {"img_size": 32},
        "data": {"_target_": "vitzoo.data.datamodules.ImageFolderDataModule", "name": "imagefolder",
                 "root": str(root), "img_size": "${model.img_size}"},
        "hydra": {"overrides": {"task": ["attention=global,window", *task]}, "sweeper": {"params": {"seed": "0,1"}}}})


def test_a_hydra_sweep_checks_records_and_data_before_the_first_job(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (tmp_path / "data" / "train" / "cat").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"^error: record_dir=.*a_file/records is not writable .*; no job of the "
                                         r"sweep started$"):
        SweepSummary().on_multirun_start(_multirun(blocker / "records", tmp_path / "data"))
    with pytest.raises(SystemExit, match=r"^error: data.root=.*no_data has no train/ folder .*; no job of the sweep "
                                         r"started$"):
        SweepSummary().on_multirun_start(_multirun(tmp_path / "records", tmp_path / "no_data"))
    SweepSummary().on_multirun_start(_multirun(tmp_path / "records", tmp_path / "data"))
    # what the sweep varies is each job's own to check: the base value is no job's
    SweepSummary().on_multirun_start(_multirun(blocker / "records", tmp_path / "no_data",
                                               f"record_dir={tmp_path}/r1,{tmp_path}/r2", "data=digits,imagefolder"))


@pytest.mark.slow
def test_train_multirun_into_an_unwritable_record_dir_starts_no_job(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "data=digits", "attention=global,window",
                           f"record_dir={blocker / 'records'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode != 0 and "not writable" in done.stderr and "no job of the sweep started" in done.stderr
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())


def _sweep_script(tmp_path, records, data):
    env = {**os.environ, "VITZOO_CIFAR10": str(data), "SWEEP_DIR": str(tmp_path / "sweep"), "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}  # its `python`: ours
    return subprocess.run(["bash", str(ROOT / "scripts" / "sweep_cifar10.sh"), str(records)], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_sweep_script_checks_records_and_data_before_the_first_job(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    done = _sweep_script(tmp_path, blocker / "records", tmp_path)
    assert done.returncode != 0 and "records folder" in done.stderr and "not writable" in done.stderr
    done = _sweep_script(tmp_path, tmp_path / "records", tmp_path / "no_data")
    assert done.returncode != 0 and "no_data has no train/" in done.stderr
    assert not (tmp_path / "sweep").exists()  # no job started
