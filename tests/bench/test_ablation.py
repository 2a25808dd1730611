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


def test_an_override_given_twice_is_one_lever_with_its_last_value():
    """Hydra keeps the last value of a key given twice (the tuning script's lr, then the run's own)."""
    command = "python train.py experiment=cifar10_short optim.lr=7e-4 +model.stem=conv optim.lr=8e-4"
    assert ablation.lever_list(command) == ["optim.lr=8e-4", "model.stem=conv"]


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


def test_each_length_has_its_own_table_with_the_recipe_as_first_row(tmp_path):
    base, tuning = folders(tmp_path)
    common = "python train.py experiment=cifar10_short export=false record_dir=x"
    long_base, recipe = tmp_path / "base10", tmp_path / "recipe10"
    write(long_base / "seed0.json", {**record(0.68, None), "epochs": 10})
    write(recipe / "seed0.json", {**record(0.80, "python train.py experiment=zoo_cifar10"), "epochs": 10})
    write(tuning / "t03_long/vit_cifar/global/seed0.json",
          {**record(0.82, f"{common} +model.stem=conv model.x=2 trainer.max_epochs=10"), "epochs": 10})
    short = ablation.table(tuning, base)
    assert "t03_long" not in short and "| t01_a |" in short  # a 10-epoch run is not in the 3-epoch table
    rows = ablation.table(tuning, long_base, 10, recipe, "t01_a").splitlines()
    assert "10 epochs" in rows[2] and "68.00 % (one seed, cpu X)" in rows[2]
    assert "--epochs 10" in rows[0] and "--recipe-run t01_a" in rows[0]
    assert rows[-2].startswith("| recipe | `model.stem=conv` | – | 80.00 (79.0–81.0) | +12.00 | – |")
    assert rows[-1].split(" | ")[5] == "recipe: `model.x=2` (+2.00)"  # the length is no lever; the step is
    assert ablation.block_name(10) == "cifar10-ablation-10ep" and ablation.block_name(3) == ablation.BLOCK


def test_reference_without_its_defining_run_is_one_line(tmp_path):
    base, tuning = folders(tmp_path)
    write(tmp_path / "recipe10/seed0.json", {**record(0.8, "x"), "epochs": 10})
    write(tuning / "t03_long/vit_cifar/global/seed0.json", {**record(0.82, "python train.py a=1"), "epochs": 10})
    try:
        ablation.table(tuning, base, 10, tmp_path / "recipe10", "t99_missing")
    except ablation.ConfigError as e:
        assert "--recipe-run" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("a missing recipe run must fail")


def test_the_shipped_recipe_holds_the_levers_of_its_defining_run():
    """experiment=cifar10_fast is the committed tuning run RECIPE_RUN: each lever of that run's command holds in
    the composed config, so the 10-epoch table's first row names what the recipe is."""
    from helpers import ROOT, compose_cfg
    from omegaconf import OmegaConf

    rec = ablation.read(ROOT / "results/cifar10_tuning" / ablation.RECIPE_RUN / "vit_cifar/global/seed0.json")
    cfg = compose_cfg(["experiment=cifar10_fast"])
    for lever in ablation.lever_list(rec["command"]):
        key, value = lever.split("=", 1)
        assert same(OmegaConf.select(cfg, key), value), lever


def same(held, text):
    """A composed value equals an override's text (numbers compared as numbers: ``7e-4`` is 0.0007)."""
    try:
        return float(held) == float(text)
    except (TypeError, ValueError):
        return str(held) == text
