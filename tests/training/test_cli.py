"""The command line and what a run shows: --help without third-party notices and with the config groups, a
backend's options with their comments, the closest key for a typo, ``model.<field>=`` without ``+``, loggers
that compose (CSV always kept), ``train.log`` with the console, and a fast one-line failure for a hub name
without network."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, compose_cfg

import vitzoo
from vitzoo.attention import ATTENTION
from vitzoo.attention.__main__ import main as attention_main
from vitzoo.configs import CONFIG_DIR
from vitzoo.models import MODELS
from vitzoo.models.factory import model_fields
from vitzoo.registry import ConfigError
from vitzoo.training import train
from vitzoo.training.cli import add_model_fields, check_command_line
from vitzoo.training.run_log import ProgressBar, run_console
from vitzoo.training.utils import console

pytestmark = pytest.mark.usefixtures("one_thread")
NOTICES = ("Warning", "torch.jit.script", "litlogger", "LeafSpec", "No CUDA runtime")
TINY = ["model.depth=1", "model.embed_dim=32", "model.num_heads=2", "data.batch_size=32", "trainer.max_epochs=2",
        "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0",
        "benchmark.batch_size=4", "benchmark.warmup=1", "benchmark.steps=1"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def error_of(args: list[str], config_name: str = "train") -> str:
    with pytest.raises(SystemExit) as e:
        check_command_line(args, config_name)
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


def test_help_lists_groups_and_hides_known_notices():
    groups = {"attention": vitzoo.list_attention(), "model": vitzoo.list_models(), "experiment": options("experiment"),
              "logger": options("logger")}
    entry = Path(sys.executable).with_name("vitzoo-train")
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "vitzoo.train"]
    proc = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "OMP_NUM_THREADS": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert not [n for n in NOTICES if n in text], text
    lines = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in text.splitlines() if ":" in ln}
    for group, names in groups.items():  # every option that existed before the command, and only existing ones
        listed = [n.strip() for n in lines[group].split(",")]
        assert set(names) <= set(listed) <= set(options(group)) | set(names), group
    assert "python -m vitzoo.attention" in text


def test_eval_help_is_its_own_page():
    entry = Path(sys.executable).with_name("vitzoo-eval")
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "vitzoo.eval"]
    proc = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "OMP_NUM_THREADS": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and text.startswith("vitzoo-eval: evaluate a checkpoint"), text
    assert "eval is powered by Hydra" not in text and "vitzoo-eval ckpt_path=" in text
    assert not [n for n in NOTICES if n in text], text


def test_known_notices_are_filtered_and_can_be_shown(monkeypatch):
    import warnings

    from vitzoo.quiet import quiet_known_notices

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert quiet_known_notices(show=False)
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile`.", FutureWarning)
        warnings.warn("an unrelated deprecation", FutureWarning)
    assert [str(w.message) for w in seen] == ["an unrelated deprecation"]
    monkeypatch.setenv("VITZOO_SHOW_WARNINGS", "1")
    assert not quiet_known_notices()


@pytest.mark.parametrize("name", sorted(ATTENTION.names()) or vitzoo.list_attention())
def test_attention_options_are_listed_with_comments(name, capsys):
    assert attention_main([name]) == 0
    out = capsys.readouterr().out
    fields = [f.name for f in dataclasses.fields(ATTENTION.get(name)[1]) if f.init]
    lines = out.splitlines()
    for field in fields:  # the YAML's comment on the line or above it (or where the default comes from)
        i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"attention.{field}:"))
        assert "  # " in lines[i] or lines[i - 1].strip().startswith("#"), lines[i]
    assert out.startswith(f"attention={name}: ")
    assert ("no options" in out) == (not fields)


def test_attention_options_of_performer_and_a_typo(capsys):
    assert attention_main(["performer"]) == 0
    assert "attention.num_features: 256  # random features m per head" in capsys.readouterr().out
    assert attention_main(["perfomer"]) == 1
    err = capsys.readouterr().err.strip()
    assert "did you mean performer?" in err and "\n" not in err
    assert attention_main([]) == 0
    assert len([ln for ln in capsys.readouterr().out.splitlines() if ln.split(" ")[0] in ATTENTION.names()]) == len(
        vitzoo.list_attention())


@pytest.mark.parametrize(
    "args, expected",
    [
        (["attention=performer", "attention.num_feature=8"],
         "unknown option attention.num_feature for attention=performer; did you mean attention.num_features?"),
        (["atention=window"], "unknown option atention; did you mean attention?"),
        (["data.batch_sise=8"], "unknown option data.batch_sise for data=digits; did you mean data.batch_size?"),
        (["optim.lrr=1e-3"], "unknown option optim.lrr; did you mean optim.lr?"),
        (["-m", "attention=global,linformer", "attention.k=8"], "unknown option attention.k for attention=global"),
        (["model.bogus=1"], "unknown option model.bogus for model=vit_cifar; options of model:"),
        (["logger=[csv,wandbb]"], "unknown logger 'wandbb'"),
    ],
)
def test_typo_is_one_line_naming_the_closest_key(args, expected):
    assert expected in error_of(args)


def test_eval_keys_are_checked_against_eval_config():
    assert "did you mean ckpt_path?" in error_of(["ckpt_pth=x.ckpt"], "eval")


def test_model_fields_without_plus():
    assert add_model_fields(["model.depth=2", "+model.depth=1", "model.img_size=64", "model.depths=[2,2]"]) == [
        "++model.depth=2", "+model.depth=1", "model.img_size=64", "++model.depths=[2,2]"]
    for variant in vitzoo.list_models():  # every field of every model's config, with its own default
        config = vitzoo.models.model_config(variant)
        args = [f"model={variant}"] + [f"model.{f}={json.dumps(getattr(config, f))}" for f in model_fields(variant)
                                       if f != "token_reduction" and getattr(config, f) is not None]
        out = check_command_line(args)
        cfg = compose_cfg(out)
        assert {f: cfg.model[f] for f in model_fields(variant) if f in cfg.model and f != "num_classes"} == {
            f: getattr(config, f) for f in model_fields(variant) if f in cfg.model and f != "num_classes"}
    cfg = compose_cfg(check_command_line(["model.depth=2", "model.embed_dim=48"]))
    net = vitzoo.create_model(**{k: v for k, v in cfg.model.items() if k != "num_classes"}, num_classes=10)
    assert len(net.blocks) == 2 and net.cfg.embed_dim == 48
    assert compose_cfg(["+model.depth=3"]).model.depth == 3  # the + form still works


def test_model_field_of_another_family_fails_with_one_line():
    with pytest.raises(ConfigError, match=r"unknown option model\.depth for SwinConfig; did you mean model\.depths\?"):
        MODELS.config({"name": "swin_cifar", "depth": 2})


def test_loggers_compose_and_console_is_in_train_log(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    check_command_line(["logger=[csv,wandb]"])  # a list of loggers is a valid choice
    assert list(compose_cfg(["logger=[csv,wandb]"]).logger) == ["csv", "wandb"]
    out = tmp_path / "a run folder with a long name that a narrow console would wrap" / "run"
    cfg = compose_cfg([*check_command_line(TINY), "logger=wandb"], out_dir=out)  # wandb alone: CSV is kept
    results = train(cfg)
    assert results["status"] == "finished"
    metrics = (out / "csv" / "metrics.csv").read_text()
    assert "val/acc" in metrics
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    log = (out / "train.log").read_text()
    assert [ln.split()[1] for ln in log.splitlines() if ln.startswith("Epoch ")] == ["1/2", "2/2"]
    assert f"-> {out / 'results.json'}" in log  # the path whole, on the line that prints it
    assert "\x1b[" not in log


def test_run_console_keeps_whole_lines_and_the_error(tmp_path):
    import logging

    path = tmp_path / ("x" * 150) / "results.json"
    with pytest.raises(ConfigError):
        with run_console(tmp_path):
            console.print(f"a long line naming {path}")
            logging.getLogger("pytorch_lightning").warning("GPU available: False")  # the Trainer is built
            raise ConfigError("data.root=/nowhere does not exist")
    log = (tmp_path / "train.log").read_text().splitlines()
    assert log == [f"a long line naming {path}", "GPU available: False", "error: data.root=/nowhere does not exist"]


def test_run_stopped_before_the_trainer_leaves_train_log_as_it_was(tmp_path):
    (tmp_path / "train.log").write_text("the run so far\n")
    with pytest.raises(ConfigError):
        with run_console(tmp_path):
            print("ckpt_path=auto: resuming from last.ckpt")
            raise ConfigError("attention.name=global (the run has window) contradicts the run")
    assert (tmp_path / "train.log").read_text() == "the run so far\n"


def test_progress_bar_counts_epochs_from_one():
    class Trainer:
        max_epochs = 12

    bar = ProgressBar()
    bar._trainer = Trainer()
    assert bar._get_train_description(0).strip() == "Epoch 1/12"
    assert bar._get_train_description(11).strip() == "Epoch 12/12"


def test_hub_name_without_network_fails_at_once(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub
    import huggingface_hub.utils._http as hub_http
    import torch

    from vitzoo.models.pretrained import hub_reachable

    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "ENDPOINT", "https://127.0.0.1:9")  # nothing listens: the probe is refused
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))

    waits = []  # huggingface_hub's retry loop sleeps between tries: record any wait and stop it there

    class NoWait:
        def __getattr__(self, name):
            return getattr(time, name)

        def sleep(self, seconds):
            waits.append(seconds)
            raise ConnectionError("retry")

    monkeypatch.setattr(hub_http, "time", NoWait())
    assert not hub_reachable()
    with pytest.raises(ConfigError) as e:
        vitzoo.create_model("vit_small", pretrained="timm:deit_small_patch16_224", num_classes=10)
    message = str(e.value)
    assert "\n" not in message and "HF_HUB_OFFLINE" in message and "model.pretrained=<path>" in message
    assert waits == []  # no retries
    assert not hub.HF_HUB_OFFLINE  # the offline switch is put back
