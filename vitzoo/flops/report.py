"""The report: analytic MACs per module from a generic walk over ``flops`` / ``flops_children``,
next to fvcore's measurement (and FlopCounterMode's, when asked) of the same modules.

The walk knows no backbone. A module that has ``flops(size)`` gives its own row (the model's
``flops(img_size)``, stages, blocks, attention, patch merging); one that also has
``flops_children(size)`` yields ``(name, child, child_size)`` for the parts that sum to it, each with
what its cost depends on (a token grid, or a token count for token-wise layers). Leaves without
``flops`` (``nn.Linear``, ``nn.LayerNorm``, a conv patch embedding, an ``fc1``/``fc2`` MLP) are
costed by the small rules of :func:`leaf_cost`; any other leaf is an error, never a silent 0.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn

from vitzoo.attention.base import Grid, TokenMixer
from vitzoo.costs import layernorm_flops, linear_flops
from vitzoo.flops.formula import with_symbols
from vitzoo.flops.handles import flop_analysis
from vitzoo.flops.torch_counter import TORCH_COUNTED_OPS, torch_flops
from vitzoo.registry import ConfigError

# --------------------------------------------------------------------------------------------------
# Analytic per-module breakdown
# --------------------------------------------------------------------------------------------------

@dataclass
class ModuleRow:
    """One line of the per-module breakdown.

    Args:
        name: qualified module name (``""`` is the whole model).
        depth: nesting level (0: model, 1: patch embedding / stages / blocks / norm / head, …).
        formula: cost as text with its symbol values.
        analytic: analytic MACs (the module's own ``flops`` or the leaf formula).
        measured: fvcore MACs of the module (filled by :func:`count_flops`).
        torch: FlopCounterMode MACs (FLOPs ÷ 2) when the second tool ran.
        matrix: fvcore MACs of the ops FlopCounterMode counts too (:data:`TORCH_COUNTED_OPS`).
        kind: ``"model"``, ``"attention"``, a leaf rule (``"linear"``, ``"norm"``, ``"mlp"``,
            ``"patch_embed"``) or the module's class name in lower case (``"block"``, …).
    """

    name: str
    depth: int
    formula: str
    analytic: int
    measured: int = 0
    torch: Optional[int] = None
    matrix: int = 0
    kind: str = ""

    @property
    def label(self) -> str:
        return self.name or "(model)"


def leaf_cost(module: nn.Module, size: Any) -> tuple[str, str, dict[str, int], int]:
    """``(kind, formula, symbols, MACs)`` of a module without ``flops``, by a small generic rule.

    Args:
        module: ``nn.Linear``, ``nn.LayerNorm``, an MLP (``fc1``/``fc2`` linears, timm ``Mlp``) or a
            patch embedding (a conv ``proj`` and optional ``norm``, timm ``PatchEmbed``).
        size: token count N for token-wise layers, token grid (H, W) for a patch embedding.

    Raises:
        TypeError: no rule fits (give the module a ``flops`` method).
    """
    if isinstance(module, nn.Linear):
        c, k = module.in_features, module.out_features
        formula, sym = ("CK", dict(C=c, K=k)) if size == 1 else ("NCK", dict(N=size, C=c, K=k))
        return "linear", formula, sym, linear_flops(size, c, k)
    if isinstance(module, nn.LayerNorm):
        c, affine = math.prod(module.normalized_shape), module.elementwise_affine
        return "norm", f"{5 if affine else 4}NC", dict(N=size, C=c), layernorm_flops(size * c, affine)
    if _is_mlp(module) and isinstance(size, int):
        fc1, fc2 = module.fc1, module.fc2
        macs = linear_flops(size, fc1.in_features, fc1.out_features)  # fc1: N·C·D
        macs += linear_flops(size, fc2.in_features, fc2.out_features)  # fc2: N·D·C (the activation is 0)
        return "mlp", "2NCD", dict(N=size, C=fc1.in_features, D=fc1.out_features), macs
    if isinstance(getattr(module, "proj", None), nn.Conv2d) and isinstance(size, tuple):
        return ("patch_embed",) + _patch_embed_cost(module, size)
    raise TypeError(f"no analytic FLOPs rule for {type(module).__name__} at {size!r}: give it a flops() method")


def _is_mlp(module: nn.Module) -> bool:
    """Two linears ``fc1: C -> D`` and ``fc2: D -> C`` (timm ``Mlp``); anything between them costs 0."""
    fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
    if not (isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear)):
        return False
    no_norm = isinstance(getattr(module, "norm", nn.Identity()), nn.Identity)  # timm's hidden norm: Identity
    return no_norm and (fc2.in_features, fc2.out_features) == (fc1.out_features, fc1.in_features)


def _patch_embed_cost(module: nn.Module, grid: Grid) -> tuple[str, dict[str, int], int]:
    """A conv ``proj`` (one output position per token) and an optional LayerNorm ``norm``."""
    conv, hw = module.proj, grid[0] * grid[1]
    sym = dict(H=grid[0], W=grid[1], C=conv.out_channels, c=conv.in_channels // conv.groups, p=conv.kernel_size[0])
    macs = hw * conv.out_channels * sym["c"] * math.prod(conv.kernel_size)  # conv: per token C·c·p²
    norm = getattr(module, "norm", None)
    if not isinstance(norm, nn.LayerNorm):
        return "HW·C·c·p²", sym, macs
    norm_text = f" + {5 if norm.elementwise_affine else 4}HWC"
    return "HW·C·c·p²" + norm_text, sym, macs + layernorm_flops(hw * conv.out_channels, norm.elementwise_affine)


def module_row(module: nn.Module, name: str, size: Any, depth: int) -> ModuleRow:
    """The row of one module: its own ``flops(size)`` when it has one, else :func:`leaf_cost`.

    Args:
        module: the module; name: its qualified name; depth: its nesting level.
        size: what its cost depends on (``img_size`` for the model, a grid or a token count below).
    """
    if not hasattr(module, "flops"):
        kind, formula, sym, macs = leaf_cost(module, size)
        return ModuleRow(name, depth, with_symbols(formula, sym), macs, kind=kind)
    formula = getattr(module, "formula", "") or "Σ children"
    if hasattr(module, "symbols"):
        formula = with_symbols(formula, module.symbols(size))
    kind = "attention" if isinstance(module, TokenMixer) else ("model" if depth == 0 else type(module).__name__.lower())
    return ModuleRow(name, depth, formula, module.flops(size), kind=kind)


def walk_rows(module: nn.Module, name: str, size: Any, depth: int = 0) -> Iterator[ModuleRow]:
    """``module``'s row, then (depth first) the rows of the children its ``flops_children(size)`` yields.

    Args:
        module: where to start; name: its qualified name (``""`` for the model); size: as in
            :func:`module_row`; depth: its nesting level.
    """
    yield module_row(module, name, size, depth)
    children = getattr(module, "flops_children", None)
    for child, sub, sub_size in (children(size) if children else ()):
        yield from walk_rows(sub, f"{name}.{child}" if name else child, sub_size, depth + 1)


def analytic_rows(model: nn.Module, img_size: int) -> list[ModuleRow]:
    """Analytic MACs per module for one ``img_size``² image: the model's ``flops(img_size)``, then
    every module its ``flops_children`` reach (patch embedding, stages, blocks, norms, attention,
    MLP, patch merging, head). Parents give their own ``flops``; leaves the rules of :func:`leaf_cost`,
    so that "children sum to their parent" checks the two against each other.

    Args:
        model: any module with ``flops(img_size)`` (and ``flops_children`` for a breakdown).
        img_size: input side in pixels.
    """
    return list(walk_rows(model, "", img_size))


def children_of(rows: Sequence[ModuleRow], parent: ModuleRow) -> list[ModuleRow]:
    """The rows one level below ``parent`` whose names start with it."""
    prefix = f"{parent.name}." if parent.name else ""
    return [r for r in rows if r.depth == parent.depth + 1 and r.name.startswith(prefix)]


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------

@dataclass
class FlopReport:
    """Measured (fvcore) and analytic MACs for one image, total, per module and per attention layer.

    ``measured``/``analytic``/``params``/``attention``/``rows()`` are what the trainer logs;
    ``modules`` is the full breakdown; ``torch``/``matrix`` the second tool's count (when asked)
    next to fvcore's count of the same ops.
    """

    measured: int
    analytic: int
    params: int
    attention: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # name -> (formula, analytic, measured)
    unsupported: dict[str, int] = field(default_factory=dict)
    modules: list[ModuleRow] = field(default_factory=list)
    by_operator: dict[str, int] = field(default_factory=dict)
    torch: Optional[int] = None  # FlopCounterMode, MACs (FLOPs ÷ 2), CPU SDPA formula registered
    matrix: int = 0  # fvcore MACs of the ops FlopCounterMode counts (TORCH_COUNTED_OPS): compare with `torch`
    img_size: int = 0

    def rows(self) -> Iterator[tuple[str, str, int, int]]:
        yield "model", "", self.analytic, self.measured
        for name, (formula, a, m) in self.attention.items():
            yield name, formula, a, m

    @property
    def norms(self) -> int:
        """fvcore MACs of norms (not counted by FlopCounterMode)."""
        return sum(v for k, v in self.by_operator.items() if k.endswith("norm"))


def attention_layers(model: nn.Module) -> Iterator[tuple[str, TokenMixer]]:
    for name, module in model.named_modules():
        if isinstance(module, TokenMixer):
            yield name, module


def model_input(model: nn.Module, img_size: Optional[int] = None, in_chans: Optional[int] = None) -> Tensor:
    """A random image batch of 1 at ``img_size`` (a :class:`ConfigError` if the patch size does not divide it).

    Random rather than zeros, from a fixed seed: the count of a data-dependent backend (``routing``'s span) is
    then that of a varied input, not of one where every token is the same.
    """
    cfg = model.cfg
    s = img_size or cfg.img_size
    if s % cfg.patch_size:
        raise ConfigError(f"img_size={s} is not a multiple of model.patch_size ({cfg.patch_size}); "
                          f"the patch embedding would silently crop the image")
    x = torch.randn(1, in_chans or cfg.in_chans, s, s, generator=torch.Generator().manual_seed(0))
    return x.to(next(model.parameters()).device)


def count_flops(model: nn.Module, img_size: Optional[int] = None, in_chans: Optional[int] = None,
                second_tool: bool = False) -> FlopReport:
    """Measure a model with fvcore (batch 1, eval mode) and put its analytic ``flops`` beside it.

    Args:
        model: a vitzoo backbone (has ``cfg`` and ``flops(img_size)``).
        img_size: input side in pixels (default: the model's).
        in_chans: input channels (default: the model's).
        second_tool: also count with ``torch.utils.flop_counter.FlopCounterMode`` (another forward).

    Raises:
        ConfigError: the model cannot run at ``img_size`` (patch size, fixed-length attention).
        UnsupportedOpError: an op that does matrix work has no fvcore handle.
    """
    x = model_input(model, img_size, in_chans)
    s = x.shape[-1]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            analysis = flop_analysis(model, (x,))
            by_module = analysis.by_module()
            by_mod_op = analysis.by_module_and_operator()
            total = analysis.total()
        unsupported = dict(analysis.unsupported_ops())
        second = torch_flops(model, (x,)) if second_tool else None
    finally:
        model.train(was_training)
    report = FlopReport(measured=int(total), analytic=model.flops(s), params=sum(p.numel() for p in model.parameters()),
                        unsupported=unsupported, by_operator={k: int(v) for k, v in by_mod_op.get("", {}).items()},
                        img_size=s)
    report.matrix = sum(int(v) for k, v in by_mod_op.get("", {}).items() if k in TORCH_COUNTED_OPS)
    report.torch = second.total if second is not None else None
    for row in analytic_rows(model, s):
        row.measured = int(by_module.get(row.name, 0))
        row.matrix = sum(int(v) for k, v in by_mod_op.get(row.name, {}).items() if k in TORCH_COUNTED_OPS)
        if second is not None:
            row.torch = second.by_module.get(row.name, 0)
        report.modules.append(row)
        if row.kind == "attention":
            layer = model.get_submodule(row.name)
            report.attention[row.name] = (layer.formula, row.analytic, row.measured)
    return report


# --------------------------------------------------------------------------------------------------
# One attention layer on its own (scaling reports, tests)
# --------------------------------------------------------------------------------------------------

class MixerHost(nn.Module):
    """Calls a mixer as :class:`vitzoo.layers.block.Block` does: ``attn(x, grid)``.

    Args:
        attn: the token mixer.
        grid: token grid (H, W).
    """

    def __init__(self, attn: TokenMixer, grid: Grid):
        super().__init__()
        self.attn, self.grid = attn, tuple(grid)

    def forward(self, x: Tensor) -> Tensor:
        return self.attn(x, self.grid)


def mixer_flops(attn: TokenMixer, grid: Grid, second_tool: bool = False) -> tuple[int, int, Optional[int]]:
    """``(analytic, fvcore-measured, FlopCounterMode or None)`` MACs of one mixer at ``grid``, one image."""
    host = MixerHost(attn, grid).eval()
    x = torch.randn(1, attn.seq_len(grid), attn.dim, generator=torch.Generator().manual_seed(0))  # see model_input
    with torch.no_grad():
        measured = int(flop_analysis(host, (x,)).by_module()["attn"])
    second = torch_flops(host, (x,)).by_module.get("attn", 0) if second_tool else None
    return attn.flops(grid), measured, second
