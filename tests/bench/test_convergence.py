"""scripts/convergence.py: the long run's per-epoch curve as a table and chart, the 10-epoch runs marked, the docs
block refreshed and checked against the records."""
from __future__ import annotations

import json

from helpers import load_file

convergence = load_file("scripts", "convergence")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write(path, curve, top1=None, epochs=50):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "model": "vit_cifar", "attention": "global", "experiment": "zoo_cifar10", "seed": 0, "epochs": epochs,
        "top1": curve[-1] if top1 is None else top1, "top1_per_epoch": curve, "val_images": 5000,
        "precision": "bf16-mixed", "cpu": "cpu X", "commit": "abc1234", "date": "2026-12-07",
        "command": "python train.py experiment=zoo_cifar10 trainer.max_epochs=50"}))
    return path


def test_block_and_chart_from_the_records(tmp_path, capsys):
    curve = [0.5 + 0.01 * i for i in range(23)]  # a run in progress: 23 of 50 epochs
    record = write(tmp_path / "50ep/vit_cifar/global/seed0.json", curve)
    write(tmp_path / "10ep/vit_cifar/global/seed0.json", [0.6] * 10, epochs=10)
    write(tmp_path / "10ep/vit_cifar/global/seed1.json", [0.62] * 10, epochs=10)
    docs = tmp_path / "docs" / "results.md"
    docs.parent.mkdir()
    docs.write_text(f"# R\n\n{convergence.BEGIN}\nold\n{convergence.END}\nafter\n")
    args = ["--record", str(record), "--ten", str(tmp_path / "10ep/vit_cifar/global"), "--docs", str(docs)]
    assert convergence.main(args) == 0
    text = docs.read_text()
    assert "old" not in text and text.endswith("after\n") and "23 epochs (in progress)" in text
    assert "| 0 | 50.0 | 51.0 |" in text and "| 20 | 70.0 | 71.0 | 72.0 | | | | | | | |" in text
    assert "reach 61.00 % (mean of 2): 11.00 points under the long run's best" in text
    assert "](../50ep/../convergence_global.png)" not in text and "](../convergence_global.png)" in text
    assert (tmp_path / "convergence_global.png").read_bytes()[:8] == PNG_MAGIC
    assert convergence.main([*args, "--check"]) == 0
    docs.write_text(text.replace("50.0 |", "50.5 |", 1))  # a number changed by hand
    assert convergence.main([*args, "--check"]) == 1
    assert "differs" in capsys.readouterr().err


def test_a_record_without_a_curve_is_one_line(tmp_path, capsys):
    record = tmp_path / "seed0.json"
    record.write_text(json.dumps({"top1": 0.5}))
    assert convergence.main(["--record", str(record), "--ten", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {record}: no top1_per_epoch curve"
