"""timm checkpoints load into vitzoo: same logits as timm (float64), attention surgery, resampling, errors.

Randomly initialised timm models stand in for the published weights (offline): DeiT-T and Swin-T at
full size for logit parity; small timm configs for resampling, file formats and layer-wise lr decay.
"""
from __future__ import annotations

import huggingface_hub.constants
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models import swin_transformer as timm_swin
from timm.models import vision_transformer as timm_vit
from timm.optim import param_groups_layer_decay

import vitzoo
from vitzoo.registry import ConfigError

SMALL_VIT = dict(patch_size=4, embed_dim=48, depth=2, num_heads=3, mlp_ratio=4.0, num_classes=10)
SMALL_SWIN = dict(patch_size=2, embed_dim=32, depths=(2, 2), num_heads=(2, 4), mlp_ratio=4.0, num_classes=10)


def save_timm(net: torch.nn.Module, path):
    """A timm model's weights in timm's naming, as ``.safetensors`` or (``.pth``/``.bin``) ``torch.save``."""
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(path)) if path.suffix == ".safetensors" else torch.save(state, path)
    return str(path)


def max_diff(ref: torch.nn.Module, model: torch.nn.Module, img_size: int, batch: int = 2) -> float:
    """Max |logits difference| of two eval-mode models in float64 on the same random images."""
    x = torch.randn(batch, 3, img_size, img_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return (ref.double().eval()(x) - model.double().eval()(x)).abs().max().item()


@pytest.fixture(scope="module")
def deit_file(tmp_path_factory):
    torch.manual_seed(0)
    net = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    return net, save_timm(net, tmp_path_factory.mktemp("deit") / "deit_tiny.safetensors")


@pytest.fixture(scope="module")
def swin_file(tmp_path_factory):
    torch.manual_seed(0)
    net = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    return net, save_timm(net, tmp_path_factory.mktemp("swin") / "swin_tiny.safetensors")


@pytest.mark.slow  # full-size DeiT-T in float64: ~5 s on 2 idle cores
def test_deit_tiny_logits_equal_timm(deit_file):
    net, path = deit_file
    model = vitzoo.create_model("vit_tiny", attention="global", pretrained=path)
    assert model.cfg.norm_eps == 1e-6  # the source's epsilon, not vitzoo's default 1e-5
    assert model.pretrained_report.new == [] and model.pretrained_report.ignored == []
    assert max_diff(net, model, 224, batch=1) <= 1e-10


@pytest.mark.slow  # full-size Swin-T in float64: ~10 s on 2 idle cores
def test_swin_tiny_logits_equal_timm(swin_file):
    net, path = swin_file
    model = vitzoo.create_model("swin_tiny", attention="window", pretrained=path)
    report = model.pretrained_report
    assert report.new == [] and report.ignored == []
    assert "stages.0.downsample.reduction.weight" in report.loaded  # timm's layers.1.downsample
    assert max_diff(net, model, 224, batch=1) <= 1e-10


@pytest.mark.parametrize("attention", ["performer", "linformer"])
def test_other_backends_load_the_shared_projections(deit_file, attention):
    net, path = deit_file
    model = vitzoo.create_model("vit_tiny", attention=attention, pretrained=path)
    report, source = model.pretrained_report, net.state_dict()
    for i in range(12):
        for name in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias"):
            key = f"blocks.{i}.attn.{name}"
            assert key in report.loaded
            assert torch.equal(model.state_dict()[key], source[key])
    own = [k for k in model.state_dict() if ".attn." in k and not k.split(".attn.")[1].startswith(("qkv.", "proj."))]
    assert own and set(own) == set(report.new)  # the backend's own tensors: initialised, listed as new
    assert all(".attn." in k for k in report.new) and report.ignored == []


def test_swin_with_performer_ignores_the_bias_tables(swin_file):
    _, path = swin_file
    report = vitzoo.create_model("swin_tiny", attention="performer", pretrained=path).pretrained_report
    assert "stages.2.blocks.5.attn.qkv.weight" in report.loaded
    assert {k.rsplit(".", 1)[1] for k in report.ignored} == {"relative_position_bias_table"}


def test_timm_source_offline_is_one_line_error(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail at once instead of retrying
    with pytest.raises(ConfigError, match=r"model\.pretrained=timm:deit_tiny_patch16_224: .*cache") as e:
        vitzoo.create_model("vit_tiny", pretrained="timm:deit_tiny_patch16_224")
    assert "\n" not in str(e.value)


def test_vit_resampled_to_another_size_and_patch_matches_timm(tmp_path):
    """48 px with patch 4 (12x12 tokens) from a 32 px (8x8) file, and patch 8 from patch 4:
    timm's filter does the same."""
    torch.manual_seed(0)
    path = save_timm(timm_vit.VisionTransformer(img_size=32, **SMALL_VIT), tmp_path / "vit.pth")
    state = torch.load(path, weights_only=True)
    for size, patch in [(48, 4), (64, 8)]:
        ref = timm_vit.VisionTransformer(img_size=size, **{**SMALL_VIT, "patch_size": patch})
        ref.load_state_dict(timm_vit.checkpoint_filter_fn(state, ref))
        model = vitzoo.create_model("vit_cifar", pretrained=path, img_size=size, **{**SMALL_VIT, "patch_size": patch})
        assert model.pretrained_report.resampled == (["pos_embed"] if patch == 4 else ["patch_embed.proj.weight"])
        assert max_diff(ref, model, size) <= 1e-10


def test_swin_window_resampled_matches_timm(tmp_path):
    torch.manual_seed(0)
    path = save_timm(timm_swin.SwinTransformer(img_size=32, window_size=4, **SMALL_SWIN), tmp_path / "swin.bin")
    ref = timm_swin.SwinTransformer(img_size=32, window_size=8, **SMALL_SWIN)
    ref.load_state_dict(timm_swin.checkpoint_filter_fn(torch.load(path, weights_only=True), ref))
    model = vitzoo.create_model(
        "swin_cifar",
        attention="window",
        pretrained=path,
        img_size=32,
        window_size=8,
        **{**SMALL_SWIN, "depths": [2, 2], "num_heads": [2, 4]},
    )
    assert len(model.pretrained_report.resampled) == 4  # one bias table per block
    assert max_diff(ref, model, 32) <= 1e-10


def test_new_num_classes_gives_a_new_head(deit_file):
    report = vitzoo.create_model("vit_tiny", pretrained=deit_file[1], num_classes=10).pretrained_report
    assert set(report.ignored) == {"head.weight", "head.bias"} and set(report.new) == {"head.weight", "head.bias"}


@pytest.mark.parametrize(
    "name, overrides, option",
    [
        ("vit_small", {}, "model.embed_dim"),  # DeiT-T weights into DeiT-S: shapes cannot match
        ("vit_tiny", {"depth": 6}, "model.depth"),
        ("swin_tiny", {}, "choose a vit_"),  # a ViT checkpoint into a Swin
    ],
)
def test_mismatch_is_one_line_error(deit_file, name, overrides, option):
    with pytest.raises(ConfigError, match=option) as e:
        vitzoo.create_model(name, pretrained=deit_file[1], **overrides)
    assert "\n" not in str(e.value)


def test_missing_file_names_the_option(tmp_path):
    with pytest.raises(ConfigError, match="model.pretrained="):
        vitzoo.create_model("vit_tiny", pretrained=str(tmp_path / "nope.safetensors"))


def test_layer_decay_groups_follow_depth():
    """timm's layer-wise lr decay over vitzoo's group_matcher: the stem decays most, the head not at all."""
    for model in (
        vitzoo.create_model("vit_cifar", depth=2),
        vitzoo.create_model("swin_cifar", depths=[2, 2], num_heads=[2, 4]),
    ):
        groups = param_groups_layer_decay(model, layer_decay=0.5)
        scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
        named = dict(model.named_parameters())
        assert scale[id(named["head.weight"])] == 1.0
        blocks = [scale[id(p)] for n, p in named.items() if n.endswith("mlp.fc1.weight")]
        assert scale[id(named["patch_embed.proj.weight"])] == min(scale.values()) < blocks[0]
        assert blocks == sorted(blocks) and len(set(blocks)) == len(blocks)  # deeper blocks: larger lr
        if "stages.0.downsample.reduction.weight" in named:  # timm's layers.1.downsample: with stage 1's first block
            assert scale[id(named["stages.0.downsample.reduction.weight"])] == blocks[2]
