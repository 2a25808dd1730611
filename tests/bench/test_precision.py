"""Mixed precision, ``torch.compile`` and ``torch.export`` of every backend, generated from the registry.

Every backend runs as a ViT block calls it (one class token) and as a Swin block does (no prefix;
the odd, shifted block for the shift-aware backends), on a square, a non-square and a padded grid,
plus a 56×56 grid (3136 tokens) for the kernel family, whose normalisers grow with N.

Tolerances of the autocast output against the float32 output of the same layer, relative to the
float32 output's scale ``max|out32|`` (observed worst cases in brackets):

* bf16 (8-bit mantissa, eps 2⁻⁷): 0.02 per token (0.008);
* fp16 (11-bit mantissa, eps 2⁻¹⁰): 0.004 per token (0.0011).

Content-routed backends (``data_driven`` family: hashing, clustering, sorting) pick buckets and
clusters by argmax/top-k; rounding q and k flips the choice for a few near-tied tokens, whose
outputs then differ by design. For them the bound holds for the median token instead of every token.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import ATTENTION_NAMES, SHIFT_AWARE, Host, backends, make_attention

from vitzoo.attention import before_train_step

TOLERANCE = {torch.bfloat16: 0.02, torch.float16: 0.004}
ROUTED = backends("data_driven")  # discrete routing: the median-token rule
KERNEL = backends("linear") + ["linformer"]  # feature-map attention and the projected low-rank one
RANDOM_FEATURES = ("performer", "rfa")
GRIDS = {"square": (8, 8), "non_square": (6, 10), "padded": (7, 7)}
# (name, host, grid): ViT host = class token, Swin host = no prefix (shifted block where the backend shifts)
CASES = [(n, host, g) for n in ATTENTION_NAMES for host in ("vit", "swin") for g in GRIDS]
CASES += [pytest.param(n, host, "large", marks=pytest.mark.slow) for n in KERNEL for host in ("vit", "swin")]


def build(name: str, host: str, grid: tuple[int, int], **overrides):
    """The backend as the ``host`` model's block would build it at ``grid`` (56×56: head dim 32)."""
    size = dict(dim=64, heads=2) if grid == (56, 56) else {}
    shifted = host == "swin" and name in SHIFT_AWARE
    return make_attention(name, grid, 1 if host == "vit" else 0, shifted=shifted, **size, **overrides)


def token_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Largest error of every token ``[B, N]`` relative to the reference's scale ``max|ref|``."""
    return (out.float() - ref).abs().amax(-1) / ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,host,grid", CASES)
def test_autocast_forward_backward_finite_and_close(name, host, grid, dtype, bf16_native):
    """Where bf16 is emulated (several times slower) its cases run one image instead of two."""
    grid = GRIDS.get(grid, (56, 56))
    torch.manual_seed(0)
    attn = build(name, host, grid).eval()
    x = torch.randn(1 if dtype == torch.bfloat16 and not bf16_native else 2, attn.seq_len(grid), attn.dim)
    with torch.no_grad():
        ref = attn(x, grid)
    x = x.requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        out = attn(x, grid)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all(), f"{name}: non-finite output under {dtype}"
    assert torch.isfinite(x.grad).all(), f"{name}: non-finite input gradient under {dtype}"
    for pname, p in attn.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"{name}: non-finite gradient of {pname}"
    err = token_errors(out, ref)
    worst = err.median() if name in ROUTED else err.max()
    assert worst <= TOLERANCE[dtype], f"{name} {grid} {dtype}: error {worst:.4f} of the output scale"


def test_linear_normaliser_does_not_overflow_fp16():
    """φ(K)ᵀ1 sums N = 3137 features of about 1: 32 of them give ~10⁵ > 65504, fp16's largest value."""
    torch.manual_seed(0)
    attn = make_attention("linear", (56, 56), 1, dim=64, heads=2).eval()
    x = 2 * torch.randn(1, 3137, 64)
    with torch.autocast("cpu", dtype=torch.float16):
        out = attn(x, (56, 56))
    ref = attn(x, (56, 56))
    assert torch.isfinite(out).all() and token_errors(out, ref).max() <= TOLERANCE[torch.float16]


