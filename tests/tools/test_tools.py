"""The contributors' tools: the goals table and the A/B timing scripts (tiny sizes)."""
from __future__ import annotations

import subprocess
import sys

from conftest import require_cpu_kernel
from helpers import ROOT, load_file

from vitzoo.bench import (
    BenchOptions,
)


def test_goals_mark_met_and_missed():
    """Fabricated reference and layer rows: each goal's verdict, and the rows that are no goal, exactly."""
    refs = [{"level": "model", "backend": "global", "case": "vit_cifar 32px b64", "train_speed_ratio": 1.25,
             "train_speed_ratio_min": 1.1, "train_speed_ratio_max": 1.3, "infer_speed_ratio": 0.8,
             "infer_speed_ratio_min": 0.7, "infer_speed_ratio_max": 1.05},
            {"level": "layer", "backend": "performer", "fwd_bwd_speed_ratio": 3.0}]
    layers = [{"backend": "global", "tokens": 4096, "status": "ok", "linear_cost": False, "peak_mb": 200.0},
              {"backend": "performer", "tokens": 4096, "status": "ok", "linear_cost": True, "efficiency": 0.9,
               "time_ratio": 5.0, "time_ratio_min": 4.4, "time_ratio_max": 5.3, "flops_ratio": 5.55,
               "ratio_method": "paired", "peak_mb": 150.0},
              {"backend": "linformer", "tokens": 4096, "status": "ok", "linear_cost": True, "efficiency": 0.4,
               "time_ratio": 2.0, "flops_ratio": 5.0, "ratio_method": "paired", "peak_mb": 250.0},
              {"backend": "nystrom", "tokens": 4096, "status": "out of memory during forward+backward",
               "linear_cost": True},
              {"backend": "window", "tokens": 1024, "status": "ok", "linear_cost": True, "efficiency": 0.1},
              {"backend": "window", "tokens": 16384, "status": "ok", "linear_cost": True, "time_ratio": 12.0,
               "ratio_method": "separate processes"}]
    goals = load_file("tools", "goals").goal_rows([], layers, refs, BenchOptions(mode="all"))
    assert [(g["goal"], g["measured"], g["target"], g["status"]) for g in goals] == [
        ("vitzoo vit `global` train speed vs timm VisionTransformer (amp none) (vit_cifar 32px b64)",
         "1.25 (1.10–1.30)", ">= 1.00", "met"),
        ("vitzoo vit `global` infer speed vs timm VisionTransformer (amp none) (vit_cifar 32px b64)",
         "0.80 (0.70–1.05)", ">= 1.00", "missed (within noise: the paired blocks straddle the target)"),
        ("vitzoo swin `window` train speed vs timm SwinTransformer (amp none)", "", ">= 1.00",
         "not measured (needs a swin_* model and the window backend)"),
        ("vitzoo swin `window` infer speed vs timm SwinTransformer (amp none)", "", ">= 1.00",
         "not measured (needs a swin_* model and the window backend)"),
        ("`performer` at 4096 tokens: time ratio / FLOPs ratio over global",
         "0.90 (5.00x of 5.55x, paired 4.40–5.30x)", ">= 0.5", "met"),  # every pair keeps >= 0.79
        ("`performer` at 4096 tokens: speedup over global", "5.00x, paired 4.40–5.30x", ">= 4.5",
         "met (within noise: the paired blocks straddle the target)"),
        ("`linformer` at 4096 tokens: time ratio / FLOPs ratio over global", "0.40 (2.00x of 5.00x, paired)", ">= 0.5",
         "missed"),
        ("`nystrom` at 4096 tokens: time ratio / FLOPs ratio over global", "", ">= 0.5",
         "not measured (out of memory during forward+backward)"),
        ("`performer` at 4096 tokens: peak memory vs global", "150 MB vs 200 MB", "<= global", "met"),
        ("`linformer` at 4096 tokens: peak memory vs global", "250 MB vs 200 MB", "<= global", "missed"),
        ("`nystrom` at 4096 tokens: peak memory vs global", "", "<= global",
         "not measured (global or this backend not measured)"),
        ("`window` at 16384 tokens: speedup over global", "12.00x, separate processes", ">= 10.0", "met")]


def test_ab_kernel_core_compares_a_revision_with_the_working_tree():
    """tools/ab_kernel_core.py runs both versions of the core on the same input (tiny size, two blocks)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "ab_kernel_core.py"),
            "--kind",
            "exp",
            "--tokens",
            "64",
            "--features",
            "16",
            "--rev",
            "HEAD",
            "--blocks",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "max |A - B|: output" in out.stdout and "B faster by" in out.stdout
    bad = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "ab_kernel_core.py"), "--rev", "no-such-revision"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "pass --rev a revision of this repository" in bad.stderr


def test_ab_module_swaps_a_revision_of_a_module_into_its_importers():
    """tools/ab_module.py times a layer with a revision's module in place of the working tree's (tiny size):
    the names other modules imported from it are swapped; a bad module is a one-line error."""
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "ab_module.py"),
        "--rev",
        "HEAD",
        "--attention",
        "bigbird",
        "--tokens",
        "64",
        "--blocks",
        "2",
        "--steps",
        "1",
    ]
    out = subprocess.run(cmd + ["--module", "vitzoo.ops.gather"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "vitzoo.attention.sparse.pattern.block_attention" in out.stdout and "B faster by" in out.stdout
    bad = subprocess.run(cmd + ["--module", "vitzoo.no_such_module"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "pass --rev a revision of this repository and --module" in bad.stderr


def test_ab_cpu_kernel_times_the_kernels_against_the_torch_path():
    """tools/ab_cpu_kernel.py alternates the compiled kernels and the PyTorch path on one layer (tiny size) and
    prints their difference and ratio for training and inference."""
    for stem in ("block_attention", "feature_attention"):
        require_cpu_kernel(stem)
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "ab_cpu_kernel.py"),
        "--attention",
        "local,performer",
        "--tokens",
        "64",
        "--blocks",
        "2",
        "--steps",
        "1",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "kernel faster by" in ln]
    assert [ln.split(",")[0] for ln in lines] == ["local train", "local infer", "performer train", "performer infer"]
    assert all(float(ln.rsplit(" ", 1)[1]) < 1e-4 for ln in lines)  # max |kernel - torch|
