"""Sparse Sinkhorn attention follows the paper: SortNet on block sums of the layer input, Gumbel-Sinkhorn
normalisation, each block attending to itself and to its sorted block; the other sorting nets are options."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import Host, make_attention

from vitzoo.attention import ConfigError
from vitzoo.flops import flop_analysis


def sinkhorn_blocks(attn, x: torch.Tensor, same_heads: bool = False):
    """Grid tokens of ``x`` and the query and key blocks ``[B, h, 8, 8, d]`` of an 8x8 grid (with a class
    token); optionally head 0's blocks in every head."""
    q, k, _ = attn.split_heads(x)
    qb, kb = q[:, :, 1:].unflatten(2, (8, 8)), k[:, :, 1:].unflatten(2, (8, 8))
    if same_heads:
        qb, kb = qb[:, :1].expand_as(qb), kb[:, :1].expand_as(kb)
    return x[:, 1:], qb, kb


def naive_sinkhorn(scores: torch.Tensor, temperature: float, iters: int) -> torch.Tensor:
    """Sinkhorn's algorithm on one matrix as the paper writes it, in probability space: ``exp(S/τ)``, then
    ``iters`` rounds of dividing by the column sums, then by the row sums."""
    r = torch.exp(scores / temperature)
    for _ in range(iters):
        r = r / r.sum(0, keepdim=True)
        r = r / r.sum(1, keepdim=True)
    return r


@torch.no_grad()
def naive_sinkhorn_layer(x: torch.Tensor, attn, grid) -> torch.Tensor:
    """The layer from the paper's equations in float64, one query at a time (eval: no Gumbel noise).

    Block i holds grid tokens [i·b, (i + 1)·b); SortNet reads the block sums of x: ``relu(W2 relu(W1 Σx + b1) + b2)``,
    nb logits per head; Sinkhorn turns them into R; the sorted block i is ``Σ_j R_ij (keys, values of block j)``
    slot by slot (a slot past the last real token is a zero key weighted by the R mass of the real ones). A grid
    query attends to its own block's keys, the sorted block's slots and the prefix keys; a prefix query to all.
    """
    B, N, C = x.shape
    P, h = attn.num_prefix, attn.num_heads
    d, M = C // h, grid[0] * grid[1]
    b = attn.cfg.block_size or math.ceil(math.sqrt(M))
    nb = math.ceil(M / b)
    w = {name: p.double() for name, p in attn.named_parameters()}
    x = x.double()
    qkv = x @ w["qkv.weight"].T + w["qkv.bias"]  # [B, N, 3C]
    out = torch.zeros(B, N, C, dtype=torch.float64)
    for img in range(B):
        logits = []
        for i in range(nb):
            pooled = sum(x[img, P + t] for t in range(i * b, min((i + 1) * b, M)))  # [C]
            hidden = torch.relu(w["sort_hidden.weight"] @ pooled + w["sort_hidden.bias"])
            logits.append(torch.relu(w["sort_out.weight"] @ hidden + w["sort_out.bias"]))  # [h·nb]
        for head in range(h):
            cols = slice(head * d, (head + 1) * d)
            q = qkv[img, :, cols]
            k = qkv[img, :, C:][:, cols]
            v = qkv[img, :, 2 * C:][:, cols]
            r = naive_sinkhorn(torch.stack([row[head * nb:(head + 1) * nb] for row in logits]),
                               attn.cfg.temperature, attn.cfg.iters)  # [nb, nb]
            sorted_slots = []  # per block: (key, value, weight) of each of its b sorted slots
            for i in range(nb):
                slots = []
                for s in range(b):
                    real = [j for j in range(nb) if j * b + s < M]
                    key = sum(r[i, j] * k[P + j * b + s] for j in real)
                    value = sum(r[i, j] * v[P + j * b + s] for j in real)
                    slots.append((key, value, float(sum(r[i, j] for j in real))))
                sorted_slots.append(slots)
            for t in range(N):
                if t < P:
                    entries = [(k[j], v[j], 1.0) for j in range(N)]
                else:
                    i = (t - P) // b
                    entries = [(k[P + j], v[P + j], 1.0) for j in range(i * b, min((i + 1) * b, M))]
                    entries += sorted_slots[i] + [(k[j], v[j], 1.0) for j in range(P)]
                num, den = torch.zeros(d, dtype=torch.float64), 0.0
                for key, value, weight in entries:
                    e = weight * math.exp(float(q[t] @ key) / math.sqrt(d))
                    num, den = num + e * value, den + e
                out[img, t, cols] = num / den
    return out @ w["proj.weight"].T + w["proj.bias"]


