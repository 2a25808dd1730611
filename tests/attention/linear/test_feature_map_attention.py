"""Backend-specific tests of the feature-map and Linformer backends: linformer, performer, linear, efficient, rfa."""
from __future__ import annotations

import pytest
import torch
from conftest import Host, attention_yaml, backends, make_attention

from vitzoo import create_model
from vitzoo.attention import ConfigError, MixerContext, attention_config, before_train_step, build_attention
from vitzoo.attention.functional import dense_attention
from vitzoo.attention.linear.performer import favor_features
from vitzoo.attention.linear.random_features import RandomFeatureAttention
from vitzoo.attention.linear.rfa import fourier_features
from vitzoo.flops import flop_analysis

KERNEL_BACKENDS = backends("linear") + ["linformer"]  # the linear family (registry) and the projected low-rank one
RANDOM_FEATURES = backends("linear", RandomFeatureAttention)  # performer, rfa, ...


@pytest.mark.parametrize("spec,option", [
    ({"name": "linformer", "k": 0}, "attention.k"),
    ({"name": "linformer", "k": -3}, "attention.k"),
    ({"name": "linformer", "sharing": "layerwise"}, "attention.sharing"),
    ({"name": "performer", "num_features": 0}, "attention.num_features"),
    ({"name": "performer", "redraw_interval": -1}, "attention.redraw_interval"),
    ({"name": "rfa", "num_features": -1}, "attention.num_features"),
    ({"name": "rfa", "scale": 0.0}, "attention.scale"),
])
def test_bad_options_are_one_line_errors(spec, option):
    with pytest.raises(ConfigError, match=option) as err:
        attention_config(spec)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- performer / rfa random features

@pytest.mark.parametrize("name", RANDOM_FEATURES)
def test_features_fixed_in_eval_and_redrawn_in_training(name):
    attn = make_attention(name, redraw_interval=3)
    x = torch.randn(2, 65, 32)
    first = attn.features.weight.clone()
    attn.eval()
    with torch.no_grad():
        for _ in range(5):
            attn(x, (8, 8))
    assert torch.equal(attn.features.weight, first), "eval must never redraw"
    attn.train()
    for _ in range(3):  # steps 0, 1, 2 use the first draw
        before_train_step(attn)
        attn(x, (8, 8))
    assert torch.equal(attn.features.weight, first)
    attn(x, (8, 8))  # forward alone never redraws
    assert torch.equal(attn.features.weight, first)
    before_train_step(attn)  # step 3: redrawn before use
    second = attn.features.weight.clone()
    assert not torch.equal(second, first)
    # draws depend only on (layer index, draw count): a fresh layer gives the same sequence
    assert torch.equal(second, make_attention(name, redraw_interval=3).features.draw(1).float())
    # a checkpoint resumes both the features and the step count
    other = make_attention(name, redraw_interval=3)
    other.load_state_dict(attn.state_dict())
    assert torch.equal(other.features.weight, second) and other.features._steps == 4


def test_redraw_interval_zero_never_redraws():
    attn = make_attention("performer", redraw_interval=0)
    first = attn.features.weight.clone()
    for _ in range(4):
        before_train_step(attn)
        attn(torch.randn(1, 65, 32), (8, 8))
    assert torch.equal(attn.features.weight, first)


def test_layers_draw_different_features():
    a = make_attention("performer")
    b = build_attention(attention_yaml("performer"), MixerContext(32, 4, (8, 8), 1, layer_index=1))
    assert not torch.equal(a.features.weight, b.features.weight)


def test_orthogonal_features_are_orthogonal_within_blocks():
    attn = make_attention("performer", num_features=20)  # head dim 8: blocks of 8, 8, 4 rows
    w = attn.features.weight.double()
    block = w[:8] / w[:8].norm(dim=1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(8, dtype=torch.float64), atol=1e-6, rtol=0)


def test_favor_estimates_softmax_attention():
    """With many features FAVOR+ approaches softmax(QKᵀ/√d)V (the estimator is unbiased)."""
    torch.manual_seed(0)
    attn = make_attention("performer", num_features=8192).double()
    q, k, v = (0.5 * torch.randn(1, 1, 40, 8, dtype=torch.float64) for _ in range(3))
    omega = attn.features.weight
    phi_q, phi_k = favor_features(q, omega, True), favor_features(k, omega, False)
    approx = (phi_q @ phi_k.transpose(-2, -1) @ v) / (phi_q @ phi_k.transpose(-2, -1)).sum(-1, keepdim=True)
    torch.testing.assert_close(approx, dense_attention(q, k, v), atol=0.02, rtol=0)


