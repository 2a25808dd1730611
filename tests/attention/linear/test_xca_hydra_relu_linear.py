"""XCA, Hydra and EfficientViT's ReLU linear attention: properties of each method beyond the generated tests."""
from __future__ import annotations

import pytest
import torch
from conftest import Host, make_attention

from vitzoo.attention import ConfigError, attention_config
from vitzoo.flops import flop_analysis


@pytest.mark.parametrize("name,opts", [("xca", {}), ("hydra", {}), ("relu_linear", {"scales": []})])
def test_global_mixers_are_permutation_equivariant(name, opts):
    """No position enters these mixers (relu_linear without its convolutional aggregation): permuting the tokens
    permutes the outputs."""
    torch.manual_seed(0)
    attn = make_attention(name, (4, 4), 1, **opts).double().eval()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    perm = torch.randperm(17)
    with torch.no_grad():
        torch.testing.assert_close(attn(x[:, perm], (4, 4)), attn(x, (4, 4))[:, perm])


def test_xca_temperature_sharpens_the_channel_attention():
    """τ → large makes each output channel of a head copy its best-matching value channel (a one-hot softmax)."""
    torch.manual_seed(0)
    attn = make_attention("xca", (4, 4), 0).double().eval()
    q, k, v = (torch.randn(1, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        attn.temperature.fill_(1e6)
        out = attn.attend(q, k, v, (4, 4))
    qn, kn = q / q.norm(dim=2, keepdim=True), k / k.norm(dim=2, keepdim=True)
    best = torch.einsum("bhnc,bhne->bhce", qn, kn).argmax(-1)  # [1, 4, 8]
    expected = torch.gather(v, 3, best[:, :, None].expand(-1, -1, 16, -1))
    torch.testing.assert_close(out, expected)


def test_hydra_ignores_the_head_count():
    """Hydra always has C heads: the same weights give the same output whatever model.num_heads says."""
    torch.manual_seed(0)
    a = make_attention("hydra", (4, 4), 1, heads=1)
    b = make_attention("hydra", (4, 4), 1, heads=8)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 17, 32)
    torch.testing.assert_close(a(x, (4, 4)), b(x, (4, 4)))


@pytest.mark.parametrize("scales", [[5], [3, 5]])
@pytest.mark.parametrize("grid,prefix", [((6, 6), 1), ((4, 6), 0)])
def test_relu_linear_multi_scale_matches_reference_and_flops(scales, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("relu_linear", grid, prefix, scales=scales).double().eval()
    assert attn.proj.in_features == (1 + len(scales)) * 32 and attn.num_heads == 32 // 8
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-6, atol=1e-8)
        measured = flop_analysis(Host(attn.float(), grid), (x[:1].float(),)).by_module()["attn"]  # one image
    assert measured == attn.flops(grid)


def test_relu_linear_is_a_normalised_kernel_average():
    """Every token's value the same vector c (and ReLU(q), ReLU(k) > 0): each output is exactly proj(c), since the
    kernel weights of a query sum to one."""
    torch.manual_seed(0)
    attn = make_attention("relu_linear", (4, 4), 1, scales=[], proj_norm="none").double().eval()
    c = torch.randn(32, dtype=torch.float64)
    with torch.no_grad():
        attn.qkv.weight.mul_(0.01)[64:].zero_()  # v = its bias c; q, k = 1 + small token-dependent parts
        attn.qkv.bias.copy_(torch.cat([torch.ones(64, dtype=torch.float64), c]))
        x = torch.randn(2, 17, 32, dtype=torch.float64)
        torch.testing.assert_close(attn(x, (4, 4)), attn.proj(c).expand(2, 17, 32))


@pytest.mark.parametrize("spec,match", [
    ({"name": "relu_linear", "scales": [4]}, "attention.scales must be a list of odd positive integers"),
    ({"name": "relu_linear", "scales": [0]}, "attention.scales must be a list of odd positive integers"),
    ({"name": "relu_linear", "head_dim": 0}, "attention.head_dim must be a positive integer"),
    ({"name": "relu_linear", "proj_norm": "layer"}, "attention.proj_norm must be one of batch, none"),
])
def test_bad_options_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        attention_config(spec)


def test_relu_linear_head_width_must_divide_the_channels():
    with pytest.raises(ConfigError, match=r"attention.head_dim=12 must divide model.embed_dim \(32\)"):
        make_attention("relu_linear", (4, 4), 1, head_dim=12)
    assert make_attention("relu_linear", (4, 4), 1, head_dim=None, heads=2).num_heads == 2  # the model's heads


def test_relu_linear_batch_norm_flops_are_the_eval_count():
    """FLOPs are measured in eval, where fvcore counts the BatchNorm as 2 per element (scale and shift); in
    training it counts 5 per element (batch statistics), 3NC more than flops()."""
    torch.manual_seed(0)
    attn = make_attention("relu_linear", (6, 6), 1)
    x = torch.randn(2, 37, 32)
    assert attn.symbols((6, 6))["β"] == 2
    for train, extra in ((False, 0), (True, 3 * 37 * 32)):
        measured = flop_analysis(Host(attn.train(train), (6, 6)), (x,)).by_module()["attn"] // 2  # two images
        assert measured == attn.flops((6, 6)) + extra
    plain = make_attention("relu_linear", (6, 6), 1, proj_norm="none")
    assert plain.symbols((6, 6))["β"] == 0 and plain.flops((6, 6)) == attn.flops((6, 6)) - 2 * 37 * 32
