"""Every config in every group composes and resolves; model configs mirror the model registry."""
from __future__ import annotations

import dataclasses
import re

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONFIGS
from vitzoo.models import FAMILIES, VARIANTS, model_config

GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))]
# training configs (the attention group follows its own convention, checked in test_attention.py)
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "attention")


def compose_cfg(overrides=(), config="train", hydra=False):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose(config, overrides=list(overrides), return_hydra_config=hydra)


def resolved(cfg, tmp_path):
    """The config as plain data, with the Hydra-set output folder filled in."""
    cfg.paths.output_dir = str(tmp_path)
    data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("hydra", None)  # needs a running Hydra job (job number, output folder)
    return OmegaConf.to_container(OmegaConf.create(data), resolve=True)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_config_composes_and_resolves(group, option, tmp_path):
    cfg = compose_cfg([f"{group}={option}"], hydra=group == "hydra")
    data = resolved(cfg, tmp_path)
    for key in ("model", "data", "attention", "trainer", "optim"):
        assert data[key], f"{group}={option} lost {key}"
    assert data["model"]["name"] in VARIANTS
    if group in ("data", "logger", "callbacks"):
        built = instantiate(cfg[group])
        assert built is not None
    if group == "trainer" and option == "cpu":
        assert instantiate(cfg.trainer, logger=False, enable_checkpointing=False).max_epochs == data["trainer"]["max_epochs"]


def test_eval_config_composes(tmp_path):
    cfg = compose_cfg(["ckpt_path=x.ckpt"], config="eval")
    data = resolved(cfg, tmp_path)
    assert data["ckpt_path"] == "x.ckpt" and data.get("data") is None
    cfg = compose_cfg(["ckpt_path=x.ckpt", "data=cifar10"], config="eval")
    assert cfg.data.name == "cifar10"


def test_defaults_are_the_documented_ones(tmp_path):
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.data.name, cfg.attention.name, cfg.trainer.accelerator) == ("vit_cifar", "digits", "global", "cpu")
    assert list(cfg.logger) == ["csv"]
    assert cfg.model.num_classes == 10  # follows data.num_classes


def test_hydra_settings():
    cfg = compose_cfg(hydra=True)
    assert cfg.hydra.job.chdir is False
    assert "sweep_summary" in cfg.hydra.callbacks


def test_wandb_logger_is_offline_by_default(tmp_path):
    cfg = compose_cfg(["logger=wandb"])
    assert cfg.logger.wandb.offline is True


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_model_config_mirrors_the_variant(name):
    """configs/model/<variant>.yaml: name + every field of the family dataclass, with the variant's value."""
    path = CONFIGS / "model" / f"{name}.yaml"
    assert path.is_file(), f"no {path}"
    yaml_cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert yaml_cfg.pop("name") == name
    assert yaml_cfg.pop("pretrained") is None  # create_model's argument, not an architecture field
    family_cls = FAMILIES[VARIANTS[name][0]][1]
    assert set(yaml_cfg) == {f.name for f in dataclasses.fields(family_cls)}
    expected = dataclasses.asdict(model_config(name))
    for key, value in yaml_cfg.items():
        if key == "num_classes":
            assert value == "${data.num_classes}"
        else:
            assert value == expected[key], f"{path.name}: {key}={value} but {name} has {expected[key]}"


def test_every_model_config_is_a_variant():
    assert {p.stem for p in (CONFIGS / "model").glob("*.yaml")} == set(VARIANTS)


def test_experiments_are_global_packages():
    for path in (CONFIGS / "experiment").glob("*.yaml"):
        assert path.read_text().startswith("# @package _global_"), path


@pytest.mark.parametrize("path", ALL_YAML, ids=[str(p.relative_to(CONFIGS)) for p in ALL_YAML])
def test_every_default_has_a_comment(path):
    """Every ``key: value`` line and list item carries a ``#`` comment (CONTRIBUTING: a comment per field)."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        body = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not body or body.endswith(":"):
            continue  # blank, comment-only, or a mapping key whose children carry the comments
        if re.match(r"^-?\s*[\w/.@]+:\s*\S", body) or body.startswith("- ") or body == "{}":
            assert " #" in line, f"{path.relative_to(CONFIGS)}:{n} has no comment: {line.strip()}"