def test_rfa_features_estimate_gaussian_kernel():
    torch.manual_seed(0)
    attn = make_attention("rfa", num_features=8192, feature_map="trig").double()
    q, k = torch.randn(1, 4, 10, 8, dtype=torch.float64), torch.randn(1, 4, 10, 8, dtype=torch.float64)
    s, omega = attn.feature_scale(), attn.features.weight
    est = fourier_features(q, s, omega) @ fourier_features(k, s, omega).transpose(-2, -1)  # [1, h, 10, 10]
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    exact = torch.exp(-(qn[..., :, None, :] - kn[..., None, :, :]).square().sum(-1) / 2)
    torch.testing.assert_close(est.detach(), exact, atol=0.03, rtol=0)


def test_rfa_scale_learnable_or_fixed():
    learned = make_attention("rfa")
    assert learned.scale_param.requires_grad and "scale_param" in dict(learned.named_parameters())
    learned(torch.randn(2, 65, 32), (8, 8)).sum().backward()
    assert learned.scale_param.grad is not None
    fixed = make_attention("rfa", learn_scale=False, scale=2.0)
    assert "scale_param" not in dict(fixed.named_parameters()) and float(fixed.scale_param[0, 0, 0]) == 2.0


# ---------------------------------------------------------------- linformer

def test_linformer_other_grid_is_an_error_without_interpolate():
    attn = make_attention("linformer", (8, 8), 1)
    with pytest.raises(ConfigError, match="attention.interpolate"):
        attn(torch.randn(2, 1 + 12 * 12, 32), (12, 12))


@pytest.mark.parametrize("grid", [(12, 12), (4, 6)])
def test_linformer_interpolate_runs_at_another_grid(grid):
    torch.manual_seed(0)
    attn = make_attention("linformer", (8, 8), 1, interpolate=True).double().eval()
    n = 1 + grid[0] * grid[1]
    x = torch.randn(2, n, 32, dtype=torch.float64)
    with torch.no_grad():
        y = attn(x, grid)
        torch.testing.assert_close(y, attn.reference(x, grid), rtol=1e-6, atol=1e-8)
    assert y.shape == x.shape
    e, f = attn.projections(grid)
    assert e.shape[-2:] == (n, attn.k)
    torch.testing.assert_close(e[:, :1], attn.seq_proj[0, :, :1])  # class-token column kept
    with torch.no_grad():
        measured = flop_analysis(Host(attn.float(), grid), (x[:1].float(),)).by_module()["attn"]
    assert measured == attn.flops(grid)


@pytest.mark.parametrize(
    "sharing,shape", [("none", (2, 4, 65, 32)), ("headwise", (2, 1, 65, 32)), ("kv", (1, 1, 65, 32))]
)
def test_linformer_sharing(sharing, shape):
    torch.manual_seed(0)
    attn = make_attention("linformer", (8, 8), 1, sharing=sharing).double().eval()
    assert tuple(attn.seq_proj.shape) == shape
    x = torch.randn(2, 65, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (8, 8)), attn.reference(x, (8, 8)), rtol=1e-6, atol=1e-8)


def test_linformer_k_clamped_to_sequence_length():
    assert make_attention("linformer", (4, 4), 0, k=64).k == 16


# ---------------------------------------------------------------- inside the models


@pytest.mark.parametrize("model", ["vit_cifar", "swin_cifar"])
@pytest.mark.parametrize("name", KERNEL_BACKENDS)
def test_trains_inside_models(model, name):
    torch.manual_seed(0)
    net = create_model(model, attention={"name": name})
    x = torch.randn(2, 3, 32, 32)
    out = net(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------- fused forward against the per-head form

@pytest.mark.parametrize("name", ["performer", "rfa", "linear", "efficient"])
def test_fused_forward_matches_per_head_attend_and_its_gradients(name):
    """The fused forward (features recomputed in backward) gives the per-head path's values and gradients."""
    torch.manual_seed(0)
    attn = make_attention(name).double()
    x = torch.randn(2, 65, 32, dtype=torch.float64, requires_grad=True)
    y = attn(x, (8, 8))
    ref = attn.merge_heads(attn.attend(*attn.split_heads(x), (8, 8)))
    g = torch.randn_like(y)
    params = [x, *attn.parameters()]
    for a, b in zip(
        torch.autograd.grad(y, params, g, allow_unused=True), torch.autograd.grad(ref, params, g, allow_unused=True)
    ):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv"])
def test_linformer_fused_forward_matches_per_head_attend_and_its_gradients(sharing):
    """LinformerCore gives the per-head SDPA path's values and gradients (of x and of E, F)."""
    torch.manual_seed(0)
    attn = make_attention("linformer", sharing=sharing).double()
    x = torch.randn(2, 65, 32, dtype=torch.float64, requires_grad=True)
    y = attn(x, (8, 8))
    ref = attn.merge_heads(attn.attend(*attn.split_heads(x), (8, 8)))
    g = torch.randn_like(y)
    params = [x, *attn.parameters()]
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-12)
