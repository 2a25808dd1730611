"""Backend-specific tests of the data-driven sparse backends: reformer, routing, sinkhorn."""
from __future__ import annotations

import pytest
import torch
from conftest import RecordShapes, attention_yaml, backends, make_attention, token_by_token

import vitzoo
from vitzoo.attention import ConfigError
from vitzoo.attention.data_driven.bucket import BucketAttention
from vitzoo.flops import flop_analysis

NAMES = backends("data_driven", BucketAttention)  # from the registry: reformer, routing, sinkhorn, ...

# non-default options at a non-square grid with a class token: chunks/clusters/blocks that need padding
OPTIONS = [
    ("reformer", dict(chunk_size=8, bucket_size=15, n_hashes=3)),  # 4 buckets
    ("reformer", dict(chunk_size=64, n_hashes=1)),  # a chunk longer than the grid shrinks to it
    ("routing", dict(num_clusters=7)),
    ("sinkhorn", dict(block_size=7, sort_dim=4, iters=3)),
]


@pytest.mark.parametrize("name,options", OPTIONS)
def test_options_match_reference_and_flops(name, options):
    torch.manual_seed(0)
    grid = (6, 10)
    attn = make_attention(name, grid, 1, **options).double().eval()
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-6, atol=1e-8)
        measured = flop_analysis(_Call(attn.float(), grid), (torch.zeros(1, 61, 32),)).by_module()["attn"]
    assert measured == attn.flops(grid)


class _Call(torch.nn.Module):
    def __init__(self, attn, grid):
        super().__init__()
        self.attn, self.grid = attn, grid

    def forward(self, x):
        return self.attn(x, self.grid)


@pytest.mark.parametrize("name", NAMES)
def test_forward_never_builds_a_token_by_token_matrix(name):
    """At 32x32 + class token no intermediate (forward or backward) has two axes >= N/2 (routing: the paper's
    nearest-centroid heads, through cluster-sorted blocks)."""
    grid, n = (32, 32), 1025
    attn = make_attention(name, grid, 1)
    x = torch.randn(1, n, 32, requires_grad=True)
    with RecordShapes() as rec:
        attn(x, grid).sum().backward()
    assert not token_by_token(rec.shapes, n), token_by_token(rec.shapes, n)[:3]


@pytest.mark.parametrize("model", ["vit_cifar", "swin_cifar"])
@pytest.mark.parametrize("name", NAMES)
def test_builds_and_trains_in_models(name, model):
    torch.manual_seed(0)
    net = vitzoo.create_model(model, attention=attention_yaml(name))
    out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    for n, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


BAD = [
    ("reformer", dict(n_hashes=0), "attention.n_hashes must be a positive integer"),
    ("reformer", dict(n_hashes=9), "attention.n_hashes must be in 1..8"),
    ("reformer", dict(bucket_size=0), "attention.bucket_size must be a positive integer"),
    ("reformer", dict(chunk_size=0), "attention.chunk_size must be a positive integer"),
    ("reformer", dict(chunk_size=7, pad=False), "attention.chunk_size=7 does not divide the 60 tokens"),
    ("routing", dict(num_clusters=0), "attention.num_clusters must be a positive integer"),
    ("routing", dict(num_clusters=61), "attention.num_clusters=61 is more than the 60 tokens"),
    ("routing", dict(num_clusters=7, pad=False), "attention.num_clusters=7 does not divide the 60 tokens"),
    ("routing", dict(decay=1.0), r"attention.decay must be in \(0, 1\)"),
    ("sinkhorn", dict(block_size=0), "attention.block_size must be a positive integer"),
    ("sinkhorn", dict(block_size=61), "attention.block_size=61 is more than the 60 tokens"),
    ("sinkhorn", dict(block_size=7, pad=False), "attention.block_size=7 does not divide the 60 tokens"),
    ("sinkhorn", dict(iters=101), "attention.iters must be in 1..100"),
    ("sinkhorn", dict(temperature=0.0), "attention.temperature must be a positive number"),
    ("sinkhorn", dict(sort_dim=0), "attention.sort_dim must be a positive integer"),
]


@pytest.mark.parametrize("name,options,match", BAD)
def test_bad_options_are_one_line_config_errors(name, options, match):
    with pytest.raises(ConfigError, match=match) as err:
        make_attention(name, (6, 10), 0, **options)
    assert "\n" not in str(err.value)


