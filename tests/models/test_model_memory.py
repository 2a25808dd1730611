"""``model.memory(batch, amp, grid)`` of ViT and Swin against the bytes autograd saves in a whole training forward.

Generated from the registries: vit_cifar and swin_cifar, shrunk (two blocks, 32 channels), with every attention
backend at 8x8, 16x16 and 32x32 tokens (Swin: its first stage's grid), in fp32 and under bf16 autocast, run
image to logits inside :class:`~vitzoo.measure.activations.SavedTensorCounter`; the analytic bytes must equal the
counted activation bytes. A backend (or token reduction) without its own formula is skipped by name until it has
one; the model parts around it (stems, norms, MLPs, drop-path, pooling, head) are checked with ``global``.
"""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import ATTENTION_NAMES, attention_yaml

import vitzoo
from vitzoo.costs import saved_bytes
from vitzoo.layers.token_reduction import REDUCTIONS
from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.registry import ConfigError

GRIDS = [(8, 8), (16, 16), (32, 32)]  # tokens per side of the (first) grid
AMPS = [None, torch.bfloat16]
BATCH = 2
SMALL = {  # model options on top of the variant: two blocks (an unshifted and a shifted one), 32 channels
    "vit_cifar": dict(depth=2, embed_dim=32, num_heads=4, patch_size=4),
    "swin_cifar": dict(depths=[2, 1], num_heads=[2, 4], embed_dim=32, patch_size=2),
}


@functools.lru_cache(maxsize=None)
def build(name: str, attention: str, grid: tuple[int, int], options: tuple = ()) -> torch.nn.Module:
    """The shrunk model ``name`` with ``attention`` (its YAML options) for images of ``grid`` tokens, in training
    mode; skips, naming why, where the backend does not build in it.

    Args:
        name: model variant; attention: backend; grid: token grid; options: extra model options as pairs.
    """
    small = {**SMALL[name], **dict(options)}
    try:
        model = vitzoo.create_model(name, attention=attention_yaml(attention), img_size=grid[0] * small["patch_size"],
                                    **small)
    except ConfigError as e:
        pytest.skip(f"{attention} does not build in {name}: {e}")
    return model.train()


def require_formula(model: torch.nn.Module, what: str) -> None:
    """Skip, naming ``what``, while a mixer or token reduction of ``model`` has no memory formula."""
    try:
        model.memory(BATCH)
    except NotImplementedError as e:
        pytest.skip(f"{what} has no memory() formula yet ({e or 'TokenMixer.memory'})")


def counted(model: torch.nn.Module, grid: tuple[int, int], amp, outside: str = "") -> tuple[int, str]:
    """Activation bytes one training forward of ``model`` on ``BATCH`` images keeps, and the counter's table.

    Args:
        model: the model; grid: token grid of its input; amp: autocast dtype or ``None``.
        outside: leave out storages first saved inside modules with this name part (``"attn"``: the mixers).
    """
    torch.manual_seed(0)
    p = model.cfg.patch_size
    x = torch.randn(BATCH, model.cfg.in_chans, grid[0] * p, grid[1] * p)  # [B, 3, H, W]
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        with SavedTensorCounter(model) as counter:
            logits = model(x)
    # read once the counter closed (its freed marks set), the logits still alive
    total = sum(r.nbytes for r in counter.records if r.kind == "activation" and not r.freed
                and outside not in (r.module.split(".") if outside else ()))
    table = counter.table()
    del logits
    return total, table


def predicted(model: torch.nn.Module, grid: tuple[int, int], amp, outside: str = "") -> int:
    """``model.memory()`` bytes at ``grid``, without the entries of modules with the name part ``outside``."""
    items = model.memory(BATCH, amp, grid=grid)
    return saved_bytes(s for s in items if not outside or outside not in s.name.split(": ")[0].split("."))


