"""Tests generated from the model registry: every variant builds, runs and reports honest FLOPs."""
from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.flops import count_flops
from vitzoo.flops.specs import default_attention
from vitzoo.registry import ConfigError

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
def test_every_variant_builds_with_analytic_flops(name):
    model = vitzoo.create_model(name, attention=default_attention(name))
    assert model.flops() > 0 and sum(p.numel() for p in model.parameters()) > 0


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
    from vitzoo.attention.window import window_mask

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
