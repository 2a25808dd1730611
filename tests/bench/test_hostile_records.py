"""Careless or hostile result records, outputs and docs pages: compare and the ranking read records as data, skip
a bad one with one line naming its file and field, never block, and write only their own files, atomically."""
from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
from matplotlib.collections import PathCollection

from vitzoo.bench import labels
from vitzoo.bench.ranking import BEGIN, END, MAX_LABELS, place_labels, rank_records, ranking_figure, top_backends
from vitzoo.registry import ConfigError
from vitzoo.training.records import read_records, wilson_interval

GOOD = {"local": 0.60, "window": 0.58, "efficient": 0.55, "global": 0.52}  # the ranking every case must keep


def _rec(attention: str, top1: float, seed: int = 0, epochs: int = 3) -> dict:
    return {"version": 1, "model": "vit_cifar", "attention": attention, "seed": seed, "img_size": 32,
            "epochs": epochs, "top1": top1, "top1_ci95": list(wilson_interval(top1, 5000)), "top5": 0.95,
            "val_images": 5000, "precision": "bf16-mixed", "commit": "abc1234", "cpu": "Test CPU", "wall_s": 600.0}


def _write(root: Path, rec, rel: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rec if isinstance(rec, str) else json.dumps(rec))
    return path


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "records"
    for name, acc in GOOD.items():
        _write(root, _rec(name, acc), f"3ep/vit_cifar/{name}/seed0.json")
    return root


def _bad_global(**changes) -> dict:
    rec = _rec("global", 0.52, seed=1)
    for key, value in changes.items():
        if value is KeyError:
            rec.pop(key)
        else:
            rec[key] = value
    return rec


