"""Token reduction (``model.token_reduction``): ToMe, EViT and TokenLearner inside a ViT."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import ATTENTION_NAMES

from vitzoo.attention import ConfigError
from vitzoo.flops import count_flops, flop_analysis
from vitzoo.layers.reduction_options import EViTConfig
from vitzoo.layers.token_reduction import (
    ToMe,
    ToMeConfig,
    sequence_backends,
    set_training_progress,
    size_bias,
)
from vitzoo.models import create_model

TINY = dict(depth=4, embed_dim=32, num_heads=4, drop_path_rate=0.0)
REDUCTIONS = [("tome", "global"), ("tome", "efficient"), ("tome", "xca"), ("tome", "hydra"), ("tome", "nystrom"),
              ("tome", "probsparse"), ("tome", "fnet"), ({"name": "tome", "r": 3}, "linear"),
              ({"name": "evit", "locations": [1, 3]}, "global"), ({"name": "evit", "keep_rate": 0.5}, "global"),
              ("tokenlearner", "global"), ({"name": "tokenlearner", "location": 0, "num_tokens": 4}, "performer"),
              ({"name": "tokenlearner", "num_tokens": 64, "hidden_dim": 16}, "global")]


def tiny(reduction, attention, **kw):
    return create_model("vit_cifar", attention=attention, token_reduction=reduction, **{**TINY, **kw}).eval()


@pytest.mark.parametrize("reduction,attention", REDUCTIONS)
def test_flops_follow_the_shrinking_sequence_per_block(reduction, attention):
    """Analytic equals fvcore's count for every block, each at its own token count, and in total."""
    model = tiny(reduction, attention)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        analysis = flop_analysis(model, (x,))
        by_module = analysis.by_module()
        for i, (blk, grid) in enumerate(zip(model.blocks, model.block_grids(model.grid))):
            assert by_module[f"blocks.{i}"] == blk.flops(grid), f"block {i} at {grid}"
        assert analysis.total() == model.flops()
    assert model.out_grid(model.grid)[1] <= 64  # never more tokens than the 8x8 grid at the end
    if model.out_grid(model.grid)[1] == 64:  # S = 64 learned tokens: as many as the grid, no reduction
        return
    if attention != "nystrom":  # below its 64 landmarks Nyström's landmarks are the tokens: a shorter N can cost more
        assert model.flops() < create_model("vit_cifar", attention=attention, **TINY).flops()


@pytest.mark.parametrize("reduction,attention", REDUCTIONS)
def test_forward_backward_and_token_counts(reduction, attention):
    model = tiny(reduction, attention).train()
    seen = []
    model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    out = model(torch.randn(2, 3, 32, 32))
    out.square().sum().backward()
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    assert seen == [1 + model.out_grid(model.grid)[1]] and seen[0] <= 65
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_tome_r13_cuts_vit_small_flops_by_a_third():
    full = create_model("vit_small", attention="global").flops()
    tome = create_model("vit_small", attention="global", token_reduction={"name": "tome", "r": 13}).flops()
    assert tome <= full * 2 / 3, (tome, full)


def test_tome_merging_keeps_sizes_and_size_weighted_sums():
    """A merge conserves Σ s and Σ s·x (sizes add, features are size-weighted means); the class token stays first."""
    torch.manual_seed(0)
    tome = ToMe(ToMeConfig(r=5), num_prefix=1, use_keys=False)
    x = torch.randn(2, 17, 8, dtype=torch.float64)
    size = torch.randint(1, 4, (2, 17, 1)).double()
    merged, new_size = tome.merge(x, size, torch.randn(2, 17, 6, dtype=torch.float64), 5)
    assert merged.shape == (2, 12, 8) and new_size.shape == (2, 12, 1)
    torch.testing.assert_close(new_size.sum(1), size.sum(1))
    torch.testing.assert_close((merged * new_size).sum(1), (x * size).sum(1))
    torch.testing.assert_close(merged[:, 0], x[:, 0])


def test_tome_merges_the_most_similar_pairs():
    """Tokens 2 and 3 are identical, the rest orthogonal: r = 1 merges exactly that pair into one token of size 2."""
    x = torch.eye(8, dtype=torch.float64)[None]  # 8 orthogonal tokens
    x[0, 2] = x[0, 3]
    tome = ToMe(ToMeConfig(r=1), num_prefix=1, use_keys=False)
    merged, size = tome.merge(x, torch.ones(1, 8, 1, dtype=torch.float64), x, 1)
    assert sorted(size.flatten().tolist()) == [1.0] * 6 + [2.0]
    assert torch.equal(merged[0, size[0, :, 0] == 2][0], x[0, 3])


