"""Backend-specific tests: Nyström, compressed, Synthesizer and the attention-free mixers (FNet, gMLP, MLP-Mixer)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import Host, attention_yaml, backends, make_attention
from fvcore.nn.jit_analysis import _IGNORED_OPS as _FVCORE_IGNORED

import vitzoo
from vitzoo.attention import ConfigError, attention_config, dense_attention
from vitzoo.attention.low_rank.nystrom import iterative_pinv, segments
from vitzoo.costs import fft_flops
from vitzoo.flops import HANDLES, IGNORED_OPS, count_flops, flop_analysis

MINE = backends("token_mixing") + [n for n in backends("low_rank") if n != "linformer"]  # + nystrom, compressed
FIXED = [
    {"name": "mixer"},
    {"name": "gmlp"},
    {"name": "synthesizer", "mode": "dense"},
    {"name": "synthesizer", "mode": "random"},
    {"name": "synthesizer", "mode": "random", "rank": 3},
    {"name": "synthesizer", "mode": "random", "rank": 3, "trainable": False},
]


def build(spec: dict, grid, prefix: int):
    spec = dict(spec)
    return make_attention(spec.pop("name"), grid, prefix, **spec)


def measured_flops(attn, grid, prefix: int) -> int:
    x = torch.zeros(1, prefix + grid[0] * grid[1], attn.dim)
    with torch.no_grad():
        return flop_analysis(Host(attn, grid), (x,)).by_module()["attn"]


def check_against_reference(attn, grid, prefix: int, rtol=1e-6, atol=1e-8):
    attn = attn.double().eval()
    x = torch.randn(2, prefix + grid[0] * grid[1], attn.dim, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("spec,match", [
    ({"name": "nystrom", "landmarks": 0}, r"attention\.landmarks must be a positive integer"),
    ({"name": "nystrom", "iterations": -1}, r"attention\.iterations must be a positive integer"),
    ({"name": "nystrom", "landmarks": 2.5}, r"attention\.landmarks must be a positive integer"),
    ({"name": "compressed", "reduction": 0}, r"attention\.reduction must be a positive integer"),
    ({"name": "synthesizer", "mode": "random", "rank": 0}, r"attention\.rank must be a positive integer"),
    ({"name": "synthesizer", "rank": 4}, r"attention\.rank=4 only applies to attention\.mode=random"),
    ({"name": "synthesizer", "mode": "factorized"}, r"attention\.mode must be 'dense' or 'random'"),
    ({"name": "fnet", "norm": "forward"}, r"attention\.norm must be 'ortho' or 'backward'"),
    ({"name": "mixer", "hidden_ratio": 0}, r"attention\.hidden_ratio must be a positive number"),
    ({"name": "gmlp", "ffn_ratio": -1.0}, r"attention\.ffn_ratio must be a positive number"),
])
def test_bad_options_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match) as info:
        attention_config(spec)
    assert "\n" not in str(info.value)


def test_reduction_that_does_not_divide_without_padding_is_an_error():
    with pytest.raises(ConfigError, match=r"attention\.reduction=4 does not divide the 6x10 token grid"):
        make_attention("compressed", (6, 10), 0, reduction=4, pad=False)
    attn = make_attention("compressed", (8, 8), 0, reduction=4, pad=False)  # divides the build grid ...
    with pytest.raises(ConfigError, match=r"attention\.reduction=4 does not divide the 6x10"):
        attn(torch.randn(1, 60, 32), (6, 10))  # ... but not this one


@pytest.mark.parametrize("spec", FIXED, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_fixed_length_at_another_grid_needs_interpolate(spec):
    attn = build(spec, (8, 8), 1)
    assert attn.fixed_length
    with pytest.raises(ConfigError, match=r"built for a 8x8 token grid, got 6x10; set attention\.interpolate=true"):
        attn(torch.randn(1, 61, 32), (6, 10))


# ---------------------------------------------------------------------------------- fixed length: interpolate

@pytest.mark.parametrize("grid", [(6, 10), (12, 12)])
@pytest.mark.parametrize("spec", FIXED, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_interpolate_runs_at_another_grid(spec, grid):
    torch.manual_seed(0)
    attn = build({**spec, "interpolate": True}, (8, 8), 1)
    x = torch.randn(2, 1 + grid[0] * grid[1], 32, requires_grad=True)
    y = attn(x, grid)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().sum().backward()
    for n, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"no gradient reaches {n}"
    assert measured_flops(attn, grid, 1) == attn.flops(grid)  # resampling cost included
    check_against_reference(attn, grid, 1)


def test_interpolate_keeps_the_construction_grid_unchanged():
    torch.manual_seed(0)
    plain = make_attention("mixer", (8, 8), 1).eval()
    interp = make_attention("mixer", (8, 8), 1, interpolate=True).eval()
    interp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        torch.testing.assert_close(plain(x, (8, 8)), interp(x, (8, 8)), rtol=0, atol=0)


def test_interpolated_mixing_weights_preserve_a_constant_input():
    """The input token axis is rescaled by the grid-area ratio: a constant image gives the same hidden units at 2x."""
    torch.manual_seed(0)
    attn = make_attention("mixer", (4, 4), 0, interpolate=True).double()
    w_small = attn.weights((4, 4))[0]
    w_big = attn.weights((8, 8))[0]
    torch.testing.assert_close(w_small.sum(1), w_big.sum(1), rtol=1e-9, atol=1e-12)


def test_fixed_length_model_at_another_image_size():
    spec = {**attention_yaml("gmlp"), "interpolate": True}
    model = vitzoo.create_model("vit_cifar", attention=spec)
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)
    with pytest.raises(ConfigError, match=r"attention\.interpolate"):
        vitzoo.create_model("vit_cifar", attention="gmlp")(torch.randn(1, 3, 48, 48))


# ------------------------------------------------------------------------------------------------- Nyström

def test_nystrom_segments_never_leave_an_empty_landmark():
    for landmarks in (1, 7, 8, 33, 64):
        for n in range(1, 300):
            s, m, pad = segments(n, landmarks)
            assert m <= landmarks and m * s == n + pad and 0 <= pad < s, (n, landmarks)  # only the last is partial
            if n <= landmarks:
                assert (s, m, pad) == (1, n, 0)  # every token is its own landmark


def test_nystrom_landmarks_are_means_of_real_tokens_only():
    attn = make_attention("nystrom", (6, 10), 1, landmarks=8)  # N = 61: 8 segments of 8, last has 5 real tokens
    t = torch.randn(2, 4, 61, 8, dtype=torch.float64)
    lm = attn.landmarks(t)
    assert lm.shape == (2, 4, 8, 8)
    torch.testing.assert_close(lm[:, :, 0], t[:, :, 0:8].mean(2))
    torch.testing.assert_close(lm[:, :, -1], t[:, :, 56:61].mean(2))


@pytest.mark.parametrize("landmarks,grid,prefix", [(8, (6, 10), 1), (7, (8, 8), 1), (5, (4, 4), 0), (16, (16, 16), 0)])
def test_nystrom_matches_reference_with_padding(landmarks, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("nystrom", grid, prefix, landmarks=landmarks)
    assert measured_flops(attn, grid, prefix) == attn.flops(grid)
    check_against_reference(attn, grid, prefix)


def test_nystrom_with_every_token_a_landmark_is_softmax_attention():
    torch.manual_seed(0)
    attn = make_attention("nystrom", (4, 4), 1, landmarks=64, iterations=30).double().eval()
    q, k, v = (torch.randn(2, 4, 17, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attn.attend(q, k, v, (4, 4)), dense_attention(q, k, v), rtol=1e-6, atol=1e-8)


def test_nystrom_pinv_iteration_converges_to_the_pseudo_inverse():
    torch.manual_seed(0)
    a = torch.randn(3, 12, 12, dtype=torch.float64).softmax(-1)
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), rtol=1e-6, atol=1e-6)


def test_nystrom_output_does_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(0)
    attn = make_attention("nystrom", (8, 8), 1, landmarks=8).double().eval()
    x = torch.randn(3, 65, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (8, 8))[:1], attn(x[:1] * 1.0, (8, 8)))
        x2 = torch.cat([x[:1], 100 * x[1:]])
        torch.testing.assert_close(attn(x2, (8, 8))[:1], attn(x[:1], (8, 8)))


# ---------------------------------------------------------------------------------------------- compressed

@pytest.mark.parametrize("reduction", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("grid,prefix", [((6, 10), 1), ((8, 8), 0)])
def test_compressed_reductions_match_reference_and_flops(reduction, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("compressed", grid, prefix, reduction=reduction)
    assert measured_flops(attn, grid, prefix) == attn.flops(grid)
    check_against_reference(attn, grid, prefix)


def test_compressed_keeps_prefix_tokens_uncompressed():
    attn = make_attention("compressed", (6, 10), 1, reduction=4)
    x = torch.randn(2, 61, 32)
    keys = attn.compress(x, (6, 10))
    assert keys.shape == (2, 1 + 2 * 3, 32)  # class token + ⌈6/4⌉·⌈10/4⌉ reduced tokens
    torch.testing.assert_close(keys[:, :1], x[:, :1], rtol=0, atol=0)


def test_compressed_without_reduction_is_softmax_attention():
    torch.manual_seed(0)
    attn = make_attention("compressed", (4, 4), 1, reduction=1).double().eval()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    (q,) = attn.to_heads(attn.q(x))
    k, v = (attn.to_heads(t)[0] for t in attn.kv(x).chunk(2, dim=-1))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (4, 4)), attn.merge_heads(dense_attention(q, k, v)))


# --------------------------------------------------------------------------------------------- Synthesizer

def test_random_synthesizer_weights_do_not_depend_on_the_input():
    attn = make_attention("synthesizer", (4, 4), 1, mode="random", rank=2)
    a, b = torch.randn(2, 17, 32), torch.randn(3, 17, 32)
    torch.testing.assert_close(attn.logits(a, (4, 4)), attn.logits(b, (4, 4)), rtol=0, atol=0)
    assert [tuple(p.shape) for p in attn.random_logits] == [(4, 17, 2), (4, 17, 2)]


def test_dense_synthesizer_row_depends_only_on_its_token():
    attn = make_attention("synthesizer", (4, 4), 0, mode="dense").double()
    x = torch.randn(1, 16, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 5:] += 1.0
    torch.testing.assert_close(attn.logits(x, (4, 4))[:, :, :5], attn.logits(y, (4, 4))[:, :, :5])


def test_fixed_random_synthesizer_is_seeded_by_layer_index_and_saved():
    from vitzoo.attention import MixerContext, build_attention

    spec = {"name": "synthesizer", "mode": "random", "trainable": False}
    a, b, c = (build_attention(spec, MixerContext(32, 4, (4, 4), 0, layer_index=i)) for i in (3, 3, 4))
    assert torch.equal(a.random_logits_0, b.random_logits_0) and not torch.equal(a.random_logits_0, c.random_logits_0)
    assert "random_logits_0" in a.state_dict()
    assert {n for n, _ in a.named_parameters()} == {"v.weight", "v.bias", "proj.weight", "proj.bias"}


@pytest.mark.parametrize("spec", FIXED[2:], ids=lambda s: "-".join(str(v) for v in s.values()))
@pytest.mark.parametrize("grid,prefix", [((8, 8), 1), ((6, 10), 0)])
def test_synthesizer_modes_match_reference_and_flops(spec, grid, prefix):
    torch.manual_seed(0)
    attn = build(spec, grid, prefix)
    assert measured_flops(attn, grid, prefix) == attn.flops(grid)
    check_against_reference(attn, grid, prefix)


# -------------------------------------------------------------------------------------------------- FNet

@pytest.mark.parametrize("norm", ["ortho", "backward"])
def test_fnet_is_the_real_part_of_numpys_2d_fft(norm):
    attn = make_attention("fnet", (6, 10), 1, norm=norm)
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    expected = np.fft.fft2(x.numpy(), axes=(-2, -1), norm=norm).real
    np.testing.assert_allclose(attn(x, (6, 10)).numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(attn.reference(x, (6, 10)).numpy(), expected, rtol=1e-10, atol=1e-10)


def test_fft_flop_convention():
    # complex: 5/2·M·log₂M; real (half spectrum): 5/4·M·log₂M, rounded once per transform
    assert fft_flops(1) == 0 and fft_flops(8) == 60 and fft_flops(1024) == 25600
    assert fft_flops(1, real=True) == 0 and fft_flops(8, real=True) == 30 and fft_flops(1024, real=True) == 12800
    assert fft_flops(6 * 10) == round(2.5 * 60 * math.log2(60)) and fft_flops(60, real=True) == 443  # 443.02


@pytest.mark.parametrize("fn,shape,expected", [
    (lambda t: torch.fft.fft2(t).real, (3, 5, 4), 3 * fft_flops(20, real=True)),
    (lambda t: torch.fft.fftn(t, dim=(0, 2)).real, (3, 5, 4), 5 * fft_flops(12, real=True)),
    (lambda t: torch.fft.fftn(t).real, (3, 5, 4), fft_flops(60, real=True)),
    (lambda t: torch.fft.fft(t, dim=1).real, (3, 5, 4), 12 * fft_flops(5, real=True)),
    (lambda t: torch.fft.fft2(t, s=(8, 8)).real, (3, 5, 4), 3 * fft_flops(64, real=True)),
    (lambda t: torch.fft.fft2(torch.complex(t, t)).real, (3, 5, 4), 3 * fft_flops(20)),
    (lambda t: torch.fft.ifftn(torch.complex(t, t), dim=(0, 2)).real, (3, 5, 4), 5 * fft_flops(12)),
])
def test_fft_handles_count_every_fft_op(fn, shape, expected):
    class Wrap(torch.nn.Module):
        def forward(self, t):
            return fn(t)

    analysis = flop_analysis(Wrap(), (torch.zeros(shape),))
    assert analysis.total() == expected and not analysis.unsupported_ops()


def test_fnet_traced_ops_all_have_handles():
    attn = make_attention("fnet", (4, 4), 1).eval()
    graph = torch.jit.trace(Host(attn, (4, 4)), (torch.zeros(1, 17, 32),)).inlined_graph
    ops = {n.kind() for n in graph.nodes() if n.kind().startswith("aten::")}
    assert {"aten::fft_fft2", "aten::real"} <= ops
    assert ops - _FVCORE_IGNORED - set(IGNORED_OPS) <= set(HANDLES)


def test_fnet_runs_in_bfloat16():
    attn = make_attention("fnet", (4, 4), 1)
    x = torch.randn(2, 17, 32)
    y = attn(x.bfloat16(), (4, 4))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), attn(x, (4, 4)), rtol=0.05, atol=0.05)


# -------------------------------------------------------------------------------------------- gMLP, Mixer

def test_gmlp_starts_close_to_identity_gating():
    attn = make_attention("gmlp", (4, 4), 1)
    w, b = attn.gate_params((4, 4))
    assert w.abs().max() <= attn.cfg.init_eps / 17 and torch.all(b == 1)


def test_mixer_class_token_is_a_mixed_token_position():
    torch.manual_seed(0)
    attn = make_attention("mixer", (4, 4), 1).double()
    x = torch.randn(1, 17, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 0] += 1.0  # perturb the class token only
    assert (attn(x, (4, 4))[:, 1:] - attn(y, (4, 4))[:, 1:]).abs().max() > 0


# ------------------------------------------------------------------------------------------------- models

@pytest.mark.parametrize("model", ["vit_cifar", "swin_cifar"])
@pytest.mark.parametrize("name", MINE)
def test_models_train_step_and_flops(name, model):
    torch.manual_seed(0)
    net = vitzoo.create_model(model, attention=attention_yaml(name))
    loss = torch.nn.functional.cross_entropy(net(torch.randn(2, 3, 32, 32)), torch.tensor([1, 2]))
    loss.backward()
    for n, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"no gradient reaches {n}"
    report = count_flops(net)
    assert report.measured == report.analytic and not report.unsupported
