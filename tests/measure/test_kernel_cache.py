"""The kernel caches of a training step (vitzoo.measure.kernel_cache): its distinct matmul and convolution calls,
replayed in a fresh process, and the per-machine cache of the answer."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from vitzoo.measure import kernel_cache as kc


def _linear_step(lin: nn.Linear, rows: int, amp: bool) -> kc.KernelShapes:
    shapes = kc.KernelShapes()
    with shapes:
        for _ in range(2):  # the same call twice is one kernel
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                y = lin(torch.randn(rows, lin.in_features, requires_grad=True))
            y.float().sum().backward()
    return shapes


def test_a_linear_layer_step_is_three_distinct_matmuls_in_either_precision():
    lin = nn.Linear(48, 80)
    for amp, dtype in ((False, "float32"), (True, "bfloat16")):
        calls = _linear_step(lin, 32, amp).calls
        # forward addmm, backward mm for the input's gradient and mm for the weight's
        assert sorted(name for name, _, _ in calls) == ["aten::addmm", "aten::mm", "aten::mm"]
        shapes = {tuple(arg["t"][0]) for _, args, _ in calls for arg in args if isinstance(arg, dict)}
        assert shapes >= {(32, 48), (48, 80), (32, 80), (80, 32)}  # input, weight.T, grad out, grad out.T
        assert all(arg["t"][2] == dtype for _, args, _ in calls for arg in args if isinstance(arg, dict))
    assert len(_linear_step(lin, 64, True).calls) == 3  # another batch: other shapes, as many kernels


def test_convolutions_are_recorded_with_their_arguments():
    conv = nn.Conv2d(3, 8, 2, 2)
    shapes = kc.KernelShapes()
    with shapes:
        conv(torch.randn(1, 3, 8, 8)).sum().backward()
    names = sorted(name for name, _, _ in shapes.calls)
    assert names == ["aten::convolution", "aten::convolution_backward"]
    forward = next(args for name, args, _ in shapes.calls if name == "aten::convolution")
    assert forward[3:] == [[2, 2], [0, 0], [1, 1], False, [0, 0], 1]  # stride, padding, dilation, ..., groups


def test_replay_runs_every_recorded_call():
    calls = _linear_step(nn.Linear(24, 40), 16, True).calls
    conv = kc.KernelShapes()
    with conv:
        nn.Conv2d(3, 4, 2, 2)(torch.randn(1, 3, 4, 4, requires_grad=True)).sum().backward()
    assert kc.replay_mb(calls + conv.calls) >= 0.0  # raises where an op or its arguments cannot be rebuilt


def test_the_measured_size_is_kept_per_machine_threads_torch_and_shape_set(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path))
    assert kc.kernel_cache_mb([]) == 0.0
    calls = _linear_step(nn.Linear(24, 40), 16, True).calls
    first = kc.kernel_cache_mb(calls, threads=1)
    if first is None:
        pytest.skip("kernel cache sizes are measured on Linux with glibc only")
    stored = json.loads((tmp_path / "kernel_cache.json").read_text())
    assert list(stored.values()) == [first] and "| 1 threads | torch " in next(iter(stored))
    monkeypatch.setattr(kc.subprocess, "run", lambda *a, **k: pytest.fail("measured again"))
    assert kc.kernel_cache_mb(calls, threads=1) == first  # read back, no second replay
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        kc.kernel_cache_mb(calls[:1], threads=1)  # another shape set is measured


def test_attentions_cpu_flash_kernel_is_recorded_and_replayed():
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    shapes = kc.KernelShapes()
    with shapes, torch.autocast("cpu", dtype=torch.bfloat16):
        nn.functional.scaled_dot_product_attention(q, q, q).float().sum().backward()
    names = [name for name, _, _ in shapes.calls]
    assert names == ["aten::_scaled_dot_product_flash_attention_for_cpu",
                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert kc.replay_mb(shapes.calls) >= 0.0
