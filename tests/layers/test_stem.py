"""The convolutional stem and the fixed sin-cos position embeddings: shapes, the token grid they keep, FLOPs
equal to fvcore's, agreement with a plain reference, and one-line errors for options they cannot take."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import vitzoo
from vitzoo.flops import count_flops
from vitzoo.layers.stem import ConvStem, sincos_pos_embed
from vitzoo.registry import ConfigError


@pytest.mark.parametrize("full_res", [0, 2])
@pytest.mark.parametrize("patch,dim", [(2, 32), (4, 48), (8, 64), (16, 64)])
def test_conv_stem_keeps_the_patch_grid(patch, dim, full_res):
    stem = ConvStem(img_size=32, patch_size=patch, in_chans=3, embed_dim=dim, full_res=full_res)
    out = stem(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, (32 // patch) ** 2, dim)
    assert stem.grid_size == (32 // patch, 32 // patch)
    assert stem.widths[-1] == dim and len(stem.widths) == 1 + int(math.log2(patch)) + full_res
    assert stem.widths[1:1 + full_res] == [stem.widths[1 + full_res] // 2] * full_res  # half the first stride-2 width


@pytest.mark.parametrize("full_res", [0, 1])
def test_conv_stem_matches_a_plain_reference(full_res):
    """Convolutions written with unfold (no nn.Conv2d), BatchNorm in eval mode from its running statistics."""
    torch.manual_seed(0)
    stem = ConvStem(img_size=16, patch_size=4, in_chans=3, embed_dim=8, full_res=full_res).double().eval()
    for m in stem.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)

    def conv(x, weight, bias, stride, pad):
        b, _, h, w = x.shape
        k = weight.shape[-1]
        cols = torch.nn.functional.unfold(x, k, padding=pad, stride=stride)  # [B, c·k², L]
        out = weight.flatten(1) @ cols  # [B, C, L]
        if bias is not None:
            out = out + bias[:, None]
        return out.reshape(b, -1, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)

    y = x
    convs = [m for m in stem.convs if isinstance(m, nn.Conv2d)]
    norms = [m for m in stem.convs if isinstance(m, nn.BatchNorm2d)]
    for i, (c, n) in enumerate(zip(convs, norms)):
        y = conv(y, c.weight, None, 1 if i < full_res else 2, 1)  # the full-resolution convs first
        y = (y - n.running_mean[:, None, None]) / torch.sqrt(n.running_var[:, None, None] + n.eps)
        y = (y * n.weight[:, None, None] + n.bias[:, None, None]).clamp_min(0)
    y = conv(y, stem.proj.weight, stem.proj.bias, 1, 0)  # [B, C, 4, 4]
    expected = y.flatten(2).transpose(1, 2)
    torch.testing.assert_close(stem(x), expected)


@pytest.mark.parametrize("options", [dict(stem="conv"), dict(stem="conv", stem_full_res_convs=1),
                                     dict(pos_embed="sincos"),
                                     dict(stem="conv", pos_embed="sincos", global_pool="avg")])
@pytest.mark.parametrize("img_size", [32, 48])
def test_vit_with_stem_options_counts_flops_exactly(options, img_size):
    model = vitzoo.create_model("vit_cifar", **options, depth=1)
    report = count_flops(model, img_size=img_size)
    assert report.measured == report.analytic > 0
    if options.get("stem") == "conv":
        assert report.modules[1].name == "patch_embed"
        assert report.modules[1].measured == report.modules[1].analytic == model.patch_embed.flops((img_size // 4,) * 2)


def test_sincos_embedding_is_fixed_and_follows_the_grid():
    model = vitzoo.create_model("vit_cifar", pos_embed="sincos", depth=1)
    assert "pos_embed" not in model.state_dict()  # rebuilt from the grid, never trained or saved
    assert not any(n.startswith("pos_embed") for n, _ in model.named_parameters())
    assert torch.equal(model.pos_embed[0, 0], torch.zeros(192))  # the class token gets none
    grid = sincos_pos_embed((8, 8), 192, 1)[0, 1:]  # [64, C]: every position distinct, values in [-1, 1]
    assert torch.cdist(grid, grid).add(torch.eye(64)).min() > 0 and grid.abs().max() <= 1
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)  # a 12×12 grid gets its own table


@pytest.mark.parametrize("options,option", [
    (dict(stem="convs"), "model.stem"),
    (dict(pos_embed="rope"), "model.pos_embed"),
    (dict(stem="conv", patch_size=3, img_size=33), "model.stem=conv"),
    (dict(pos_embed="sincos", embed_dim=18, num_heads=3), "model.pos_embed=sincos"),
    (dict(stem_full_res_convs=1), "model.stem_full_res_convs"),
    (dict(stem="conv", stem_full_res_convs=-1), "model.stem_full_res_convs"),
    (dict(stem="conv", stem_full_res_convs=1, embed_dim=18, num_heads=3), "model.stem=conv"),
])
def test_bad_stem_options_name_the_option(options, option):
    with pytest.raises(ConfigError, match=option.replace(".", r"\.")) as err:
        vitzoo.create_model("vit_cifar", **options)
    assert "\n" not in str(err.value)
