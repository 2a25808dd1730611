"""Builders shared by the tests: composed Hydra configs, a folder of images in ImageNet layout, the
``train.py`` / ``eval.py`` subprocess runner, a fake clock for the timers, the loader of ``scripts/`` and ``tools/``
files, and the perturbation probe of the attention-pattern oracles (which input token moves which output, per head)."""
from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch
from hydra import compose, initialize_config_dir

from vitzoo.configs import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
# benchmark options that measure once, at tiny sizes
BENCH_TINY = dict(warmup=1, repeats=1, min_time=0.0, max_time=10.0, threads=1, layer_dim=32, layer_heads=2,
                  layer_batch=1, layer_window=4)


def compose_cfg(overrides=(), out_dir=None, config: str = "train", hydra: bool = False):
    """``configs/<config>.yaml`` composed with ``overrides`` (as the command line would).

    Args:
        overrides: command-line style overrides, e.g. ``["attention=window", "+model.depth=1"]``.
        out_dir: the run folder (``paths.output_dir``); None leaves it unset (as composed).
        config: ``train`` or ``eval``.
        hydra: also compose the ``hydra`` node (launcher, sweep and run folders), as a running job has it.
    """
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config, overrides=list(overrides), return_hydra_config=hydra)
    if out_dir is not None:
        cfg.paths.output_dir = str(out_dir)
    return cfg


def run_entry(script: str, *args: str, env: dict | None = None, cwd: Path = ROOT,
              timeout: int = 600) -> subprocess.CompletedProcess:
    """``python <script> <args>`` (``train.py`` or ``eval.py``), output captured as text.

    Args:
        script: ``train.py`` or ``eval.py`` (relative to ``cwd``).
        args: its command-line arguments.
        env: extra environment variables, over the defaults: WANDB offline, one thread and Hydra's one-line
            errors (``HYDRA_FULL_ERROR=0``).
        cwd: folder it runs in (the checkout).
        timeout: seconds before the run is killed.
    """
    full_env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, script, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``); elsewhere
    bf16 matmuls are emulated and several times slower, so the bf16 tests run smaller there. The environment
    variable ``VITZOO_TEST_BF16=native`` or ``=emulated`` decides instead (e.g. to run the emulated sizes here)."""
    forced = os.environ.get("VITZOO_TEST_BF16", "").strip().lower()
    if forced in ("native", "emulated"):
        return forced == "native"
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.partition(":")[2].split()))


class FakeClock:
    """A clock for timer tests: it reads ``now`` and moves only when the test calls :meth:`advance`.

    Args:
        start: the first reading in seconds.
    """

    def __init__(self, start: float = 1000.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file as dicts (header row as keys)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_file(folder: str, name: str) -> ModuleType:
    """``<folder>/<name>.py`` of the checkout (``scripts`` or ``tools``) imported as a module, its folder on the
    import path (the tools import each other by file name)."""
    path = ROOT / folder / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_{folder}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def image_folder(root: Path, classes=("cat", "dog"), per_class: int = 4, size: int = 12, split: str | None = None,
                 colour_steps: tuple[int, int] | None = None) -> Path:
    """``root[/<split>]/<class>/<i>.png`` RGB images (ImageNet layout); returns ``root``.

    Args:
        root: folder to fill (created).
        classes: class folder names.
        per_class: images per class.
        size: image side in pixels.
        split: a ``train`` / ``val`` folder between ``root`` and the class folders; None: none.
        colour_steps: ``(a, b)``: image ``i`` of class ``c`` is the solid colour ``(a·c, b·i, 100)``;
            None: random pixels.
    """
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    base = root / split if split else root
    for c, name in enumerate(classes):
        (base / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            if colour_steps is None:
                image = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            else:
                image = Image.new("RGB", (size, size), (colour_steps[0] * c, colour_steps[1] * i, 100))
            image.save(base / name / f"{i}.png")
    return root


def heads_apart(attn: torch.nn.Module) -> torch.nn.Module:
    """``attn`` with its output projection set to the identity, so that output channels ``h·d .. (h+1)·d`` are head
    ``h``'s attention output (a mixer with ``proj`` after merging ``[B, h, N, d]`` head-major); returns ``attn``."""
    with torch.no_grad():
        attn.proj.weight.copy_(torch.eye(attn.proj.weight.shape[0], dtype=attn.proj.weight.dtype))
        attn.proj.bias.zero_()
    return attn


def reached_keys(fn, x: torch.Tensor, heads: int = 1, tol: float = 1e-12) -> torch.Tensor:
    """Which input tokens move which outputs, found by perturbing one input token at a time.

    Args:
        fn: ``x[B, N, C] -> [B, N, C_out]``, each image on its own (a mixer at a fixed grid); run without gradients.
        x: one input ``[1, N, C]``.
        heads: the output channels are cut into this many equal slices, checked apart (one per head after
            :func:`heads_apart`); 1: the whole output.
        tol: a larger change of an output counts as moved (float64 inputs: far above rounding).

    Returns:
        Booleans ``[heads, N, N]``, (slice, query, key): perturbing token ``key`` changes output ``query`` there.
    """
    N, C = x.shape[1:]
    batch = x.repeat(N + 1, 1, 1)  # image 0: x itself; image 1 + j: token j perturbed
    token = torch.arange(N)
    batch[1 + token, token] += torch.randn(N, C, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = fn(batch)
    change = (out[1:] - out[:1]).abs().unflatten(-1, (heads, -1)).amax(-1)  # [key, query, heads]
    return change.permute(2, 1, 0) > tol


def pattern_mismatch(reached: torch.Tensor, allowed: torch.Tensor) -> str:
    """Empty when ``reached == allowed`` (booleans of one shape); otherwise the first pairs of each kind that differ:
    allowed but not reached (the key does not move the output), reached but not allowed (a leak)."""
    missing, extra = (allowed & ~reached).nonzero().tolist(), (reached & ~allowed).nonzero().tolist()
    if not missing and not extra:
        return ""
    return (f"{len(missing)} allowed pairs do not move the output (first {missing[:4]}), "
            f"{len(extra)} other pairs do (first {extra[:4]})")


def bomb_png(path: Path, side: int = 20000) -> Path:
    """A 1-bit black PNG of ``side`` × ``side`` pixels written chunk by chunk: a few kB on disk, ``side²`` pixels
    when decoded (a decompression bomb); nothing of that size is ever held in memory here."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" * (1 + (side + 7) // 8)  # filter byte + the packed bits of one row
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # width, height, 1 bit, greyscale
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path