@pytest.mark.parametrize("grid,prefix", [((8, 8), 1), ((6, 10), 0), ((5, 7), 1)])
def test_layer_equals_the_naive_paper_layer(grid, prefix):
    """8x8: 8 full blocks; 6x10: 60 tokens in 8 blocks of 8 (4 pad slots); 5x7: 35 tokens in 6 blocks of 6."""
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", grid, prefix).double().eval()
    with torch.no_grad():  # larger SortNet weights than the init's: sorts far from uniform
        attn.sort_hidden.weight.normal_(0, 0.3)
        attn.sort_out.weight.normal_(0, 0.5)
    x = torch.randn(1, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        fast, ref = attn(x, grid), attn.reference(x, grid)
    naive = naive_sinkhorn_layer(x, attn, grid)
    torch.testing.assert_close(fast, naive, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ref, naive, rtol=1e-9, atol=1e-10)
    if grid == (8, 8):  # not a trivial case: the sorting is far from uniform
        with torch.no_grad():
            assert attn.sort_matrix(*sinkhorn_blocks(attn, x), 64).amax() > 0.5


def test_training_without_noise_equals_the_naive_layer_and_gradients_reach_sortnet():
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (6, 10), 1, noise=0.0).double().train()
    x = torch.randn(1, 61, 32, dtype=torch.float64, requires_grad=True)
    out = attn(x, (6, 10))
    torch.testing.assert_close(out.detach(), naive_sinkhorn_layer(x, attn, (6, 10)), rtol=1e-9, atol=1e-10)
    out.square().sum().backward()
    assert attn.sort_hidden.weight.grad.abs().sum() > 0 and attn.sort_out.weight.grad.abs().sum() > 0


def test_sortnet_reads_block_sums_of_the_input_not_the_keys():
    """score[h, i, j] = relu(W2 relu(W1 X̄_i + b1) + b2)[h·nb + j], X̄_i the sum of block i's input tokens."""
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1).double().eval()
    assert attn.sort_hidden.weight.shape == (16, 32) and attn.sort_out.weight.shape == (4 * 8, 16)  # C->s->h·nb
    x = torch.randn(1, 65, 32, dtype=torch.float64)
    with torch.no_grad():
        xg, qb, kb = sinkhorn_blocks(attn, x)
        scores = attn.sort_scores(xg, qb, kb, 64)  # [1, h, nb, nb]
        for i in range(8):
            pooled = x[0, 1 + 8 * i:1 + 8 * (i + 1)].sum(0)
            hidden = torch.relu(attn.sort_hidden.weight @ pooled + attn.sort_hidden.bias)
            row = torch.relu(attn.sort_out.weight @ hidden + attn.sort_out.bias)  # [h·nb]
            for h in range(4):
                torch.testing.assert_close(scores[0, h, i], row[8 * h:8 * (h + 1)])
        # the same input with other q/k projections: the same scores
        attn.qkv.weight.normal_()
        torch.testing.assert_close(attn.sort_scores(xg, *sinkhorn_blocks(attn, x)[1:], 64), scores)


@pytest.mark.parametrize("sort_net", ["input", "keys"])
def test_sorting_differs_between_heads(sort_net):
    """Each head sorts on its own logits: the same blocks in every head give a different R per head."""
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1, sort_net=sort_net).eval()
    with torch.no_grad():
        attn.sort_out.weight.normal_(0, 0.5)
        r = attn.sort_matrix(*sinkhorn_blocks(attn, torch.randn(2, 65, 32), same_heads=True), 64)  # [B, h, nb, nb]
    for head in range(1, 4):
        assert (r[:, head] - r[:, 0]).abs().max() > 1e-3, head


