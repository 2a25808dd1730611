"""MFU (vitzoo.flops.mfu): the dense matmul peak is measured once and cached; utilisation from a rate."""
from __future__ import annotations

import pytest
import torch

from vitzoo.flops import mfu as mfu_module


def test_matmul_peak_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(mfu_module, "_time_matmul", lambda n, dtype, device: calls.append(dtype) or 0.5)
    first = mfu_module.matmul_peak("cpu", "bf16")
    assert first == pytest.approx(128 ** 3 / 0.5) and calls == [torch.bfloat16]
    assert mfu_module.matmul_peak("cpu", "bf16") == first and len(calls) == 1  # cached
    assert mfu_module.cache_file().parent == tmp_path / "cache"
    mfu_module.matmul_peak("cpu", "bf16", refresh=True)
    mfu_module.matmul_peak("cpu", "fp32")
    assert calls == [torch.bfloat16, torch.bfloat16, torch.float32]
    with pytest.raises(ValueError, match="dtype"):
        mfu_module.matmul_peak("cpu", "int8")
    assert [mfu_module.precision_dtype(p) for p in ("32-true", "bf16-mixed", "16-mixed", "none", None, "bf16")] == [
        "fp32", "bf16", "fp16", "fp32", "fp32", "bf16"]
    assert mfu_module.mfu(6e9, 2.0, 1e10) == pytest.approx(0.3) and mfu_module.mfu(6e9, 2.0, None) is None
