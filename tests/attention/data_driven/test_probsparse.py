"""Informer's ProbSparse attention: the selected queries attend exactly, the others take mean(V)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import attention_yaml, make_attention

from vitzoo.attention import ConfigError, MixerContext, attention_config, build_attention, dense_attention
from vitzoo.attention.data_driven.probsparse import HASH_B, sample_count


def test_sample_count_is_c_ceil_ln_n_capped_at_n():
    assert sample_count(5, 65) == 25 and sample_count(5, 4096) == 45 and sample_count(5, 10) == 10
    assert sample_count(1, 1000) == math.ceil(math.log(1000))


def test_every_query_selected_is_softmax_attention():
    """When u = N (short sequences), every query attends to every key: exact softmax attention."""
    torch.manual_seed(0)
    attn = make_attention("probsparse", (2, 2), 1).double().eval()
    q, k, v = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    assert sample_count(attn.cfg.factor, 5) == 5
    torch.testing.assert_close(attn.attend(q, k, v, (2, 2)), dense_attention(q, k, v))


def test_unselected_queries_output_the_mean_of_v_and_selected_ones_attend():
    torch.manual_seed(0)
    attn = make_attention("probsparse", (8, 8), 1, factor=1).double().eval()
    q, k, v = (torch.randn(1, 4, 65, 8, dtype=torch.float64) for _ in range(3))
    out = attn.attend(q, k, v, (8, 8))
    is_mean = torch.isclose(out, v.mean(dim=2, keepdim=True).expand_as(out)).all(-1)  # [1, 4, 65]
    exact = torch.isclose(out, dense_attention(q, k, v)).all(-1)
    u = sample_count(1, 65)
    assert (is_mean.sum(-1) == 65 - u).all() and (exact.sum(-1) == u).all()
    assert not (is_mean & exact).any()


def test_sampled_keys_depend_on_the_layer_and_are_saved():
    spec = attention_yaml("probsparse")
    a, b = (build_attention(spec, MixerContext(32, 4, (8, 8), 1, layer_index=i)) for i in (0, 3))
    assert "sample_layer" in a.state_dict()
    assert not torch.equal(a.samples(65, torch.device("cpu")), b.samples(65, torch.device("cpu")))


@pytest.mark.parametrize("n,layer", [(2, 0), (49, 11), (65, 0), (197, 5), (1024, 3)])
def test_band_measurement_equals_the_gathered_samples(n, layer):
    """The band path (keys reordered so each query's samples are consecutive) meets exactly the keys of
    ``samples``: the same measurement as gathering them (float64, up to summation order)."""
    assert math.gcd(HASH_B, n) == 1
    attn = build_attention(attention_yaml("probsparse"), MixerContext(32, 4, (1, n), 0, layer_index=layer)).double()
    q, k = (torch.randn(2, 4, n, 8, dtype=torch.float64) for _ in range(2))
    attn.BAND_CHUNK = 8 * 4 * 7  # chunks of 7 bands: n = 49, 65, 197, 1024 end in a shorter one
    band = attn.measure_band(q, k)
    samples = attn.samples(n, q.device)  # [n, U]
    qk = (q.unsqueeze(-2) * k[:, :, samples]).sum(-1)  # [2, 4, n, U]: written out
    torch.testing.assert_close(band, qk.amax(-1) - qk.sum(-1) / n, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(band, attn.measure_gather(q, k), rtol=1e-12, atol=1e-12)


def test_lengths_sharing_a_factor_with_the_multiplier_take_the_gather_path():
    """N = 69 = 3·23 shares a factor with B = 40503 = 3·23·587: no band order; the layer still equals its
    reference through the gathered samples."""
    assert math.gcd(HASH_B, 69) > 1
    torch.manual_seed(0)
    attn = make_attention("probsparse", (1, 69), 0, factor=1).double().eval()
    x = torch.randn(2, 69, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x, (1, 69)), attn.reference(x, (1, 69)))


def test_bad_factor_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="attention.factor must be a positive integer"):
        attention_config({"name": "probsparse", "factor": 0})