def test_size_weighted_attention_is_attention_over_repeated_tokens():
    """``softmax(QKᵀ/√d + log s)``: a token of size s counts as s copies of itself (ToMe's proportional attention)."""
    torch.manual_seed(0)
    attn = create_model("vit_cifar", attention="global", **TINY).blocks[0].attn.double().eval()
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    size = torch.tensor([1.0, 3.0, 1.0, 2.0, 1.0], dtype=torch.float64)[None, :, None]
    out, _, _ = attn.forward_with_keys(x, (1, 4), size_bias(size))
    repeated = x.repeat_interleave(size[0, :, 0].long(), dim=1)  # [1, 8, 32]
    full, _, _ = attn.forward_with_keys(repeated, (1, 7))
    first = torch.cumsum(size[0, :, 0].long(), 0) - size[0, :, 0].long()  # each token's first copy
    torch.testing.assert_close(out, full[:, first])
    torch.testing.assert_close(attn.forward_with_keys(x, (1, 4))[0], attn(x, (1, 4)))  # no bias: the backend itself


def test_reducers_read_keys_only_from_backends_that_expose_them():
    """The capability is declared on the class: a backend without it is refused by EViT, and ToMe falls back
    to the mixer's input as its similarity."""
    with pytest.raises(ConfigError, match="exposes its queries and keys"):
        tiny({"name": "evit", "locations": [0]}, "efficient")
    assert not tiny("tome", "efficient").blocks[0].reducer.use_keys
    assert tiny("tome", "global").blocks[0].reducer.use_keys


def test_evit_keeps_the_top_tokens_and_fuses_the_rest():
    model = tiny({"name": "evit", "locations": [0], "keep_rate": 0.5}, "global")
    reducer = model.blocks[0].reducer
    assert reducer.kept(65) == 32 and reducer.reduced(65) == 34  # class token + 32 kept + 1 fused
    assert reducer.reduced(11) == 1 + 5 + 1 and tiny({"name": "evit", "keep_rate": 1.0, "locations": [0]},
                                                      "global").blocks[0].reducer.reduced(65) == 65


def test_tokenlearner_pools_a_constant_grid_to_that_token():
    """Each learned map sums to one over the grid tokens: a grid of equal tokens gives S copies of it."""
    model = tiny({"name": "tokenlearner", "location": 0, "num_tokens": 4}, "global")
    learner = model.blocks[0].reducer
    captured = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    x = torch.randn(2, 1, 32).expand(2, 65, 32).clone()
    learner(model.blocks[0], x, (8, 8), None)
    torch.testing.assert_close(captured["x"], x[:, :5])


@pytest.mark.parametrize("name", [n for n in ATTENTION_NAMES if n not in sequence_backends()])
def test_grid_backends_are_a_build_time_error_naming_both_options(name):
    with pytest.raises(ConfigError, match=f"model.token_reduction=tome cannot run with attention={name}"):
        create_model("vit_cifar", attention=name, token_reduction="tome", **TINY)


@pytest.mark.parametrize("spec,attention,kw,match", [
    ("evit", "linear", {}, "model.token_reduction=evit ranks tokens by the class token's softmax attention"),
    ("evit", "global", {"class_token": False, "global_pool": "avg"}, "model.token_reduction=evit needs model.class"),
    ({"name": "relu_linear", "scales": [5]}, None, {}, None),
    ({"name": "tome", "r": 0}, "global", {}, "model.token_reduction.r must be a positive integer"),
    ({"name": "evit", "keep_rate": 1.5}, "global", {}, r"model.token_reduction.keep_rate must be in \(0, 1\]"),
    ({"name": "evit", "locations": [9]}, "global", {}, "model.token_reduction.locations must be blocks of the model"),
    ({"name": "tokenlearner", "location": 4}, "global", {}, "model.token_reduction.location must be a block"),
    ({"name": "tokenlearner", "bogus": 1}, "global", {}, "unknown option model.token_reduction.bogus"),
    ("nope", "global", {}, "unknown model.token_reduction 'nope'"),
])
def test_bad_reductions_are_one_line_config_errors(spec, attention, kw, match):
    if attention is None:  # relu_linear's multi-scale heads need the grid
        spec, attention, match = "tome", spec, (r"model.token_reduction=tome cannot run with attention=relu_linear as "
                                                r"configured: Single-scale heads only \(attention.scales=\[\]\)")
    with pytest.raises(ConfigError, match=match):
        create_model("vit_cifar", attention=attention, token_reduction=spec, **{**TINY, **kw})


