"""Tests generated from the model registry: every variant builds, runs and reports honest FLOPs."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

import vitzoo
from vitzoo.export import export_model, load_model
from vitzoo.flops import count_flops
from vitzoo.layers.block import Block
from vitzoo.models import MODELS, attention_spec, natural_attention
from vitzoo.registry import ConfigError, Registry

SMALL = ["vit_cifar", "swin_cifar"]


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("attention", ["global", "window"])
def test_small_models_forward_backward(name, attention):
    model = vitzoo.create_model(name, attention=attention, num_classes=7)
    x = torch.randn(2, 3, 32, 32)
    y = model(x)
    assert y.shape == (2, 7)
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", vitzoo.list_models())
def test_every_variant_builds_with_its_natural_attention(name):
    """No attention given: Swin variants are real Swin (windows with relative position bias), ViTs global."""
    model = vitzoo.create_model(name)
    expected = {"swin": "window", "vit": "global"}[MODELS.get(name)[0].family]
    assert natural_attention(name) == expected and attention_spec(model)["name"] == expected
    has_bias = any(n.endswith("relative_position_bias_table") for n, _ in model.named_parameters())
    assert has_bias == (expected == "window")
    assert model.flops() > 0 and sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("name", SMALL)
def test_explicit_attention_overrides_the_natural_one(name):
    assert attention_spec(vitzoo.create_model(name, attention="performer"))["name"] == "performer"


def test_attention_is_validated_once_and_shared_by_every_block():
    model = vitzoo.create_model("vit_cifar", attention={"name": "linformer", "k": 16})
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    assert len(blocks) == 6 and all(b.attn.cfg is model.attention_cfg for b in blocks)


@pytest.mark.parametrize("name", ["vit_cifar", "swin_cifar"])
def test_attention_spec_on_the_model_is_what_export_writes(name, tmp_path):
    model = vitzoo.create_model(name)
    spec = attention_spec(model)
    written = json.loads((export_model(model, tmp_path) / "config.json").read_text())["attention"]
    assert written == json.loads(json.dumps(spec))
    assert attention_spec(load_model(tmp_path)) == spec


@dataclass
class _Config:
    width: int = 8  # a field


def test_variant_registry_is_strict():
    models = Registry("model")
    models.register_variant("small", object, _Config, {"width": 4})
    assert models.config("small") == _Config(width=4) and models.config({"name": "small", "width": 2}) == _Config(2)
    with pytest.raises(KeyError, match="registered twice"):
        models.register_variant("small", object, _Config, {})
    with pytest.raises(ConfigError, match=r"unknown option model\[wide\]\.depth"):
        models.register_variant("wide", object, _Config, {"depth": 2})
    with pytest.raises(ConfigError, match=r"^unknown option model\.colour for _Config; valid options: width$"):
        models.config({"name": "small", "colour": 2})
    with pytest.raises(ConfigError, match=r"^unknown option model\.widht for _Config; did you mean model\.width\? "):
        models.config({"name": "small", "widht": 2})
    with pytest.raises(ConfigError, match=r"^unknown model 'big'; choose model= one of: small$"):
        models.config("big")


@pytest.mark.parametrize("name", SMALL)
def test_window_padding_and_clamping_in_models(name):
    """40 px: the grids (10x10 / 20x20 -> 10 -> 5) are not divisible by window 4 and get padded."""
    model = vitzoo.create_model(name, attention="window", img_size=40).eval()
    assert model(torch.randn(1, 3, 40, 40)).shape == (1, 10)
    report = count_flops(model)
    assert report.measured == report.analytic
    assert all(a == m for _, a, m in report.attention.values())


def test_window_without_padding_is_an_error():
    with pytest.raises(ConfigError, match="attention.pad=true"):
        vitzoo.create_model("vit_cifar", attention={"name": "window", "window_size": 3, "pad": False})


def test_shifted_window_mask_blocks_cross_region_pairs():
    """Shifted windows never let a token attend across the wrap-around seam of the roll."""
    from vitzoo.attention.dense.window import window_mask

    mask = window_mask((8, 8), 4, 2, 0)  # [nW, 16, 16]
    assert mask.shape == (4, 16, 16)
    assert torch.isinf(mask[-1]).any() and not torch.isinf(mask[0]).any()


@pytest.mark.parametrize("overrides,option", [
    (dict(img_size=30), "model.img_size"),
    (dict(embed_dim=100), "model.embed_dim"),
    (dict(bogus=1), "model.bogus"),
])
def test_bad_model_options_name_the_option(overrides, option):
    with pytest.raises(ConfigError, match=option.replace(".", r"\.")):
        vitzoo.create_model("vit_cifar", **overrides)


def test_unknown_model_lists_choices():
    with pytest.raises(ConfigError, match="unknown model 'vit_huge'.*vit_cifar"):
        vitzoo.create_model("vit_huge")


def test_resolution_change_resamples_position_embedding():
    model = vitzoo.create_model("vit_cifar", attention="global").eval()
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)


@pytest.mark.parametrize("name", vitzoo.list_models())
def test_every_mixer_is_called_as_attn_x_grid(name, monkeypatch):
    """The host calls every token mixer with exactly ``(x[B, N, C], grid)``: no keyword, no other signature."""
    from vitzoo.attention import TokenMixer

    small = dict(img_size=32, patch_size=4, num_classes=10)
    model = vitzoo.create_model(name, attention="window", **small).eval()
    calls = []
    for mixer in (m for m in model.modules() if isinstance(m, TokenMixer)):
        mixer.register_forward_pre_hook(lambda m, args, kwargs: calls.append((m, args, kwargs)), with_kwargs=True)
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert calls and len(calls) == sum(isinstance(m, TokenMixer) for m in model.modules())
    for mixer, args, kwargs in calls:
        assert not kwargs and len(args) == 2
        x, grid = args
        assert x.shape == (2, mixer.seq_len(grid), mixer.dim) and isinstance(grid, tuple) and len(grid) == 2


def test_export_of_a_windowed_model_leaves_eager_models_working():
    """``torch.export`` of one windowed model, then eager forwards of others (masks are per-model buffers)."""
    exported_from = vitzoo.create_model("swin_cifar", attention="window").eval()
    x = torch.randn(2, 3, 32, 32)
    program = torch.export.export(exported_from, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), exported_from(x))
        for name in ("vit_cifar", "swin_cifar"):
            other = vitzoo.create_model(name, attention="window").eval()
            assert torch.isfinite(other(x)).all()
            assert torch.isfinite(other(torch.randn(1, 3, 40, 40))).all()  # another grid: mask built on the fly


def test_window_masks_follow_the_module():
    """The shift/padding mask is a non-persistent buffer: it moves with ``.to()`` and is not saved."""
    model = vitzoo.create_model("swin_cifar", attention="window").double()
    masks = [m.attn_mask for m in model.modules() if getattr(m, "attn_mask", None) is not None]
    assert masks and all(m.dtype == torch.float64 for m in masks)
    assert not any(k.endswith("attn_mask") for k in model.state_dict())
