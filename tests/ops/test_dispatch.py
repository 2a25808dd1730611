"""The one dispatch of the fast paths (:mod:`vitzoo.ops.dispatch`): each op's choice for a call, the config's
``impl`` option and the ``VITZOO_CPU_KERNELS`` switch acting through it."""
from __future__ import annotations

import pytest
import torch
from conftest import require_cpu_kernel

from vitzoo.cpu_kernels import loader
from vitzoo.ops import TABLE, implementations, select
from vitzoo.ops.window import INFER_MIN_WINDOW_HEADS
from vitzoo.registry import ConfigError


def test_every_op_ends_with_a_path_that_always_applies():
    """select never runs out of implementations: the last rule of each op holds for any call."""
    assert set(TABLE) == {"window_attention", "sparse_pattern", "block_attention", "halo_scores", "block_function",
                          "feature_attention", "axial_pass", "fused_qkv", "sdpa"}
    for op in TABLE:
        names = implementations(op)
        assert len(names) == len(set(names)) >= 2, op
        assert TABLE[op][-1][1](), op


def test_window_core_by_mode_and_size():
    """The CPU core runs every training call, and inference calls of at least INFER_MIN_WINDOW_HEADS windows ×
    heads; dropout goes to SDPA."""
    qkv = torch.zeros(2, 16, 24)
    with torch.no_grad():
        assert select("window_attention", qkv, 0.0, INFER_MIN_WINDOW_HEADS // 2) == "cpu_core"
        assert select("window_attention", qkv, 0.0, INFER_MIN_WINDOW_HEADS // 2 - 1) == "sdpa"
    training = qkv.requires_grad_()
    assert select("window_attention", training, 0.0, 1) == "cpu_core"
    assert select("window_attention", training, 0.1, INFER_MIN_WINDOW_HEADS) == "sdpa"


def test_sparse_pattern_impl():
    """``attention.impl``: auto picks FlexAttention on CUDA only and never with attention dropout in training;
    blocked and flex are taken as asked, flex where it cannot run is a one-line error naming the option."""
    assert select("sparse_pattern", "auto", "cpu") == "blocked"
    assert select("sparse_pattern", "auto", "cuda") == "flex"
    assert select("sparse_pattern", "auto", "cuda", True, 0.1) == "blocked"  # flex has no dropout
    assert select("sparse_pattern", "blocked", "cuda") == "blocked"
    assert select("sparse_pattern", "flex", "cpu") == "flex"  # forward only
    with pytest.raises(ConfigError, match=r"^attention\.impl=flex has no backward on cpu[^\n]*$"):
        select("sparse_pattern", "flex", "cpu", False, 0.0, True)
    with pytest.raises(ConfigError, match=r"^attention\.impl must be one of auto, blocked, flex \(got 'fused'\)$"):
        select("sparse_pattern", "fused", "cpu")


def test_block_attention_paths():
    """Training on the CPU takes the autograd Function, training with dropout is checkpointed, inference takes
    the compiled kernel where it is built and SDPA otherwise or with dropout."""
    q = torch.zeros(1, 2, 8, 4, requires_grad=True)
    assert select("block_attention", q, q, q, None, None, 0.0) == "autograd_function"
    assert select("block_attention", q, q, q, None, None, 0.1) == "checkpoint"
    with torch.no_grad():
        assert select("block_attention", q, q, q, None, None, 0.1) == "sdpa"
        expected = "cpu_kernel" if loader.extension("block_attention") is not None else "sdpa"
        assert select("block_attention", q, q, q, None, None, 0.0) == expected


def test_halo_scores_paths():
    """The biased halo path recomputes in backward when training without dropout; inference, dropout and tracing
    record the plain ops."""
    q = torch.zeros(1, 2, 8, 4, requires_grad=True)
    assert select("halo_scores", q, q, q, 0.0) == "autograd_function"
    assert select("halo_scores", q, q, q, 0.1) == "plain"
    with torch.no_grad():
        assert select("halo_scores", q, q, q, 0.0) == "plain"
    seen = []

    def probe(x):
        seen.append(select("halo_scores", x, x, x, 0.0))
        return x * 2

    torch.jit.trace(probe, q, check_trace=False)
    assert seen == ["plain"]


@pytest.mark.parametrize("op,args", [
    ("block_attention", lambda t: (t, t, t, None, None, 0.0)),
    ("block_function", lambda t: (t, t, t, None, None)),
    ("feature_attention", lambda t: ("exp", t, torch.zeros(4, 4), None)),
])
def test_cpu_kernel_switch_reaches_every_op(op, args, monkeypatch):
    """``VITZOO_CPU_KERNELS=0`` turns the compiled path off for every op that has one."""
    stem = "feature_attention" if op == "feature_attention" else "block_attention"
    require_cpu_kernel(stem)
    t = torch.zeros(1, 2, 8, 4)
    with torch.no_grad():
        assert select(op, *args(t)) == "cpu_kernel"
        monkeypatch.setenv(loader.ENV, "0")
        assert select(op, *args(t)) != "cpu_kernel"


def test_fused_qkv_keeps_a_plain_forward_under_jit_trace():
    """``torch.jit.trace`` cannot record an autograd Function: the fused paths run their plain forward there."""
    assert select("fused_qkv") == "autograd_function"
    seen = []

    def probe(x):
        seen.append(select("fused_qkv"))
        return x * 2

    torch.jit.trace(probe, torch.zeros(2), check_trace=False)  # one traced call, no eager re-run
    assert seen == ["plain_forward"]
