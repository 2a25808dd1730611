"""Informer's ProbSparse attention: the selected queries attend exactly, the others take mean(V); keys drawn at
random with replacement on every training step from the run's seed, a fixed pattern in eval."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import Host, attention_yaml, make_attention
from torch._dynamo.utils import counters

from vitzoo.attention import (
    ConfigError,
    MixerContext,
    attention_config,
    before_train_step,
    build_attention,
    dense_attention,
)
from vitzoo.attention.data_driven.probsparse import HASH_A, HASH_B, HASH_L, sample_count
from vitzoo.flops import flop_analysis


@torch.no_grad()
def naive_probsparse(x: torch.Tensor, attn, keys: list[list[int]]) -> torch.Tensor:
    """Informer's layer written out in float64, one query at a time, from the weights and given sampled keys.

    Args:
        x: ``[B, N, C]`` input.
        attn: the layer (only its weights, heads and factor are read).
        keys: ``keys[i]``, the U sampled key indices of query i (shared by every image and head).
    """
    B, N, C = x.shape
    h = attn.num_heads
    d = C // h
    u = min(attn.cfg.factor * math.ceil(math.log(N)), N)
    qkv = x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()  # [B, N, 3C]
    out = torch.zeros(B, N, C, dtype=torch.float64)
    for b in range(B):
        for head in range(h):
            q = qkv[b, :, head * d:(head + 1) * d]
            k = qkv[b, :, C + head * d:C + (head + 1) * d]
            v = qkv[b, :, 2 * C + head * d:2 * C + (head + 1) * d]
            sparsity = []
            for i in range(N):  # M(q_i) = max_j q_i·k_j - Σ_j q_i·k_j / N over the sampled j
                dots = [float(q[i] @ k[j]) for j in keys[i]]
                sparsity.append(max(dots) - sum(dots) / N)
            top = sorted(range(N), key=lambda i: -sparsity[i])[:u]
            mean_v = v.sum(0) / N
            for i in range(N):
                if i in top:
                    w = torch.exp((k @ q[i]) / math.sqrt(d))
                    out[b, i, head * d:(head + 1) * d] = (w[:, None] * v).sum(0) / w.sum()
                else:
                    out[b, i, head * d:(head + 1) * d] = mean_v
    return out @ attn.proj.weight.double().T + attn.proj.bias.double()


def eval_keys(n: int, u: int, layer: int) -> list[list[int]]:
    """The fixed eval pattern written out: key s of query i is (i·A + s·B + layer·L) mod n."""
    return [[(i * HASH_A + s * HASH_B + layer * HASH_L) % n for s in range(u)] for i in range(n)]


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
    torch.testing.assert_close(band, attn.measure_gather(q, k, samples), rtol=1e-12, atol=1e-12)


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


@pytest.mark.parametrize("grid,prefix,layer", [((8, 8), 1, 0), ((6, 10), 0, 3), ((3, 23), 0, 1)])
def test_eval_equals_the_naive_layer_on_the_fixed_pattern(grid, prefix, layer):
    """Eval (band path at N = 65, 60; gather path at N = 69) against the per-query loop on the written-out pattern."""
    torch.manual_seed(0)
    n = prefix + grid[0] * grid[1]
    spec = {**attention_yaml("probsparse"), "factor": 1}
    attn = build_attention(spec, MixerContext(32, 4, grid, prefix, layer_index=layer)).double().eval()
    x = torch.randn(2, n, 32, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x, grid)
    torch.testing.assert_close(out, naive_probsparse(x, attn, eval_keys(n, sample_count(1, n), layer)))


@pytest.mark.parametrize("grid,prefix", [((8, 8), 1), ((6, 10), 0)])
def test_training_equals_the_naive_layer_on_the_step_s_draws(grid, prefix):
    torch.manual_seed(0)
    n = prefix + grid[0] * grid[1]
    attn = make_attention("probsparse", grid, prefix, factor=1).double().train()
    x = torch.randn(2, n, 32, dtype=torch.float64)
    for _ in range(2):
        before_train_step(attn)
        keys = [[int(attn.draws[i, s]) % n for s in range(sample_count(1, n))] for i in range(n)]
        with torch.no_grad():
            torch.testing.assert_close(attn(x, grid), naive_probsparse(x, attn, keys))
            torch.testing.assert_close(attn.reference(x, grid), naive_probsparse(x, attn, keys))


def test_every_training_step_draws_fresh_keys_with_replacement_and_eval_keeps_its_pattern():
    torch.manual_seed(0)
    attn = make_attention("probsparse", (8, 8), 1).train()  # N = 65, U = 25
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        outs, draws = [], []
        for _ in range(3):
            before_train_step(attn)
            draws.append(attn.draws.clone())
            outs.append(attn(x, (8, 8)))
        evals = [attn.eval()(x, (8, 8)), None]
        before_train_step(attn)  # eval mode: no draw
        evals[1] = attn(x, (8, 8))
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    assert not torch.equal(outs[0], outs[1])
    assert torch.equal(draws[2], attn.draws) and int(attn.steps) == 3
    torch.testing.assert_close(evals[0], evals[1], rtol=0, atol=0)
    # with replacement: U = 25 draws among 65 keys repeat a key in most rows (P(no repeat) is about 1 %)
    keys = torch.cat(draws) % 65  # [3·65, 25]
    repeats = torch.tensor([len(set(row.tolist())) < 25 for row in keys])
    assert repeats.float().mean() > 0.8
    # uniform: every key is drawn, none more than twice its share (3·65·25 draws, 75 per key on average)
    counts = torch.bincount(keys.flatten(), minlength=65)
    assert counts.min() > 0 and counts.max() < 150


def test_same_seed_same_draws_and_a_resumed_layer_continues_the_stream():
    def steps(seed: int, count: int):
        torch.manual_seed(seed)
        attn = make_attention("probsparse", (8, 8), 1).train()
        for _ in range(count):
            before_train_step(attn)
        return attn

    a, b, other = steps(7, 3), steps(7, 3), steps(8, 3)
    assert torch.equal(a.draws, b.draws) and not torch.equal(a.draws, other.draws)
    saved = a.state_dict()
    assert int(saved["steps"]) == 3 and int(saved["draw_seed"]) == 7 and "draws" not in saved
    torch.manual_seed(99)  # built under another seed: the loaded seed, layer and step rule
    resumed = make_attention("probsparse", (8, 8), 1).train()
    assert not torch.equal(resumed.draws, a.draws)
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.draws, a.draws)  # the current step's draws, rebuilt on loading
    for _ in range(2):
        before_train_step(a)
        before_train_step(resumed)
        assert torch.equal(resumed.draws, a.draws)
    assert int(resumed.steps) == 5


def test_layers_draw_different_keys():
    spec = attention_yaml("probsparse")
    torch.manual_seed(0)
    a, b = (build_attention(spec, MixerContext(32, 4, (8, 8), 1, layer_index=i)).train() for i in (0, 1))
    before_train_step(a)
    before_train_step(b)
    assert not torch.equal(a.draws, b.draws)


def test_fewer_tokens_use_the_draws_mod_n_and_more_tokens_in_training_is_a_config_error():
    torch.manual_seed(0)
    attn = make_attention("probsparse", (8, 8), 1).train()  # built for 65 tokens
    before_train_step(attn)
    keys = attn.sample_keys(40, torch.device("cpu"))  # a reduced sequence
    assert keys.shape == (40, sample_count(5, 40)) and int(keys.max()) < 40
    with pytest.raises(ConfigError, match="draws its training samples for the 65 tokens it was built for and got 101"
                       ) as err:
        attn(torch.randn(1, 101, 32), (10, 10))
    assert "\n" not in str(err.value)
    assert attn.eval()(torch.randn(1, 101, 32), (10, 10)).shape == (1, 101, 32)  # eval: any length


def test_training_flops_equal_fvcore_and_the_analytic_count():
    torch.manual_seed(0)
    attn = make_attention("probsparse", (8, 8), 1).train()
    before_train_step(attn)
    with torch.no_grad():
        measured = flop_analysis(Host(attn, (8, 8)), (torch.randn(1, 65, 32),)).by_module()["attn"]
    assert measured == attn.flops((8, 8))


def test_training_step_compiles_once_across_draws():
    """The draws are a buffer filled outside forward: a compiled training forward sees new keys every step
    without recompiling, and equals eager."""
    torch.manual_seed(0)
    attn = make_attention("probsparse", (8, 8), 1).train()
    compiled = torch.compile(Host(attn, (8, 8)), backend="eager", fullgraph=True, dynamic=False)
    x = torch.randn(2, 65, 32)
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for _ in range(3):
            before_train_step(attn)
            torch.testing.assert_close(compiled(x), attn(x, (8, 8)))
    assert counters["stats"]["unique_graphs"] - graphs == 1
