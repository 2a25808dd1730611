"""Export keeps everything a model's output depends on.

Several backends draw random state at construction (random features, LSH rotations, routing centroids,
BigBird's random blocks, Synthesizer's random logits) from generators seeded by ``layer_index``. A plain
export round trip would pass even if that state were never saved, because reloading redraws it from
the same seeds. Here the reloaded model is built under a different global seed AND with every
``layer_index`` moved by 720720 (a multiple of 1…16, so choices made by ``layer_index % k`` stay the same
while every per-layer seed changes): only what the export saved can make the outputs match.

Buffers that are legitimately not saved (``persistent=False``) must be recomputable from the
configuration and grid alone: identical across constructions with different seeds and layer indices
(window masks and position indices, sparse patterns' gather indices).
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import ATTENTION_NAMES, attention_yaml

import vitzoo
import vitzoo.layers.block as block_module
from vitzoo.attention import ConfigError, MixerContext, build_attention
from vitzoo.export import export_model

SHIFT = 720720  # lcm(1..16)
TINY = {"vit_cifar": dict(depth=2, embed_dim=32, num_heads=2, drop_path_rate=0.0),
        "swin_cifar": dict(patch_size=4, depths=[2, 1], embed_dim=16, num_heads=[2, 2], drop_path_rate=0.0)}


def non_persistent_buffers(module):
    names = set()
    for prefix, m in module.named_modules():
        for b in m._non_persistent_buffers_set:
            if getattr(m, b, None) is not None:
                names.add(f"{prefix}.{b}" if prefix else b)
    return names


def build_elsewhere(name, layer_index, seed, grid=(8, 8), prefix=1, shifted=True):
    """The backend with its YAML options, built under global seed ``seed`` as layer ``layer_index``."""
    torch.manual_seed(seed)
    ctx = MixerContext(32, 4, tuple(grid), prefix, window=4, shifted=shifted, layer_index=layer_index)
    return build_attention(attention_yaml(name), ctx)


def tensors(module):
    """Every parameter and buffer, persistent or not, by name."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def differing(a, b):
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    return sorted(k for k in ta if ta[k].shape != tb[k].shape or not torch.equal(ta[k], tb[k]))


def per_layer_random_state(name):
    """Tensors of backend ``name`` that differ between two constructions with different ``layer_index``
    under the same global seed: its per-layer random state (empty for most backends)."""
    return differing(build_elsewhere(name, 0, seed=0), build_elsewhere(name, SHIFT, seed=0))


RANDOM_STATE = {n: per_layer_random_state(n) for n in ATTENTION_NAMES}


def test_some_backends_have_per_layer_random_state():
    """The export tests below are not vacuous: random features/rotations/centroids/blocks exist."""
    assert sum(bool(v) for v in RANDOM_STATE.values()) >= 3, RANDOM_STATE


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_state_dict_restores_every_tensor_the_backend_holds(name):
    """Build the backend under another seed and layer index, load the first one's state dict: every
    tensor it holds, saved or not, must then be equal, and so must the outputs. A non-persistent buffer
    passes only if it follows from the grid (window masks, position and gather indices: the same in both
    constructions) or is rebuilt from saved state when loading (BigBird's gather indices from its saved
    random blocks)."""
    a = build_elsewhere(name, 0, seed=0).eval()
    b = build_elsewhere(name, SHIFT + 3, seed=1).eval()
    unsaved = non_persistent_buffers(a)
    for k in differing(a, b):  # what a rebuild redraws ...
        assert k in a.state_dict() or k in unsaved, k
    b.load_state_dict(a.state_dict(), strict=True)
    assert differing(a, b) == [], f"{name}: not restored by load_state_dict"  # ... a load restores
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        torch.testing.assert_close(b(x, (8, 8)), a(x, (8, 8)), rtol=0, atol=0)


CASES = [(m, a) for m in TINY for a in ATTENTION_NAMES]


@pytest.mark.parametrize("model,name", CASES, ids=[f"{m}-{a}" for m, a in CASES])
def test_export_saves_everything_the_output_depends_on(model, name, tmp_path, monkeypatch):
    torch.manual_seed(0)
    net = vitzoo.create_model(model, attention=attention_yaml(name), num_classes=10, **TINY[model]).eval()
    with torch.no_grad():  # move every parameter and persistent buffer away from anything a rebuild could redraw
        for t in list(net.parameters()) + [b for n, b in net.named_buffers() if n not in non_persistent_buffers(net)]:
            if t.is_floating_point():
                t.add_(torch.randn_like(t) * 0.02)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = net(x)
    export_model(net, tmp_path / "export")

    real_build = block_module.build_attention

    def elsewhere(spec, ctx):  # another layer index: every per-layer seed differs, every `% k` choice does not
        return real_build(spec, dataclasses.replace(ctx, layer_index=ctx.layer_index + SHIFT))

    monkeypatch.setattr(block_module, "build_attention", elsewhere)
    torch.manual_seed(12345)
    reloaded = vitzoo.load_model(tmp_path / "export")
    with torch.no_grad():
        got = reloaded(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_longformer_export_without_global_projection_fails_in_one_line(tmp_path):
    """An export of ``longformer`` whose weights have no ``qkv_global`` (one projection for every row) and whose
    config does not name ``global_projections`` builds the default, ``separate``: loading fails in one line naming
    the missing tensors; with ``"global_projections": "shared"`` in its config it loads and gives its outputs."""
    torch.manual_seed(0)
    spec = {**attention_yaml("longformer"), "global_projections": "shared"}
    net = vitzoo.create_model("vit_cifar", attention=spec, num_classes=10, **TINY["vit_cifar"]).eval()
    export_model(net, tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    assert config["attention"].pop("global_projections") == "shared"
    config_file.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"^[^\n]*Missing key\(s\) in state_dict: [^\n]*qkv_global\.weight[^\n]*$"):
        vitzoo.load_model(tmp_path)
    config["attention"]["global_projections"] = "shared"
    config_file.write_text(json.dumps(config))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitzoo.load_model(tmp_path)(x), net(x), rtol=0, atol=0)