def test_gumbel_noise_in_training_only():
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1)
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        blocks = sinkhorn_blocks(attn, x)
        train = [attn.train().sort_matrix(*blocks, 64) for _ in range(2)]
        evals = [attn.eval().sort_matrix(*blocks, 64) for _ in range(2)]
        assert not torch.allclose(train[0], train[1])  # fresh noise every training forward
        torch.testing.assert_close(evals[0], evals[1], rtol=0, atol=0)
        assert not torch.allclose(train[0], evals[0])
        quiet = make_attention("sinkhorn", (8, 8), 1, noise=0.0)
        quiet.load_state_dict(attn.state_dict())
        torch.testing.assert_close(quiet.train().sort_matrix(*blocks, 64), evals[0])  # noise 0: no noise
        torch.testing.assert_close(train[0].sum(-1), torch.ones(2, 4, 8))  # still a soft permutation


def test_noise_option_is_checked():
    with pytest.raises(ConfigError, match=r"attention.noise must be a non-negative number \(got -1.0\)") as err:
        make_attention("sinkhorn", (8, 8), 1, noise=-1.0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sort_net", ["input", "keys", "bilinear"])
def test_sort_equals_the_naive_algorithm(sort_net):
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1, sort_net=sort_net).double().eval()
    blocks = sinkhorn_blocks(attn, torch.randn(2, 65, 32, dtype=torch.float64))
    with torch.no_grad():
        r, scores = attn.sort_matrix(*blocks, 64), attn.sort_scores(*blocks, 64)  # [B, h, nb, nb]
    for b in range(2):
        for h in range(4):
            torch.testing.assert_close(r[b, h], naive_sinkhorn(scores[b, h], attn.cfg.temperature, attn.cfg.iters))


def test_keys_option_is_a_two_layer_net_on_pooled_key_blocks():
    """score[i] = W2 relu(W1 k̄_i + b1) + b2 per head, k̄_i the mean key of block i: one logit per target block."""
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1, sort_net="keys").double().eval()
    assert attn.sort_hidden.weight.shape == (4, 8, 16) and attn.sort_out.weight.shape == (4, 16, 8)  # d->s->nb
    xg, qb, kb = sinkhorn_blocks(attn, torch.randn(1, 65, 32, dtype=torch.float64))
    with torch.no_grad():
        scores = attn.sort_scores(None, qb, kb, 64)
        for h in range(4):
            for i in range(8):
                pooled = kb[0, h, i].mean(0)  # [d]
                hidden = torch.relu(pooled @ attn.sort_hidden.weight[h] + attn.sort_hidden.bias[h, 0])
                torch.testing.assert_close(scores[0, h, i], hidden @ attn.sort_out.weight[h] + attn.sort_out.bias[h, 0])


@pytest.mark.parametrize("sort_net", ["input", "keys", "bilinear"])
@pytest.mark.parametrize("grid,prefix", [((8, 8), 1), ((6, 10), 0)])
def test_every_sort_net_matches_its_reference_and_fvcore(sort_net, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", grid, prefix, sort_net=sort_net).double().eval()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-9, atol=1e-10)
        measured = flop_analysis(Host(attn.float(), grid), (x[:1].float(),)).by_module()["attn"]
    assert measured == attn.flops(grid)


def test_sort_nets_need_their_block_count_and_bilinear_runs_anywhere():
    for sort_net in ("input", "keys"):
        attn = make_attention("sinkhorn", (8, 8), 1, sort_net=sort_net)  # b = 8, nb = 8
        with pytest.raises(ConfigError, match=f"attention.sort_net={sort_net} was built for 8 blocks and this grid "
                                              f"has 10") as err:
            attn(torch.randn(1, 1 + 10 * 10, 32), (10, 10))
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="attention.sort_net must be one of input, keys, bilinear"):
        make_attention("sinkhorn", (8, 8), 1, sort_net="conv")
    bilinear = make_attention("sinkhorn", (8, 8), 1, sort_net="bilinear")
    assert bilinear(torch.randn(1, 101, 32), (10, 10)).shape == (1, 101, 32)


def test_input_sort_net_needs_the_layer_input():
    attn = make_attention("sinkhorn", (8, 8), 1)
    q, k, v = attn.split_heads(torch.randn(1, 65, 32))
    with pytest.raises(ConfigError, match=r"attention.sort_net=input sorts on the layer input x: call attn\(x, grid\)"):
        attn.attend(q, k, v, (8, 8))