def check(model: torch.nn.Module, grid: tuple[int, int], amp, outside: str = "") -> None:
    measured, table = counted(model, grid, amp, outside)
    formula = predicted(model, grid, amp, outside)
    # Swin under CPU autocast: the patch norm keeps the convolution's bf16, so its mixers get a bf16 input
    note = " (Swin's mixers get a bf16 input under autocast)" if model.family == "swin" and amp is not None else ""
    assert formula == measured, f"memory() {formula} B, counted {measured} B{note}\n{table}"


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("attention", ATTENTION_NAMES)
@pytest.mark.parametrize("name", list(SMALL))
def test_model_memory_equals_saved_activation_bytes(name, attention, grid, amp, one_thread):
    model = build(name, attention, grid)
    require_formula(model, f"backend {attention}")
    check(model, grid, amp)


VARIANTS = [  # the stems, pools, position embeddings, checkpointing and odd merge grids around the global mixer
    ("vit_cifar", "global", (("stem", "conv"), ("stem_full_res_convs", 1))),
    ("vit_cifar", "global", (("class_token", False), ("global_pool", "avg"), ("pos_embed", "sincos"))),
    ("vit_cifar", "global", (("grad_checkpointing", True),)),
    ("swin_cifar", "window", (("grad_checkpointing", True),)),
    ("swin_cifar", "global", (("depths", (1, 1, 1)), ("num_heads", (2, 4, 8)))),  # 16 -> 8 -> 4 tokens per side
]


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,attention,options", VARIANTS, ids=lambda v: str(v) if isinstance(v, str) else None)
def test_model_variants_memory(name, attention, options, amp, one_thread):
    model = build(name, attention, (16, 16), options)
    check(model, (16, 16), amp)


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
def test_swin_odd_grid_pads_the_merge(amp, one_thread):
    # 14 -> 7 -> 4 tokens per side: the second merge pads the 7x7 grid to 8x8
    model = build("swin_cifar", "global", (14, 14), (("depths", (1, 1, 1)), ("num_heads", (2, 4, 8))))
    check(model, (14, 14), amp)


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,options", [
    ("vit_cifar", (("drop_rate", 0.1), ("stem", "conv"))),
    ("vit_cifar", (("drop_rate", 0.1), ("global_pool", "avg"))),
    ("swin_cifar", (("drop_rate", 0.1),)),
], ids=["vit-conv", "vit-avg", "swin"])
def test_dropout_masks_outside_the_mixers(name, options, amp, one_thread):
    """Dropout in the MLPs, after the position embedding and before the head (the mixers' own dropout is theirs)."""
    model = build(name, "global", (8, 8), options)
    check(model, (8, 8), amp, outside="attn")


def test_memory_is_per_image_in_fp32_and_adds_weight_copies_under_autocast():
    model = build("vit_cifar", "global", (8, 8))
    one, two = (saved_bytes(model.memory(b)) for b in (1, 2))
    assert two == 2 * one  # fp32 keeps nothing per step that is not per image
    assert not [s for s in model.memory(1) if "autocast copy" in s.name]
    assert [s for s in model.memory(1, torch.bfloat16) if "autocast copy" in s.name]


REDUCING_BLOCK_0 = {"evit": {"locations": [0]}}  # options that put a reduction in the first of the two blocks


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("reduction", REDUCTIONS.names())
def test_token_reduction_memory(reduction, amp, one_thread):
    spec = {"name": reduction, **REDUCING_BLOCK_0.get(reduction, {})}
    model = vitzoo.create_model("vit_cifar", attention="global", token_reduction=spec, **SMALL["vit_cifar"]).train()
    assert any(blk.reducer is not None for blk in model.blocks)
    require_formula(model, f"token reduction {reduction}")
    check(model, (8, 8), amp)


@pytest.mark.parametrize("amp", AMPS, ids=["fp32", "bf16"])
@pytest.mark.parametrize("pos_embed", ["learned", "sincos"])
def test_another_grid_than_the_built_one(pos_embed, amp, one_thread):
    """Learned position embeddings are resampled to the grid (keeping nothing), sin-cos ones rebuilt."""
    model = build("vit_cifar", "global", (8, 8), (("pos_embed", pos_embed),))
    check(model, (16, 16), amp)