BAD = "3ep/vit_cifar/global/seed1.json"
CASES = {  # name -> (record text or content, the field the line names)
    "nan_top1": (json.dumps(_bad_global(top1=math.nan)), "top1"),
    "inf_top1": (json.dumps(_bad_global(top1=math.inf)), "top1"),
    "huge_top1": (_bad_global(top1=1e308), "top1"),
    "string_top1": (_bad_global(top1="0.99"), "top1"),
    "negative_val_images": (_bad_global(val_images=-5000), "val_images"),
    "missing_model": (_bad_global(model=KeyError), "model"),
    "unknown_model": (_bad_global(model="vit_bogus"), "model"),
    "short_interval": (_bad_global(top1_ci95=[0.5]), "top1_ci95"),
    "text_interval": (_bad_global(top1_ci95="0.5-0.6"), "top1_ci95"),
    "float_epochs": (_bad_global(epochs=3.0), "epochs"),
    "path_epochs": (_bad_global(epochs="/../../outside/PWNED"), "epochs"),
    "string_seed": (_bad_global(seed="1"), "seed"),
    "list_attention": (_bad_global(attention=["global"]), "attention"),
    "unregistered_attention": (_bad_global(attention=f"x{END}"), "attention"),
    "marker_in_cpu": (_bad_global(cpu=f"CPU {END} {BEGIN}"), "cpu"),
    "top1_outside_interval": (_bad_global(top1=0.99), "top1"),
    "unknown_field": (_bad_global(extra=1), "extra"),
    "other_place": (_bad_global(seed=7), "seed"),  # a seed7 record in seed1.json
    "list_record": ("[1, 2]", "not a JSON object"),
    "not_json": ("{", "not a JSON record"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_record_is_skipped_with_one_line_and_the_rest_still_ranks(tmp_path, case):
    root = _folder(tmp_path)
    content, field = CASES[case]
    _write(root, content, BAD)
    res = rank_records(root)
    assert len(res["skipped"]) == 1
    line = res["skipped"][0]
    assert "\n" not in line and BAD in line and field in line
    ranked = [(r["attention"], round(r["top1"], 6)) for r in res["rows"]]
    assert ranked == [(k, round(100 * v, 6)) for k, v in GOOD.items()]
    assert top_backends(root / "3ep", 2) == ["local", "window"]  # what the sweep script picks its follow-ups from
    assert sorted(p.name for p in root.glob("*.png")) == ["accuracy_vs_throughput_3ep.png"]
    assert not (tmp_path / "outside").exists()


def test_a_second_record_of_the_same_run_is_skipped(tmp_path):
    root = _folder(tmp_path)
    _write(root, _rec("local", 0.10), "copy/3ep/vit_cifar/local/seed0.json")
    skipped: list[str] = []
    assert len(read_records(root, skipped)) == len(GOOD)
    assert len(skipped) == 1 and "copy/3ep/vit_cifar/local/seed0.json" in skipped[0] and "seed" in skipped[0]


def test_compare_script_counts_the_skipped_records(tmp_path, capsys):
    from helpers import load_file

    root = _folder(tmp_path)
    _write(root, _bad_global(top1=math.nan), BAD)
    assert load_file("scripts", "compare").main([str(root)]) == 0
    out, err = capsys.readouterr()
    assert "skipped 1 bad record" in out and BAD in err and "top1" in err
    assert load_file("scripts", "compare").main([str(root / "3ep"), "--top", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "local,window" and "vit_cifar/global/seed1.json" in err  # stdout: the names only


class _Alarm:
    """Fail instead of hanging: SIGALRM after ``seconds``."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        def boom(*_):
            raise TimeoutError("blocked")

        self.old = signal.signal(signal.SIGALRM, boom)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


def test_a_fifo_record_or_benchmark_is_refused_without_blocking(tmp_path):
    root = _folder(tmp_path)
    (root / "3ep" / "vit_cifar" / "global" / "seed1.json").unlink(missing_ok=True)
    os.mkfifo(root / "3ep" / "vit_cifar" / "global" / "seed1.json")
    with _Alarm(60):
        res = rank_records(root)
    assert len(res["skipped"]) == 1 and "FIFO" in res["skipped"][0] and BAD in res["skipped"][0]
    assert len(res["rows"]) == len(GOOD)
    (root / "benchmark").mkdir()
    os.mkfifo(root / "benchmark" / "models.csv")
    with _Alarm(60), pytest.raises(ConfigError, match="models.csv.*FIFO"):
        rank_records(root)


def test_outputs_replace_symlinks_and_never_write_through_them(tmp_path):
    root = _folder(tmp_path)
    victims = {}
    for name in ("ranking.md", "ranking.csv", "accuracy_vs_throughput_3ep.png"):
        victims[name] = tmp_path / f"victim_{name}"
        victims[name].write_text("precious")
        os.symlink(victims[name], root / name)
    rank_records(root)
    for name, victim in victims.items():
        assert victim.read_text() == "precious"
        assert not (root / name).is_symlink() and (root / name).stat().st_size > 0
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_docs_refuses_a_symlink_a_missing_file_and_a_broken_block(tmp_path):
    root = _folder(tmp_path)
    real = tmp_path / "real.md"
    real.write_text(f"{BEGIN}\nold\n{END}\n")
    os.symlink(real, tmp_path / "link.md")
    with pytest.raises(ConfigError, match="symbolic link"):
        rank_records(root, docs=tmp_path / "link.md")
    assert real.read_text() == f"{BEGIN}\nold\n{END}\n"
    with pytest.raises(ConfigError, match="no such file"):
        rank_records(root, docs=tmp_path / "missing.md")
    assert not (root / "ranking.md").exists()  # a bad --docs fails before anything is written
    twice = tmp_path / "twice.md"
    twice.write_text(f"{BEGIN}\na\n{END}\n{BEGIN}\nb\n{END}\n")
    with pytest.raises(ConfigError, match="one '<!-- cifar10-ranking:begin -->'"):
        rank_records(root, docs=twice)
    assert twice.read_text() == f"{BEGIN}\na\n{END}\n{BEGIN}\nb\n{END}\n"


def test_docs_block_is_idempotent_and_holds_one_pair_of_markers(tmp_path):
    root = _folder(tmp_path)
    _write(root, _bad_global(attention=f"global{END}"), BAD)  # a record cannot smuggle a marker in
    docs = tmp_path / "results.md"
    docs.write_text(f"# Results\n\n{BEGIN}\nstale row\n{END}\n\nafter\n")
    rank_records(root, docs=docs)
    first = docs.read_bytes()
    rank_records(root, docs=docs)
    assert docs.read_bytes() == first
    text = first.decode()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "stale row" not in text
    assert text.startswith("# Results\n\n") and text.endswith(f"{END}\n\nafter\n")


def test_label_placement_checks_grow_linearly(monkeypatch):
    """2,000 labels on a lattice: each spot is checked against the few labels near it, not against all placed."""
    calls = 0
    original = labels.overlaps

    def counting(a, b):
        nonlocal calls
        calls += 1
        return original(a, b)

    monkeypatch.setattr(labels, "overlaps", counting)
    n = 2000
    anchors = [(30.0 * (i % 50), 12.0 * (i // 50)) for i in range(n)]
    offsets = place_labels(anchors, [40.0] * n, 10.0, (-100.0, -100.0, 1600.0, 600.0))
    assert len(offsets) == n
    assert calls <= 100 * n  # all-pairs checking makes about 12 * n * n / 2 = 24 million


def test_a_crowded_chart_labels_only_the_most_accurate_points():
    rows = [{"attention": "global", "model": "vit_cifar", "family": "dense", "top1": 50 + i / 100, "ci_low": 49.0,
             "ci_high": 51.0 + i / 100, "train_img_s": 100.0 + i, "train_peak_mb": 300.0} for i in range(300)]
    fig = ranking_figure(rows, "crowded")
    ax, = fig.axes
    assert len(ax.texts) == MAX_LABELS
    assert min(float(t.xy[1]) for t in ax.texts) == pytest.approx(50 + (300 - MAX_LABELS) / 100)


def test_a_chart_draws_as_many_artists_for_300_rows_as_for_3():
    """Drawing time grows with the rows only inside each artist: one collection per kind of mark."""
    def chart(n):
        rows = [{"attention": "global", "model": "vit_cifar", "family": "dense", "top1": 50 + i / 100, "ci_low": 49.0,
                 "ci_high": 51.0 + i / 100, "train_img_s": 100.0 + i, "train_peak_mb": 300.0,
                 "seed_top1": [49.5, 50.5]} for i in range(n)]
        ax, = ranking_figure(rows, "many").axes
        marks = [c for c in ax.collections if isinstance(c, PathCollection)]  # bubbles, seed marks, legend keys
        return len(ax.collections), sum(len(c.get_offsets()) for c in marks)

    (few, few_points), (many, many_points) = chart(3), chart(300)
    assert few == many and (few_points, many_points) == (3 * 3, 300 * 3)  # every bubble and seed mark, same artists


def test_ranking_looks_up_each_backends_family_once(tmp_path, monkeypatch):
    from vitzoo.bench import ranking

    calls = []
    monkeypatch.setattr(ranking, "family_of", lambda name: calls.append(name) or "dense")
    records = [{**_rec(name, acc, epochs=e), "path": f"{e}ep/{name}/seed0.json"}
               for name, acc in GOOD.items() for e in range(1, 51)]  # 50 budgets: 50 rows per backend
    rows = ranking.aggregate(records)
    assert len(rows) == 50 * len(GOOD) and sorted(calls) == sorted(GOOD)
