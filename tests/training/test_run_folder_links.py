"""A run folder that is reused (a rerun, a resume, a copied folder) may hold symbolic links where Hydra, Lightning
and vitzoo write: each file is written in the link's place, the link's target is left alone, and a FIFO there is
one line instead of a blocked run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import compose_cfg
from test_bad_inputs import TINY

from vitzoo.registry import ConfigError
from vitzoo.training import train
from vitzoo.training.callbacks import RunFolderLinks
from vitzoo.training.run_log import RUN_FILES, clear_links, open_log

pytestmark = pytest.mark.usefixtures("one_thread")


def plant(run: Path, names, victim: Path) -> None:
    """A symbolic link to ``victim`` at each of ``names`` under ``run``."""
    for name in names:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(victim, run / name)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious")
    return path


def test_clear_links_removes_links_and_refuses_a_fifo(tmp_path, victim):
    run = tmp_path / "run"
    plant(run, RUN_FILES, victim)
    clear_links(run, RUN_FILES)
    assert victim.read_text() == "precious" and not any(os.path.lexists(run / n) for n in RUN_FILES)
    os.mkfifo(run / "train.log")
    with pytest.raises(ConfigError, match=r"^.*run/train.log is a FIFO, not a regular file; remove it"):
        clear_links(run, ["train.log"])


def test_the_run_log_is_never_written_through_a_link_or_into_a_fifo(tmp_path, victim):
    os.symlink(victim, tmp_path / "train.log")
    with open_log(tmp_path / "train.log") as f:
        f.write("line\n")
    assert victim.read_text() == "precious" and (tmp_path / "train.log").read_text() == "line\n"
    os.mkfifo(tmp_path / "other.log")
    with pytest.raises(OSError):  # no reader: refused at once instead of waiting for one
        open_log(tmp_path / "other.log")


def test_hydra_files_of_a_reused_run_or_sweep_folder_replace_links(tmp_path, victim):
    run = tmp_path / "run"
    names = [*RUN_FILES, "train.log"]
    plant(run, names, victim)
    cfg = compose_cfg([f"hydra.run.dir={run}", "hydra.job.name=train"], hydra=True)
    RunFolderLinks().on_run_start(cfg)
    assert not any(os.path.lexists(run / n) for n in names)
    sweep = tmp_path / "sweep"
    plant(sweep / "0_vit_cifar_global", names, victim)
    os.mkfifo(sweep / "0_vit_cifar_global" / "x.txt")  # a file no run writes: left alone
    cfg = compose_cfg([f"hydra.sweep.dir={sweep}", "hydra.job.name=train"], hydra=True)
    RunFolderLinks().on_multirun_start(cfg)
    assert not any(os.path.lexists(sweep / "0_vit_cifar_global" / n) for n in names)
    os.mkfifo(run / "train.log")
    with pytest.raises(SystemExit, match=r"^error: .*run/train.log is a FIFO, not a regular file"):
        RunFolderLinks().on_run_start(compose_cfg([f"hydra.run.dir={run}", "hydra.job.name=train"], hydra=True))
    assert victim.read_text() == "precious"


def test_a_run_into_a_folder_with_links_writes_its_own_files(tmp_path, victim):
    run = tmp_path / "run"
    names = ["train.log", "csv/metrics.csv", "csv/hparams.yaml", "results.json"]
    plant(run, names, victim)
    result = train(compose_cfg(TINY, run))
    assert result["status"] == "finished" and victim.read_text() == "precious"
    assert not any((run / n).is_symlink() for n in names)
    assert "epoch" in (run / "csv" / "metrics.csv").read_text() and (run / "train.log").stat().st_size > 0
