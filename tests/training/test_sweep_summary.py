"""The multirun summary reads each job's results.json as data: a FIFO is refused without blocking, bad values are
shown as missing, and the sweep still reports which jobs did not finish."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from vitzoo.training.callbacks import SweepSummary


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_summary_refuses_a_fifo_and_survives_bad_values(tmp_path, capsys):
    for name in ("0_a", "1_b", "2_c"):
        (tmp_path / name).mkdir()
    (tmp_path / "0_a/results.json").write_text(json.dumps({"status": "finished", "best_val_acc": 0.5}))
    os.mkfifo(tmp_path / "1_b/results.json")  # opening it for reading would block forever
    (tmp_path / "2_c/results.json").write_text(json.dumps({"status": "finished", "best_val_acc": "x", "gmacs": 1e999}))
    config = SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path))))
    with pytest.raises(SystemExit, match="1 of 3 jobs failed: 1_b"):
        SweepSummary().on_multirun_end(config)
    assert "FIFO" in capsys.readouterr().out.replace("\n", " ")
