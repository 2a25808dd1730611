"""Every config in every group composes and resolves; model configs agree with the model registry."""
from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import CONFIGS
from helpers import compose_cfg
from hydra.utils import instantiate
from omegaconf import OmegaConf

import vitzoo.training  # noqa: F401  (registers the optim/benchmark structured configs with Hydra's ConfigStore)
from vitzoo.models import MODELS, create_model, list_models, model_config, natural_attention
from vitzoo.registry import ConfigError
from vitzoo.training import BenchmarkConfig, OptimConfig, VitModule
from vitzoo.training.utils import benchmark_config

GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))]
# training configs (the attention group follows its own convention, checked in test_attention.py)
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "attention")


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
    assert data["model"]["name"] in MODELS
    if group in ("data", "logger", "callbacks"):
        built = instantiate(cfg[group])
        assert built is not None
    if group == "trainer" and option == "cpu":
        assert (
            instantiate(cfg.trainer, logger=False, enable_checkpointing=False).max_epochs
            == data["trainer"]["max_epochs"]
        )


def test_eval_config_composes(tmp_path):
    cfg = compose_cfg(["ckpt_path=x.ckpt"], config="eval")
    data = resolved(cfg, tmp_path)
    assert data["ckpt_path"] == "x.ckpt" and data.get("data") is None
    cfg = compose_cfg(["ckpt_path=x.ckpt", "data=cifar10"], config="eval")
    assert cfg.data.name == "cifar10"


def test_defaults_are_the_documented_ones(tmp_path):
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.data.name, cfg.attention.name, cfg.trainer.accelerator) == (
        "vit_cifar",
        "digits",
        "global",
        "cpu",
    )
    assert list(cfg.logger) == ["csv"]
    assert cfg.model.num_classes == 10  # follows data.num_classes


def test_hydra_settings():
    cfg = compose_cfg(hydra=True)
    assert cfg.hydra.job.chdir is False
    assert "sweep_summary" in cfg.hydra.callbacks


def test_wandb_logger_is_offline_by_default(tmp_path):
    cfg = compose_cfg(["logger=wandb"])
    assert cfg.logger.wandb.offline is True


@pytest.mark.parametrize("name", list_models())
def test_model_config_agrees_with_the_variant(name):
    """configs/model/<variant>.yaml: the name and the few fields a user changes, with the registered values."""
    assert (CONFIGS / "model" / f"{name}.yaml").is_file(), f"no configs/model/{name}.yaml"
    model = OmegaConf.to_container(compose_cfg([f"model={name}"]).model, resolve=False)
    assert model.pop("pretrained") is None  # create_model's argument, not an architecture field
    assert set(model) == {"name", "img_size", "num_classes", "drop_path_rate", "token_reduction"}, \
        "the rest comes from the registry"
    assert model.pop("name") == name and model.pop("num_classes") == "${data.num_classes}"
    expected = dataclasses.asdict(model_config(name))
    for key, value in model.items():
        assert value == expected[key], f"configs/model/{name}.yaml: {key}={value} but {name} has {expected[key]}"


@pytest.mark.parametrize("name", list_models())
def test_model_brings_its_natural_attention(name):
    """model=swin_* composes attention=window, model=vit_* global; attention= on the command line wins."""
    assert compose_cfg([f"model={name}"]).attention.name == natural_attention(name)
    assert compose_cfg([f"model={name}", "attention=linformer"]).attention.name == "linformer"


@pytest.mark.parametrize(
    "overrides,attention",
    [
        (["model=swin_cifar"], "window"),
        (["model=swin_cifar", "attention=linformer"], "linformer"),
        (["attention=performer", "model=swin_cifar"], "performer"),
        (["experiment=cifar10_swin"], "window"),
        (["experiment=cifar10_swin", "attention=global"], "global"),
        (["experiment=cifar10_vit"], "global"),
    ],
)
def test_attention_composition(overrides, attention, tmp_path):
    data = resolved(compose_cfg(overrides), tmp_path)
    assert data["attention"]["name"] == attention
    assert data["run_name"] == f"{data['model']['name']}_{attention}"


PRESETS = {"vit_cifar_fast": "vit_cifar"}  # model configs that set options of a variant (a recipe's model levers)


def test_every_model_config_is_a_variant_or_a_preset_of_one():
    assert {p.stem for p in (CONFIGS / "model").glob("*.yaml")} == set(list_models()) | set(PRESETS)


@pytest.mark.parametrize("preset,variant", sorted(PRESETS.items()))
def test_a_model_preset_builds_its_variant_with_its_options(preset, variant):
    cfg = compose_cfg([f"model={preset}"])
    assert cfg.model.name == variant and compose_cfg([f"model={variant}"]).model.name == variant
    options = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=False).items()
               if k not in ("name", "num_classes", "pretrained", "token_reduction")}
    model = create_model(variant, num_classes=10, **options)
    assert all(getattr(model.cfg, k) == v for k, v in options.items())  # every preset field is a model option


def test_optim_and_benchmark_defaults_are_the_dataclasses():
    cfg = compose_cfg(["optim.lr=3e-4", "benchmark.steps=2"])  # no `+`: the structured config has the keys
    expected = dataclasses.asdict(OptimConfig(lr=3e-4))
    assert OmegaConf.to_container(cfg.optim) == {**expected, "betas": list(expected["betas"])}  # YAML has no tuples
    assert benchmark_config(cfg.benchmark) == BenchmarkConfig(steps=2)
    assert benchmark_config(compose_cfg(["ckpt_path=x.ckpt"], config="eval").benchmark) == BenchmarkConfig(
        warmup=5, steps=20
    )


def test_optim_and_benchmark_are_strict():
    with pytest.raises(ConfigError, match=r"^unknown option optim\.foo for OptimConfig; valid options: betas") as err:
        VitModule(model={"name": "vit_cifar", "depth": 1}, optim={"foo": 1})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^unknown option benchmark\.bar for BenchmarkConfig"):
        benchmark_config({"bar": 2})
    module = VitModule(model={"name": "vit_cifar", "depth": 1}, optim={"lr": 0.5})  # plain dict, as checkpoints store
    assert module.optim == OptimConfig(lr=0.5)


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