def test_rfa_large_learned_scale_stays_finite_in_float32():
    """A learned s of 5 (no cap) in float32: the positive features' normaliser is > 0 for every row and the
    stabilised fast path gives finite outputs close to the float64 result."""
    torch.manual_seed(0)
    attn = make_attention("rfa", (14, 14), 1).eval()
    with torch.no_grad():
        attn.scale_param.fill_(5.0)
    x = torch.randn(2, 197, 32)
    q, k, _ = attn.split_heads(x)
    omega = attn.features.weight
    den = attn.feature_map(q, omega, True) @ attn.feature_map(k, omega, False).sum(-2).unsqueeze(-1)  # [B, h, N, 1]
    assert bool((den > 0).all())
    out = attn(x, (14, 14))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), attn.double()(x.double(), (14, 14)), rtol=1e-3, atol=1e-4)


def test_sinkhorn_padded_grid_gradients_finite_when_sorting_is_hard():
    """A near-hard permutation puts R_i,last at exactly 1.0: log(1 - R) was -inf and its gradient NaN."""
    torch.manual_seed(0)
    attn = make_attention("sinkhorn", (6, 10), 0, temperature=0.01)  # 60 tokens in 8 blocks of 8: 4 pad slots
    with torch.no_grad():
        attn.sort_out.weight.mul_(50)  # the sorting net's logits
    x = torch.randn(2, 60, 32, requires_grad=True)
    attn(x, (6, 10)).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_routing_centroid_update_in_float32_under_autocast():
    """The EMA step accumulates in float32 under bf16 autocast: the float32 step on the same (rounded) inputs."""
    torch.manual_seed(0)
    a, b = make_attention("routing", (8, 8), 1, decay=0.5), make_attention("routing", (8, 8), 1, decay=0.5)
    routing_heads = a.centroids.shape[0]
    x = torch.nn.functional.normalize(torch.randn(8, routing_heads, 128, 8), dim=-1).bfloat16()  # 1024 per head
    aff = x @ a.centroids.bfloat16().transpose(-2, -1)  # [B, h, T, K]
    a.update_centroids(x.float(), aff.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b.update_centroids(x, aff)
    assert b.centroids.dtype == torch.float32
    torch.testing.assert_close(b.centroids, a.centroids, atol=1e-6, rtol=0)


def test_nystrom_landmarks_without_host_tensor():
    """Segment means are computed from tensors only (no torch.tensor of a Python list per forward)."""
    attn = make_attention("nystrom", (7, 7), 1, landmarks=8)
    t = torch.randn(2, 4, 50, 8, dtype=torch.float64)
    s = -(-50 // 8)
    expected = torch.stack([t[:, :, i * s:(i + 1) * s].mean(-2) for i in range(8)], dim=2)
    torch.testing.assert_close(attn.landmarks(t), expected)


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_torch_save_whole_model(name, tmp_path):
    attn = make_attention(name, (8, 8), 1).eval()
    torch.save(attn, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.randn(1, 65, 32)
    torch.testing.assert_close(loaded(x, (8, 8)), attn(x, (8, 8)))


def counting_backend(counter: list):
    """A ``torch.compile`` backend that counts the graphs dynamo hands it, then runs them via AOTAutograd."""
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        counter.append(gm)
        return aot_eager(gm, example_inputs)
    return backend


def small(name: str, host: str, **overrides):
    """A tiny layer (C = 16, 2 heads, 6×6 grid); random-feature backends redraw every step."""
    if name in RANDOM_FEATURES:
        overrides["redraw_interval"] = 1
    return build(name, host, (6, 6), dim=16, heads=2, **overrides)


@pytest.mark.slow  # dynamo traces every backend in both hosts
@pytest.mark.parametrize("host", ["vit", "swin"])
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_compiled_training_step_compiles_once(name, host):
    """5 training steps (redraw, forward, backward) after warm-up: no graph beyond the first step's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    attn = small(name, host).train()
    model = Host(attn, (6, 6))
    graphs = []
    compiled = torch.compile(model, backend=counting_backend(graphs))
    for step in range(6):
        before_train_step(model)
        x = torch.randn(2, attn.seq_len((6, 6)), 16, requires_grad=True)
        compiled(x).square().sum().backward()
        if step == 0:
            warm = len(graphs)
    assert len(graphs) == warm, f"{name}: {len(graphs) - warm} recompilations in 5 steps after warm-up"
    model.eval()
    x = torch.randn(2, attn.seq_len((6, 6)), 16)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["global", "window", "performer", "rfa", "linear"])
def test_inductor_matches_eager(name):
    """The real compiler (inductor, C++ on CPU) on a training step and an eval pass (~20 s each)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Host(small(name, "vit"), (6, 6))
    compiled = torch.compile(model)
    x = torch.randn(2, 37, 16, requires_grad=True)
    before_train_step(model)
    compiled(x).square().sum().backward()
    grad, x.grad = x.grad, None
    model(x).square().sum().backward()
    torch.testing.assert_close(grad, x.grad, atol=1e-4, rtol=1e-3)
    model.eval()
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("host", ["vit", "swin"])
@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_export_eval_model_then_eager(name, host):
    """``torch.export`` of the eval layer matches eager; the eager layer is unchanged afterwards."""
    torch.manual_seed(0)
    attn = small(name, host).eval()
    model = Host(attn, (6, 6))
    x = torch.randn(2, attn.seq_len((6, 6)), 16)
    before = model(x)
    program = torch.export.export(model, (x,))
    torch.testing.assert_close(program.module()(x), before, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model(x), before, atol=0, rtol=0)


# ---------------------------------------------------------------- training runs: bf16-mixed and compile

def short_run(tmp_path, attention, *extra):
    """A 4-step run of a one-block ViT on one digits batch (train.yaml + overrides)."""
    from conftest import CONFIGS
    from hydra import compose, initialize_config_dir

    from vitzoo.training import fit

    overrides = [f"attention={attention}", "+model.depth=1", "+model.embed_dim=32", "+model.num_heads=2",
                 "data.batch_size=16", "data.augment=false", "trainer.overfit_batches=1", "trainer.max_epochs=4",
                 "trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
                 "callbacks.rich_progress_bar=null", "benchmark.batch_size=4", "benchmark.warmup=1",
                 "benchmark.steps=1", *extra]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    cfg.paths.output_dir = str(tmp_path)
    return fit(cfg)


@pytest.mark.slow
def test_bf16_mixed_training_run_on_cpu(tmp_path):
    """``trainer.precision=bf16-mixed`` trains on CPU; performer's redraws are counted per step."""
    results, module = short_run(tmp_path, "performer", "trainer.precision=bf16-mixed",
                                "attention.redraw_interval=2")
    assert results["status"] == "finished" and results["best_val_acc"] >= 0
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    steps = [int(v) for k, v in last.items() if k.endswith("features.steps")]
    assert steps and all(s == 4 for s in steps)  # one count per training step, none in validation


@pytest.mark.slow
def test_compile_option_trains_and_keeps_plain_keys(tmp_path):
    """``compile=true`` (~60 s on 2 cores): the steps run compiled;
    checkpoint and export keys have no ``_orig_mod.``."""
    from safetensors.torch import load_file

    results, module = short_run(tmp_path, "global", "compile=true")
    assert results["status"] == "finished" and module._compiled is not None
    ckpt = torch.load(results["best_ckpt"], map_location="cpu", weights_only=True)
    assert set(ckpt["state_dict"]) == set(module.state_dict()) and not any("_orig_mod" in k for k in ckpt["state_dict"])
    assert not any("_orig_mod" in k for k in load_file(f"{results['export_dir']}/model.safetensors"))


def test_compile_option_is_a_bool(tmp_path):
    from vitzoo.registry import ConfigError

    with pytest.raises(ConfigError, match="^compile must be true or false"):
        short_run(tmp_path, "global", "compile=yes")


# ---------------------------------------------------------------- window: fused SDPA in every block


@pytest.mark.parametrize(
    "grid,shifted",
    [((8, 8), False), ((8, 8), True), ((7, 7), False), ((7, 7), True)],
    ids=["plain", "shifted", "padded", "padded_shifted"],
)
@pytest.mark.parametrize("prefix", [0, 1])
def test_window_blocks_call_fused_sdpa(grid, shifted, prefix, monkeypatch):
    """Where window blocks call SDPA (CUDA, dropout, tracing; on the CPU the window core runs them, made to take
    SDPA here) they give it 4-D q/k/v and mask: in inference it takes a fused CPU kernel, never the math path. (In
    training on CPU the learned bias needs a mask gradient, which only the math kernel gives; on CUDA the
    memory-efficient kernel takes it, also only for 4-D inputs.)"""
    import vitzoo.attention.dense.window as window
    from vitzoo.ops import dispatch

    attn = make_attention("window", grid, prefix, shifted=shifted)
    dims = []
    monkeypatch.setitem(dispatch.TABLE, "window_attention", (("sdpa", lambda *a: True),))

    def recording_sdpa(q, k, v, attn_mask=None, dropout_p=0.0):
        dims.append((q.dim(), k.dim(), v.dim(), attn_mask.dim()))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)

    monkeypatch.setattr(window, "sdpa", recording_sdpa)
    x = torch.randn(2, attn.seq_len(grid), 32, requires_grad=True)
    attn(x, grid).sum().backward()
    with torch.no_grad(), torch.profiler.profile() as prof:
        attn(x, grid)
    assert dims and all(d == (4, 4, 4, 4) for d in dims), dims
    names = {e.name for e in prof.events()}
    assert "aten::scaled_dot_product_attention" in names
    assert "aten::_scaled_dot_product_attention_math" not in names


# ---------------------------------------------------------------- precision table (smoke test, no timing claims)


def test_precision_table_smoke(tmp_path):
    """2 backends x 2 steps of a one-block model: one row per pair, every mode measured, a Markdown table."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    from vitzoo.bench.precision import PrecisionOptions, markdown_table, measure

    opts = PrecisionOptions(
        models=["vit_cifar"],
        attention=["global", "performer"],
        batch=4,
        warmup=1,
        steps=2,
        rounds=1,
        model_options={"depth": 1, "embed_dim": 32, "num_heads": 2},
        compile_backend="eager",
    )
    rows = measure(opts)
    assert [r["attention"] for r in rows] == ["global", "performer"]
    assert all(r["status"] == "ok" and all(r[m] > 0 for m in ("fp32", "bf16-mixed", "compile")) for r in rows)
    table = markdown_table(rows).splitlines()
    assert table[0].startswith("| model | attention | fp32") and len(table) == 4
    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "precision_table.py"),
            "--models",
            "nope",
            "--out",
            str(tmp_path / "t.md"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert bad.returncode == 2 and bad.stdout.count("\n") == 1 and "nope" in bad.stdout


def _routing_rank(rank: int, world: int, port: int, out: str) -> None:
    """One gloo rank: an EMA step on its half of the members (2 routing heads); saves the resulting centroids."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        attn = make_attention("routing", (8, 8), 1, decay=0.5)
        x = torch.nn.functional.normalize(torch.randn(4, 2, 64, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
        part = x.chunk(world)[rank]
        attn.update_centroids(part, part @ attn.centroids.transpose(-2, -1))
        torch.save(attn.centroids, f"{out}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_routing_centroids_all_reduced_across_ranks(tmp_path):
    """2 CPU ranks (gloo), each with half the batch, take the step one process takes on the whole batch."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_routing_rank, args=(2, port, str(tmp_path)), nprocs=2)
    attn = make_attention("routing", (8, 8), 1, decay=0.5)
    x = torch.nn.functional.normalize(torch.randn(4, 2, 64, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    attn.update_centroids(x, x @ attn.centroids.transpose(-2, -1))
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"rank{rank}.pt"), attn.centroids, atol=1e-6, rtol=0)
