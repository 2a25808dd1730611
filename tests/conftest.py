"""Shared helpers: attention backends are exercised through the same host call the blocks use."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import vitzoo.training  # noqa: F401  (registers the optim/benchmark structured configs that train.yaml composes)
from vitzoo.attention import ATTENTION, MixerContext, attention_family, build_attention, list_attention
from vitzoo.configs import CONFIG_DIR, attention_options

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR  # the Hydra configs shipped inside the package (configs/, installed as vitzoo/conf)
CIFAR_ROOT = Path(os.environ.get("VITZOO_CIFAR10", ROOT.parent / "shared" / "data" / "cifar10"))

# torch threads of a test process: at most 2, and at most the cores per pytest-xdist worker (``-n 2`` on 2 cores:
# one each); two workers of two OpenMP threads on 2 cores make every small op wait for a busy core, 10× slower
_CORES_PER_WORKER = (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(max(1, min(2, torch.get_num_threads(), _CORES_PER_WORKER)))


@pytest.fixture(autouse=True)
def _test_matmul_peak(tmp_path_factory, monkeypatch):
    """MFU's matmul peak: a small matmul, cached in the session's temporary folder. A peak measured while
    the suite keeps both cores busy must not land in the user's cache (``~/.cache/vitzoo``)."""
    from vitzoo.flops import mfu

    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path_factory.getbasetemp() / "vitzoo_cache"))
    monkeypatch.setattr(mfu, "PEAK_SIZE", {"cpu": 128, "cuda": 128})


def attention_yaml(name: str) -> dict:
    """The options of ``configs/attention/<name>.yaml`` (what ``attention=<name>`` composes)."""
    return attention_options(name)


class Host(nn.Module):
    """Calls a mixer the way :class:`vitzoo.layers.block.Block` does: ``attn(x, grid)``.

    Args:
        attn: the mixer.
        grid: token grid.
        reference: call ``attn.reference`` instead of ``attn.forward``.
    """

    def __init__(self, attn: nn.Module, grid, reference: bool = False):
        super().__init__()
        self.attn, self.grid, self.reference = attn, tuple(grid), reference

    def forward(self, x):
        return (self.attn.reference if self.reference else self.attn)(x, self.grid)


class RecordShapes(TorchDispatchMode):
    """Records ``(op, shape)`` of every tensor an op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


def token_by_token(shapes, n: int):
    """The recorded tensors with two axes at least ``n // 2`` long (an N×N matrix or a large part of one)."""
    return [(f, s) for f, s in shapes if sum(dim >= n // 2 for dim in s) >= 2]


def require_cpu_kernel(stem: str) -> None:
    """Skip, naming why, where vitzoo's compiled CPU kernel ``csrc/<stem>.cpp`` cannot be built (CI must build
    it: tests/test_cpu_kernels.py fails there instead)."""
    from vitzoo.cpu_kernels import loader
    if loader.extension(stem) is None:
        pytest.skip(f"the {stem} kernel is not built here (no C++ compiler or ninja, or {loader.ENV}=0)")


def use_cpu_kernel(stem: str, kernel: bool, monkeypatch) -> None:
    """Run the compiled kernel ``stem`` (skipped where it cannot be built) or, ``kernel`` False, the PyTorch path."""
    from vitzoo.cpu_kernels import loader
    if kernel:
        require_cpu_kernel(stem)
    else:
        monkeypatch.setenv(loader.ENV, "0")


def make_attention(name: str, grid=(8, 8), num_prefix: int = 1, dim: int = 32, heads: int = 4,
                   shifted: bool = False, **overrides):
    """The backend ``name`` with its YAML options (and ``overrides``), built as a block at ``grid`` would."""
    spec = {**attention_yaml(name), **overrides}
    return build_attention(spec, MixerContext(dim, heads, tuple(grid), num_prefix, window=4, shifted=shifted))


ATTENTION_NAMES = list_attention()
# backends whose blocks differ in Swin's odd (shifted) blocks: they read MixerContext.shifted
SHIFT_AWARE = [n for n in ATTENTION_NAMES if hasattr(make_attention(n, (8, 8), 0), "shift_size")]
# (backend, shifted) pairs: every backend unshifted, the shift-aware ones shifted too
SHIFT_CASES = [(n, False) for n in ATTENTION_NAMES] + [(n, True) for n in SHIFT_AWARE]


def attention_classes() -> dict:
    """Every registered backend's class, by name."""
    return {name: ATTENTION.get(name)[0] for name in ATTENTION_NAMES}


def backends(family: str = "", base: type = object) -> list[str]:
    """Registered backends of a family (the subpackage of ``vitzoo.attention`` they live in) and/or a base class.

    A family's test file uses this instead of a hand-written list, so a backend is covered the
    moment it is registered.
    """
    return [name for name, cls in attention_classes().items()
            if (not family or attention_family(name) == family) and issubclass(cls, base)]


@pytest.fixture(params=ATTENTION_NAMES)
def attention_name(request):
    return request.param


@pytest.fixture(scope="session")
def bf16_native() -> bool:
    """Whether this CPU computes bfloat16 natively (checked once per session; ``VITZOO_TEST_BF16`` forces it):
    bf16 tests scale their sizes down where it is emulated."""
    from helpers import native_bf16

    return native_bf16()


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine it costs a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gen_docs():
    """``scripts/gen_docs.py`` as a module."""
    from helpers import load_file

    return load_file("scripts", "gen_docs")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the checkout's generated text and its table data: README, docs/results.md and results/docs."""
    import shutil

    from vitzoo.bench.results_tables import FOLDER

    (tmp_path / "docs").mkdir()
    for name in ("README.md", "docs/results.md"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / FOLDER, tmp_path / FOLDER)
    return tmp_path
