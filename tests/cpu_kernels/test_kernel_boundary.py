"""The compiled kernels' boundary (vitzoo/cpu_kernels/csrc/*.cpp): a bad call is a Python error naming the
argument, never a crash or an out-of-bounds read; NaN in and NaN out, as on the PyTorch path; the build announces
itself in one line, names the real cause when it fails, and fails outright with ``CI=true``."""

from __future__ import annotations

import pytest
import torch
from conftest import require_cpu_kernel

from vitzoo.cpu_kernels import block_kernel, feature_kernel, loader
from vitzoo.cpu_kernels.__main__ import main


def _block_args():
    """Valid ``block_forward`` arguments: B=1, c=2, L=10, d=4, n=2 blocks of S=3 queries, K=4 keys, no globals."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 4) for _ in range(3))
    glob = torch.zeros(1, 2, 0, 4)
    q_ids = torch.arange(6).view(2, 3)
    k_ids = torch.randint(0, 10, (1, 2, 4))
    keep = block_kernel.keep_layout(torch.ones(2, 1, 4, dtype=torch.bool), 3)
    return dict(q=q, k=k, v=v, k_glob=glob, v_glob=glob.clone(), q_ids=q_ids, k_ids=k_ids, keep=keep, scale=0.5)


def _call_block(**args):
    a = {**_block_args(), **args}
    return block_kernel.forward(a["q"], a["k"], a["v"], a["k_glob"], a["v_glob"], a["q_ids"], a["k_ids"], a["keep"],
                                a["scale"])


BAD_BLOCK = {
    "k_ids": dict(k_ids=torch.full((1, 2, 4), 10)),  # = L
    "k_ids ": dict(k_ids=torch.full((1, 2, 4), -1)),
    "k_ids  ": dict(k_ids=torch.full((1, 2, 4), 10**9)),
    "q_ids": dict(q_ids=torch.full((2, 3), 10**9)),
    "k_ids   ": dict(k_ids=torch.zeros(3, 2, 4, dtype=torch.long)),  # 3 id heads for c = 2
    "v": dict(v=torch.randn(1, 2, 9, 4)),
    "k": dict(k=torch.randn(1, 3, 10, 4)),
    "q_ids  ": dict(q_ids=torch.arange(6, dtype=torch.int32).view(2, 3)),
    "k_glob": dict(k_glob=torch.zeros(1, 2, 0, 4, dtype=torch.float64)),
    "q ": dict(q=torch.randn(1, 2, 4, 10).transpose(2, 3)),
    "keep": dict(keep=torch.ones(3, 2, 4, 16, dtype=torch.uint8)),
}


@pytest.mark.parametrize("case", BAD_BLOCK, ids=[c.strip() + str(i) for i, c in enumerate(BAD_BLOCK)])
def test_block_kernel_rejects_bad_arguments_naming_them(case):
    require_cpu_kernel(block_kernel.STEM)
    with pytest.raises(RuntimeError, match=rf"block_attention kernel: {case.strip()}\b"):
        _call_block(**BAD_BLOCK[case])


def test_block_backward_checks_grad_lse_and_rows():
    require_cpu_kernel(block_kernel.STEM)
    a = _block_args()
    out, lse = _call_block()
    grad = torch.randn(1, 2, 10, 4)
    common = [a[n] for n in ("q", "k", "v", "k_glob", "v_glob", "q_ids", "k_ids", "keep", "scale")]
    assert all(t.isfinite().all() for t in block_kernel.backward(*common, lse, grad, None))
    bad_calls = [((lse, torch.randn(1, 2, 10, 5), None), "grad"), ((lse[..., :2].contiguous(), grad, None), "lse"),
                 ((lse, grad, torch.full((6,), 10)), "rows"), ((lse, grad, torch.zeros(5, dtype=torch.long)), "rows"),
                 ((lse, grad[:, :, :4], None), "grad")]
    for bad, name in bad_calls:
        with pytest.raises(RuntimeError, match=rf"block_attention kernel: {name}\b"):
            block_kernel.backward(*common, *bad)


def _feature_args(kind="exp"):
    torch.manual_seed(0)
    qkv = torch.randn(1, 9, 3 * 2 * 4)
    omega = torch.randn(2, 5, 4) if kind == "fourier" else torch.randn(6, 4)
    scale = torch.ones(2, 1, 4) if kind == "fourier" else None
    return qkv, omega, scale


@pytest.mark.parametrize("kind", ["exp", "fourier"])
def test_feature_kernel_rejects_bad_arguments_naming_them(kind):
    require_cpu_kernel(feature_kernel.STEM)
    qkv, omega, scale = _feature_args(kind)
    ext = loader.extension(feature_kernel.STEM)
    fourier = kind == "fourier"
    empty = qkv.new_empty(0)
    with pytest.raises(RuntimeError, match="feature attention kernel: omega"):
        ext.feature_forward(qkv, omega[..., :3].contiguous(), scale if fourier else empty, 2, 1e-6, 1.0, fourier)
    with pytest.raises(RuntimeError, match="feature attention kernel: qkv"):
        ext.feature_forward(qkv[..., :-1].contiguous(), omega, scale if fourier else empty, 2, 1e-6, 1.0, fourier)
    out, kvz, sq, sk, den = feature_kernel.forward(kind, qkv, 2, omega, scale, 1e-6, 1.0)
    saved = (kvz, sq, sk, den)
    assert feature_kernel.backward(kind, qkv, 2, omega, scale, 1e-6, 1.0, saved, torch.ones_like(out), None)[0] \
        .isfinite().all()
    for i, name in enumerate(["kvz", "shift_q", "shift_k", "den"]):
        if saved[i] is None:
            continue
        bad = list(saved)
        bad[i] = saved[i][:, :, :-1]
        with pytest.raises(RuntimeError, match=f"feature attention kernel: {name}"):
            feature_kernel.backward(kind, qkv, 2, omega, scale, 1e-6, 1.0, bad, torch.ones_like(out), None)
    with pytest.raises(RuntimeError, match="feature attention kernel: grad"):
        feature_kernel.backward(kind, qkv, 2, omega, scale, 1e-6, 1.0, saved, torch.ones(1, 8, 8), None)


def test_block_kernel_keeps_nan():
    """A NaN query row gives a NaN output row (not the mean of its values); a NaN kept key makes its block's
    rows NaN; the rest stay finite."""
    require_cpu_kernel(block_kernel.STEM)
    for dtype in (torch.float32, torch.float64):
        a = {n: (t.to(dtype) if t.is_floating_point() else t) for n, t in _block_args().items() if n != "scale"}
        a["q"][0, 0, 1, 0] = float("nan")
        out, lse = _call_block(**a)  # out [B, c, n, S, d]
        assert out[0, 0, 0, 1].isnan().all() and lse[0, 0, 0, 1].isnan()
        nan_rows = out.isnan().any(-1)
        assert int(nan_rows.sum()) == 1 and out[0, 1].isfinite().all()


@pytest.mark.parametrize("kind", ["exp", "fourier"])
def test_feature_kernel_keeps_nan(kind, monkeypatch):
    """A NaN in one query gives that row NaN on the kernel and the PyTorch path alike; the others are finite."""
    require_cpu_kernel(feature_kernel.STEM)
    from vitzoo.ops import feature as feature_core
    qkv, omega, scale = _feature_args(kind)
    qkv[0, 3, 0] = float("nan")  # query 3, head 0
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv(loader.ENV, env)
        outs.append(feature_core.feature_attention_qkv(kind, qkv, 2, omega, scale, 1e-6, 1.0))
    for out in outs:
        assert out[0, 3, :4].isnan().all()
    assert torch.equal(outs[0].isnan(), outs[1].isnan())


def test_build_cause_is_the_compiler_error_not_the_command():
    err = RuntimeError("Error building extension 'vitzoo_x': [1/2] c++ -MMD -O3 -c x.cpp -o x.o\n"
                       "FAILED: x.o\nc++ -MMD -O3 -c x.cpp\nx.cpp:3:10: fatal error: torch/extension.h: No such file\n"
                       "compilation terminated.\nninja: build stopped: subcommand failed.")
    assert loader.cause(err) == "RuntimeError: x.cpp:3:10: fatal error: torch/extension.h: No such file"
    assert loader.cause(RuntimeError("Ninja is required to load C++ extensions")) == \
        "RuntimeError: Ninja is required to load C++ extensions"


def test_failed_build_raises_in_ci(monkeypatch):
    def broken(name):
        raise RuntimeError("Error building extension 'x': c++ -O3\nx.cpp:1:1: error: expected ';'")

    monkeypatch.setattr(loader, "_state", {})
    monkeypatch.setattr(loader, "_build", broken)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match=r"could not be built \(RuntimeError: x.cpp:1:1: error: expected ';'\).*CI"):
        loader.extension(block_kernel.STEM)
    assert main(["build"]) == 1


def test_first_build_is_announced_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty cache: a build would start
    loader._announce(block_kernel.STEM)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "python -m vitzoo.cpu_kernels build" in lines[0] and "block attention" in lines[0]
