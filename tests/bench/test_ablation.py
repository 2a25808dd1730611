"""scripts/ablation.py: the recipe's ablation table from tuning records, its docs block refreshed idempotently and
checked against the records."""
from __future__ import annotations

import json

from helpers import load_file

ablation = load_file("scripts", "ablation")


def record(top1, command, curve=None, tta=None):
    return {"top1": top1, "top1_ci95": [top1 - 0.01, top1 + 0.01], "top1_tta": tta, "top1_per_epoch": curve,
            "command": command, "val_images": 5000, "precision": "bf16-mixed", "cpu": "cpu X", "date": "2026-12-07",
            "commit": "abc1234"}


def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def folders(tmp_path):
    base, tuning = tmp_path / "base", tmp_path / "tuning"
    write(base / "seed0.json", record(0.5, None))
    write(base / "seed1.json", record(0.6, None))
    common = "python train.py experiment=cifar10_short export=false record_dir=x"
    write(tuning / "t01_a/vit_cifar/global/seed0.json",
          record(0.7, f"{common} +model.stem=conv +callbacks.flip_tta._target_=T", [0.5, 0.7], tta=0.71))
    write(tuning / "t02_b/stopped.json", {"val_top1_per_epoch": [0.4], "command": f"{common} optim.lr=2e-3",
                                          "why": "after 1 of 3 epochs"})
    return base, tuning


def test_table_lists_levers_curves_and_the_difference_to_the_short_recipe(tmp_path):
    base, tuning = folders(tmp_path)
    rows = ablation.table(tuning, base).splitlines()
    assert rows[0].startswith("> **Machine:** cpu X") and "**Commit:** abc1234" in rows[0]
    assert "55.00 % (mean of 2 seeds" in rows[2]
    assert rows[-2] == "| t01_a | `model.stem=conv` | 50.0 / 70.0 | 70.00 (69.0–71.0) | +15.00 | – | 71.00 | abc1234 |"
    assert rows[-1].startswith("| t02_b | `optim.lr=2e-3` | 40.0 | stopped: after 1 of 3 epochs |")


def test_each_run_names_the_run_it_builds_on_and_what_it_adds(tmp_path):
    base, tuning = folders(tmp_path)
    common = "python train.py experiment=cifar10_short export=false record_dir=x"
    for tag, top1, levers in [("t03_c", 0.72, "+model.stem=conv model.x=1 optim.lr=5e-4"),
                              ("t04_d", 0.69, "+model.stem=conv model.x=1 optim.lr=1e-3"),
                              ("t05_e", 0.74, "+model.stem=conv model.y=2")]:
        write(tuning / f"{tag}/vit_cifar/global/seed0.json", record(top1, f"{common} {levers}"))
    steps = {r.split(" | ")[0][2:]: r.split(" | ")[5] for r in ablation.table(tuning, base).splitlines()
             if r.startswith("| t0")}
    assert steps["t03_c"] == "t01_a: `model.x=1`, `optim.lr=5e-4` (+2.00)"
    assert steps["t04_d"] == "t03_c: `optim.lr=1e-3` (-3.00)"  # one lever changed against the closest run
    assert steps["t05_e"] == "t01_a: `model.y=2` (+4.00)"  # not t03/t04: they set options t05 leaves alone


def test_docs_block_is_replaced_idempotently_and_checked(tmp_path, capsys):
    base, tuning = folders(tmp_path)
    docs = tmp_path / "results.md"
    docs.write_text(f"# R\n\n{ablation.BEGIN}\nold\n{ablation.END}\n\ntail\n")
    args = ["--tuning", str(tuning), "--baseline", str(base), "--docs", str(docs)]
    assert ablation.main(args) == 0
    once = docs.read_text()
    assert ablation.main(args) == 0 and docs.read_text() == once and "old" not in once and once.endswith("tail\n")
    assert ablation.main([*args, "--check"]) == 0
    docs.write_text(once.replace("+15.00", "+16.00"))  # a number changed by hand
    assert ablation.main([*args, "--check"]) == 1


def test_missing_markers_are_one_line(tmp_path, capsys):
    base, tuning = folders(tmp_path)
    docs = tmp_path / "results.md"
    docs.write_text("no block\n")
    assert ablation.main(["--tuning", str(tuning), "--baseline", str(base), "--docs", str(docs)]) == 2
    assert "needs one" in capsys.readouterr().err and docs.read_text() == "no block\n"