def test_single_scale_relu_linear_runs_after_token_reduction():
    """A declared capability, per config: relu_linear takes a reduced sequence once its heads are single-scale."""
    model = create_model("vit_cifar", attention={"name": "relu_linear", "scales": []}, token_reduction="tome", **TINY)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert "relu_linear" in sequence_backends() and "window" not in sequence_backends()


def test_swin_rejects_token_reduction_naming_both_options():
    with pytest.raises(ConfigError, match="model.token_reduction=tome needs a ViT: Swin's patch merging"):
        create_model("swin_cifar", attention="global", token_reduction="tome")


@pytest.mark.parametrize("reduction,attention", [("tome", "global"), ("tome", "linear"), ("evit", "global"),
                                                 ("tokenlearner", "global")])
def test_breakdown_rows_each_equal_fvcore(reduction, attention):
    """Every row of the FLOPs breakdown (blocks, their norms, projections, reducer, MLP) is exact."""
    report = count_flops(create_model("vit_cifar", attention=attention, token_reduction=reduction, depth=4))
    assert report.analytic == report.measured
    assert any(row.name.endswith("reducer") for row in report.modules)
    for row in report.modules:
        assert row.analytic == row.measured, (row.name, row.analytic, row.measured)


PRECISION_CASES = [("tome", "global"), ("evit", "global"), ("tokenlearner", "global"), ("tome", "linear")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("reduction,attention", PRECISION_CASES)
def test_autocast_forward_backward_finite_and_close(reduction, attention, dtype):
    torch.manual_seed(0)
    model = tiny(reduction, attention)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert (out.float() - ref).abs().max() <= 0.1 * ref.abs().max()


@pytest.mark.parametrize("reduction,attention", PRECISION_CASES)
def test_compiled_training_step_compiles_once(reduction, attention):
    torch._dynamo.reset()
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    model = tiny(reduction, attention).train()
    compiled = torch.compile(model, backend=backend)
    for step in range(4):
        compiled(torch.randn(2, 3, 32, 32)).square().sum().backward()
        if step == 0:
            warm = len(graphs)
    assert len(graphs) == warm
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reduction,attention", PRECISION_CASES)
def test_export_eval_model_then_eager(reduction, attention):
    torch.manual_seed(0)
    model = tiny(reduction, attention)
    x = torch.randn(2, 3, 32, 32)
    before = model(x)
    program = torch.export.export(model, (x,))
    torch.testing.assert_close(program.module()(x), before, atol=1e-5, rtol=1e-4)


def test_nan_in_the_input_gives_nan_outputs():
    model = tiny("tome", "global")
    x = torch.randn(2, 3, 32, 32)
    x[0, :, :4, :4] = float("nan")  # one patch of the first image
    out = model(x)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_evit_keep_rate_schedule_matches_the_paper_table():
    """1 until warmup_start, a half cosine from 1 to keep_rate over warmup_epochs, then keep_rate."""
    cfg = EViTConfig(keep_rate=0.6, warmup_start=2, warmup_epochs=4)

    def expected(epoch):  # the authors' adjust_keep_rate, written out
        if epoch < 2:
            return 1.0
        if epoch >= 6:
            return 0.6
        return 0.6 + 0.4 * 0.5 * (1 + math.cos(math.pi * (epoch - 2) / 4))

    table = {0: 1.0, 1.99: 1.0, 2: 1.0, 3: 0.6 + 0.2 * (1 + 2 ** -0.5), 4: 0.8, 5: 0.6 + 0.2 * (1 - 2 ** -0.5),
             6: 0.6, 40: 0.6}
    for epoch, value in table.items():
        assert cfg.rate_at(epoch) == pytest.approx(value, abs=1e-12), epoch
        assert cfg.rate_at(epoch) == pytest.approx(expected(epoch), abs=1e-12), epoch
    steps = [cfg.rate_at(2 + i / 25) for i in range(101)]  # per step: 25 steps an epoch
    assert all(a > b for a, b in zip(steps, steps[1:]))  # strictly falling through the warm-up
    default = EViTConfig()
    assert default.rate_at(0) == 1.0 and default.rate_at(0.5) == pytest.approx(0.85) and default.rate_at(1) == 0.7
    assert EViTConfig(keep_rate=0.5, warmup_epochs=0).rate_at(0) == 0.5  # no warm-up: the target from step 0


def test_evit_trains_at_the_scheduled_rate_and_evaluates_at_the_target():
    """Training runs at the schedule's rate; eval (export) and the FLOPs at keep_rate, equal to fvcore in eval."""
    model = tiny({"name": "evit", "locations": [0], "keep_rate": 0.5, "warmup_epochs": 2}, "global").train()
    seen = []
    model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    x = torch.randn(1, 3, 32, 32)
    target_flops = model.flops()
    for epoch, kept in [(0, 64), (1, 48), (2, 32), (0.5, 60)]:  # rate 1, 0.75, 0.5, 0.5 + 0.25·(1 + cos(π/4))
        set_training_progress(model, epoch)
        seen.clear()
        model(x)
        assert seen == [1 + kept + (kept < 64)], epoch  # class token + kept + one fused token when any dropped
        assert model.flops() == target_flops
    seen.clear()
    model.eval()(x)
    assert seen == [1 + 32 + 1]
    report = count_flops(model.train())
    assert model.training and report.analytic == report.measured == target_flops


def test_tokenlearner_mlp_is_the_papers_64_wide_bottleneck():
    default = tiny("tokenlearner", "global").blocks[2].reducer.mlp
    assert [(m.in_features, m.out_features) for m in (default[0], default[2])] == [(32, 64), (64, 8)]
    narrow = tiny({"name": "tokenlearner", "hidden_dim": 16, "num_tokens": 4}, "global").blocks[2].reducer.mlp
    assert [(m.in_features, m.out_features) for m in (narrow[0], narrow[2])] == [(32, 16), (16, 4)]
    report = count_flops(tiny({"name": "tokenlearner", "hidden_dim": 16}, "global"))
    row = next(r for r in report.modules if r.name.endswith("reducer"))
    M, C, D, S = 64, 32, 16, 8
    assert row.analytic == row.measured == 5 * M * C + M * C * D + M * D * S + M * S * C  # norm, MLP, pooling


@pytest.mark.parametrize("spec,match", [
    ({"name": "tokenlearner", "num_tokens": 1000}, "model.token_reduction.num_tokens must be at most the grid's 64"),
    ({"name": "tokenlearner", "num_tokens": 65}, "model.token_reduction.num_tokens must be at most the grid's 64"),
    ({"name": "tokenlearner", "hidden_dim": 0}, "model.token_reduction.hidden_dim must be a positive integer"),
    ({"name": "evit", "keep_rate": 1.01}, r"model.token_reduction.keep_rate must be in \(0, 1\]"),
    ({"name": "evit", "warmup_epochs": -1}, "model.token_reduction.warmup_epochs must be a number of epochs >= 0"),
    ({"name": "evit", "warmup_epochs": float("nan")}, "model.token_reduction.warmup_epochs must be a number"),
    ({"name": "evit", "warmup_start": "ten"}, "model.token_reduction.warmup_start must be a number of epochs"),
    ({"name": "evit", "warmup_start": True}, "model.token_reduction.warmup_start must be a number of epochs"),
])
def test_options_that_would_grow_or_break_the_sequence_are_one_line_errors(spec, match):
    with pytest.raises(ConfigError, match=match) as err:
        create_model("vit_cifar", attention="global", token_reduction=spec, **TINY)
    assert "\n" not in str(err.value)


def test_no_reducer_lengthens_the_sequence():
    """ToMe with r beyond half the tokens, EViT at keep rate 1, TokenLearner with S = the grid: never above 65."""
    for spec in [{"name": "tome", "r": 1000}, {"name": "evit", "keep_rate": 1.0}, {"name": "tokenlearner",
                                                                                  "num_tokens": 64}]:
        model = tiny(spec, "global")
        counts = [1 + g[0] * g[1] for g in [*model.block_grids(model.grid), model.out_grid(model.grid)]]
        assert counts[0] == 65 and all(a >= b for a, b in zip(counts, counts[1:])), (spec, counts)
        seen = []
        model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
        model(torch.randn(1, 3, 32, 32))
        assert seen == counts[-1:], spec
    learner = tiny({"name": "tokenlearner", "num_tokens": 16}, "global")
    assert learner(torch.randn(1, 3, 16, 16)).shape == (1, 10)  # a 4x4 grid: 16 tokens, as many as S
    with pytest.raises(ConfigError, match="model.token_reduction.num_tokens must be at most the grid's 9 tokens"):
        learner(torch.randn(1, 3, 12, 12))  # a 3x3 grid