def test_forward_at_a_grid_too_small_is_a_config_error():
    attn = make_attention("routing", (8, 8), 0)  # 8 clusters
    with pytest.raises(ConfigError, match="attention.num_clusters=8 is more than the 4 tokens"):
        attn(torch.randn(1, 4, 32), (2, 2))


def test_routing_centroids_move_in_train_and_stay_in_eval():
    torch.manual_seed(0)
    attn = make_attention("routing", (8, 8), 1)
    x = torch.randn(2, 65, 32)
    before = attn.centroids.clone()
    attn.eval()
    with torch.no_grad():
        attn(x, (8, 8))
    torch.testing.assert_close(attn.centroids, before, rtol=0, atol=0)
    attn.train()
    attn(x, (8, 8)).sum().backward()
    assert not torch.equal(attn.centroids, before)
    assert not attn.centroids.requires_grad and "centroids" not in dict(attn.named_parameters())
    torch.testing.assert_close(attn.centroids.norm(dim=-1), torch.ones(2, 8))  # still unit vectors (2 routing heads)


def test_reformer_redraws_rotations_in_training_only():
    torch.manual_seed(0)
    x = torch.randn(2, 65, 32)
    attn = make_attention("reformer", (8, 8), 1, chunk_size=8, bucket_size=8)
    rotations = attn.rotations.clone()
    with torch.no_grad():
        a, b = attn(x, (8, 8)), attn(x, (8, 8))  # train mode: fresh rotations each call
    assert not torch.equal(a, b)
    torch.testing.assert_close(attn.rotations, rotations, rtol=0, atol=0)
    fixed = make_attention("reformer", (8, 8), 1, chunk_size=8, bucket_size=8, redraw=False)
    with torch.no_grad():
        torch.testing.assert_close(fixed(x, (8, 8)), fixed(x, (8, 8)), rtol=0, atol=0)


def test_reformer_rotations_are_seeded_by_layer_index():
    a = make_attention("reformer")
    b = make_attention("reformer")
    torch.testing.assert_close(a.rotations, b.rotations, rtol=0, atol=0)
    from vitzoo.attention import MixerContext, build_attention

    c = build_attention(attention_yaml("reformer"), MixerContext(32, 4, (8, 8), 1, layer_index=3))
    assert not torch.equal(a.rotations, c.rotations)


def test_reformer_buckets_are_in_range():
    attn = make_attention("reformer", (8, 8), 0).eval()
    q, k, _ = attn.split_heads(torch.randn(2, 64, 32))
    buckets = attn.hash(k, attn.n_buckets((8, 8)))
    assert buckets.shape == (2, 4, attn.cfg.n_hashes, 64)
    assert buckets.min() >= 0 and buckets.max() < attn.n_buckets((8, 8))


def test_sinkhorn_sort_matrix_is_doubly_stochastic_and_learned():
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (8, 8), 1, iters=50)
    x = torch.randn(2, 65, 32)
    q, k, _ = attn.split_heads(x)
    r = attn.eval().sort_matrix(x[:, 1:], q[:, :, 1:].unflatten(2, (8, 8)), k[:, :, 1:].unflatten(2, (8, 8)), 64)
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 4, 8))
    torch.testing.assert_close(r.sum(-2), torch.ones(2, 4, 8), rtol=0, atol=1e-3)
    attn.train()(x, (8, 8)).square().sum().backward()
    assert attn.sort_hidden.weight.grad.abs().sum() > 0 and attn.sort_out.weight.grad.abs().sum() > 0


def test_balanced_routing_tokens_picked_by_no_cluster_attend_to_the_prefix_only_in_routing_heads():
    """The ``balanced`` option (top-w per centroid) leaves tokens out of every cluster; they see the prefix only."""
    torch.manual_seed(0)
    attn = make_attention("routing", (8, 8), 1, assignment="balanced").double().eval()  # heads 0, 1 local
    x = torch.randn(1, 65, 32, dtype=torch.float64)
    q, k, v = attn.split_heads(x)
    idx_q, _ = attn.route(q[:, 2:, 1:], k[:, 2:, 1:], attn.cluster_size((8, 8)))
    picked = torch.zeros(1, 2, 64, dtype=torch.bool).scatter_(2, idx_q.flatten(2), True)
    out = attn.attend(q, k, v, (8, 8))[:, 2:, 1:]  # [1, h_r, 64, d]
    head, token = (~picked[0]).nonzero()[0].tolist()
    torch.testing.assert_close(out[0, head, token], v[0, 2 + head, 0])  # the class token's value
