"""scripts/plan.py (vitzoo.bench.plan, vitzoo.bench.plan_cli): fit, largest batch and time from a model on meta."""
from __future__ import annotations

import re

import pytest
import torch

from vitzoo.attention import list_attention
from vitzoo.bench import plan_cli
from vitzoo.bench.plan import (
    DEVICES,
    OPTIMIZER_BYTES,
    Activations,
    Footprint,
    device,
    footprint,
    largest_batch,
    meta_model,
    peak_bytes,
    proxy_options,
)
from vitzoo.bench.plan_cli import hydra_overrides, main
from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.models import create_model
from vitzoo.registry import ConfigError

TINY = {"img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2}  # vit_cifar cut down: 8x8 tokens


def test_vit_base_local_at_1024_px_answers_fit_and_largest_batch(capsys):
    argv = ["model=vit_base", "attention=local", "model.img_size=1024", "data.batch_size=64", "--device", "h100-80gb"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "vit_base + local" in out and "88.81M parameters" in out and "353.66 GMACs per image" in out
    plain = re.search(r"batch 64: peak [\d.,]+ GiB -> (does not fit|fits); largest batch that fits: (\d+)", out)
    ckpt = re.search(r"batch 64 with grad_checkpointing: peak [\d.,]+ GiB -> (does not fit|fits); "
                     r"largest batch that fits: (\d+)", out)
    assert plain and ckpt
    assert plain.group(1) == "does not fit" and int(plain.group(2)) < 64  # 3.1 GiB of saved activations per image
    assert ckpt.group(1) == "fits" and int(ckpt.group(2)) >= 64
    assert "suggestion: model.grad_checkpointing=true" in out
    assert "ASSUMED utilisation 40%" in out and "h per epoch of 1,281,167 images" in out


@pytest.mark.parametrize("attention", ["global", "local"])
def test_the_model_is_built_without_weight_storage(attention):
    model, how = meta_model("vit_cifar", {"name": attention}, {})
    assert how == ("meta" if attention == "global" else "meta parameters")  # local computes its index tables
    assert all(p.is_meta for p in model.parameters()) and all(b.is_meta for b in model.buffers())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in create_model(
        "vit_cifar", attention=attention).parameters())


@pytest.mark.parametrize("name", ["vit_cifar", "swin_cifar"])
def test_drop_path_rates_on_meta_equal_the_cpu_build(name):
    def rates(model):
        return [getattr(m, "drop_prob", 0.0) for n, m in model.named_modules() if n.endswith("drop_path")]

    cpu = rates(create_model(name, drop_path_rate=0.1))
    with torch.device("meta"):
        on_meta = rates(create_model(name, attention="global", drop_path_rate=0.1))
    assert on_meta == cpu and len(set(cpu)) > 2  # bit-equal floats, increasing over the blocks
    assert rates(meta_model(name, None, {"drop_path_rate": 0.1})[0]) == cpu


def cpu_count(model, batch, checkpointing):
    """Activation bytes the counter finds on CPU, with real values, at ``batch``."""
    model.train()
    model.grad_checkpointing = checkpointing
    with SavedTensorCounter(model) as c:
        loss = model(torch.randn(batch, 3, 32, 32)).sum()  # noqa: F841 - kept alive while counting
    return c.activation_bytes


@pytest.mark.parametrize("checkpointing", [False, True])
def test_per_image_bytes_are_the_counters_batch_2_minus_batch_1(checkpointing):
    fp = footprint("vit_cifar", {"name": "global"}, TINY)
    model = create_model("vit_cifar", attention="global", **TINY)
    one, two = cpu_count(model, 1, checkpointing), cpu_count(model, 2, checkpointing)
    act = fp.activations(checkpointing)
    assert act.per_image == two - one > 0
    assert act.fixed == one - act.per_image and act.at(3) == one + 2 * (two - one)


@pytest.mark.parametrize("name,attention,options", [
    ("vit_cifar", "window", {"img_size": 32, "depth": 7, "embed_dim": 64, "num_heads": 2, "window_size": 4}),
    ("swin_cifar", "window", {"depths": [2, 5, 2]}),
])
def test_the_shallow_stand_in_counts_what_the_full_model_counts(name, attention, options):
    """Three blocks per list (unshifted without stochastic depth, shifted, unshifted) scale to any depth."""
    assert proxy_options(name, options)[2] is not None
    full = footprint(name, {"name": attention}, options)
    stand_in = footprint(name, {"name": attention}, options, proxy=True)
    assert (stand_in.params, stand_in.macs) == (full.params, full.macs)
    assert stand_in.plain == full.plain
    assert stand_in.checkpointed == full.checkpointed  # derived from the runs without checkpointing


def made_up(params=1_000_000, fixed=3_000, per_image=7_000_000, transient=500_000):
    act = Activations(fixed, per_image, transient)
    return Footprint("made up", params, 10**9, act, Activations(fixed, per_image // 10, 2 * transient), "meta")


@pytest.mark.parametrize("memory", [1e8, 2.5e8, 1e9, 80e9])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_largest_batch_is_the_last_one_whose_peak_fits(memory, checkpointing):
    fp = made_up()
    b = largest_batch(fp, memory, checkpointing)
    assert b > 0
    assert peak_bytes(fp, b, checkpointing) <= memory < peak_bytes(fp, b + 1, checkpointing)
    act = fp.activations(checkpointing)
    assert peak_bytes(fp, b, checkpointing) == (OPTIMIZER_BYTES * fp.params + act.fixed
                                               + b * (act.per_image + act.transient_per_image))


def test_no_batch_fits_when_the_optimizer_state_alone_is_too_big():
    fp = made_up(params=10**9)
    assert largest_batch(fp, 8e9) == 0 and peak_bytes(fp, 1) > 8e9


def test_a_bad_device_is_one_line_naming_the_option_and_the_choices(capsys):
    assert main(["model=vit_cifar", "--device", "tpu-v9"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device 'tpu-v9'" in err and all(name in err for name in DEVICES)
    with pytest.raises(ConfigError, match="--device"):
        device("h100")


def test_overrides_compose_like_training_without_the_optimizer():
    args = hydra_overrides(["model=vit_base", "model.grad_checkpointing=true", "optim.lr=1e-3", "data.batch_size=8"])
    assert args == ["model=vit_base", "++model.grad_checkpointing=true", "data.batch_size=8", "~optim", "~benchmark"]
    with pytest.raises(ConfigError, match="attention= one of"):
        hydra_overrides(["attention=nope"])


def test_all_prints_one_row_per_registered_backend(capsys, monkeypatch):
    seen = []

    def counted(name, attention, options, proxy=False):
        seen.append((attention["name"], proxy))
        return made_up()

    monkeypatch.setattr(plan_cli, "footprint", counted)
    assert main(["model=vit_cifar", "--all", "--device", "l4"]) == 0
    out = capsys.readouterr().out
    assert seen == [(name, True) for name in list_attention()]
    assert "ASSUMED utilisation of 40%" in out
    assert [line.split(" | ")[0].lstrip("| ") for line in out.splitlines()[3:]] == list_attention()


def test_all_as_csv_counts_each_backend_and_notes_one_that_cannot_run_on_meta(capsys):
    assert main(["model=vit_cifar", "model.depth=4", "--all", "--csv", "--attentions", "global,routing"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("attention,params_m,gmacs,")
    rows = {line.split(",")[0]: line.split(",") for line in lines[1:]}
    assert sorted(rows) == ["global", "routing"]
    assert rows["global"][6] == "True" and float(rows["global"][9]) > 0  # fits; images/s
    assert "stand-in depth 3 scaled to 4" in rows["global"][-1]
    assert rows["routing"][1] == "" and rows["routing"][-1]  # routing's forward reads values: a note, no numbers
    assert main(["model=vit_cifar", "--all", "--attentions", "globl"]) == 2
    assert "--attentions" in capsys.readouterr().err
