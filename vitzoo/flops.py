"""FLOPs you can trust: fvcore-measured multiply-adds next to each module's analytic ``flops``.

Conventions (one place): counts are multiply-adds (MACs), as fvcore, the Swin paper and timm's
"GMACs" report them: a fused multiply-add is 1. Softmax, scaling, bias/mask adds, activations,
reductions and pooling count 0. An affine LayerNorm counts 5 per element (fvcore's rule), so that
whole-model analytic and measured totals agree.

fvcore counts ``aten::scaled_dot_product_attention`` as 0 (it only warns); vitzoo registers a
handle that counts ``QKᵀ`` and ``AV``: ``B·h·Nq·Nk·(d + dv)``.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from fvcore.nn import FlopCountAnalysis
from fvcore.nn.jit_handles import get_shape
from torch import nn

from vitzoo.attention.base import TokenMixer

# ops fvcore may meet in vitzoo models that do no matrix work worth counting (elementwise, shape ops)
IGNORED_OPS = (
    "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::sub", "aten::rsub", "aten::neg",
    "aten::softmax", "aten::gelu", "aten::elu", "aten::exp", "aten::log", "aten::sqrt", "aten::rsqrt",
    "aten::mean", "aten::sum", "aten::pad", "aten::constant_pad_nd", "aten::roll", "aten::masked_fill",
    "aten::dropout", "aten::feature_dropout", "aten::relu", "aten::sigmoid", "aten::tanh", "aten::pow",
    "aten::max", "aten::amax", "aten::sin", "aten::cos", "aten::abs", "aten::clamp", "aten::clamp_min",
    "aten::square", "aten::reciprocal", "aten::repeat", "aten::expand_as", "aten::linalg_vector_norm",
    "aten::norm", "aten::log_softmax", "aten::logsumexp", "aten::cumsum", "aten::sort", "aten::argsort",
    "aten::argmax", "aten::topk", "aten::gather", "aten::scatter", "aten::scatter_add", "aten::index_add",
    "aten::eq", "aten::ne", "aten::lt", "aten::gt", "aten::le", "aten::ge", "aten::where", "aten::fill_",
    "aten::zero_", "aten::floor_divide", "aten::remainder", "aten::bitwise_not", "aten::__and__", "aten::__or__",
    "aten::silu", "aten::sign", "aten::one_hot", "aten::eye", "aten::__iand__", "aten::__ior__",
)


def sdpa_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``scaled_dot_product_attention(q[..., L, E], k[..., S, E], v[..., S, Ev])``."""
    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = 1
    for s in q[:-2]:
        batch *= s
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


HANDLES = {"aten::scaled_dot_product_attention": sdpa_flop_jit}


def all_handles() -> dict[str, Any]:
    """vitzoo's handles plus those declared by backends (``TokenMixer.flop_handles``)."""
    from vitzoo.attention import ATTENTION, list_attention

    handles = dict(HANDLES)
    for name in list_attention():
        handles.update(ATTENTION.get(name)[0].flop_handles)
    return handles


def flop_analysis(model: nn.Module, inputs: tuple) -> FlopCountAnalysis:
    """fvcore's analysis with vitzoo's handles; quiet about ops in :data:`IGNORED_OPS`."""
    analysis = FlopCountAnalysis(model, inputs)
    analysis.set_op_handle(**{op: None for op in IGNORED_OPS})
    analysis.set_op_handle(**all_handles())
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    return analysis


@dataclass
class FlopReport:
    """Measured (fvcore) and analytic MACs for one image, total and per attention layer."""

    measured: int
    analytic: int
    params: int
    attention: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # name -> (formula, analytic, measured)
    unsupported: dict[str, int] = field(default_factory=dict)

    def rows(self) -> Iterator[tuple[str, str, int, int]]:
        yield "model", "", self.analytic, self.measured
        for name, (formula, a, m) in self.attention.items():
            yield name, formula, a, m


def attention_layers(model: nn.Module) -> Iterator[tuple[str, TokenMixer]]:
    for name, module in model.named_modules():
        if isinstance(module, TokenMixer):
            yield name, module


def count_flops(model: nn.Module, img_size: Optional[int] = None, in_chans: Optional[int] = None) -> FlopReport:
    """Measure a model with fvcore (batch 1, eval mode) and put its analytic ``flops`` beside it.

    Args:
        model: a vitzoo backbone (has ``cfg`` and ``flops(img_size)``).
        img_size: input side in pixels (default: the model's).
        in_chans: input channels (default: the model's).
    """
    cfg = model.cfg
    s = img_size or cfg.img_size
    x = torch.zeros(1, in_chans or cfg.in_chans, s, s, device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            analysis = flop_analysis(model, (x,))
            by_module = analysis.by_module()
            total = analysis.total()
        unsupported = dict(analysis.unsupported_ops())
    finally:
        model.train(was_training)
    report = FlopReport(measured=total, analytic=model.flops(s), params=sum(p.numel() for p in model.parameters()),
                        unsupported=unsupported)
    for name, layer in attention_layers(model):
        grid = _layer_grid(model, layer, s)
        report.attention[name] = (layer.formula, layer.flops(grid), by_module.get(name, 0))
    return report


def _layer_grid(model: nn.Module, layer: TokenMixer, img_size: int) -> tuple[int, int]:
    """The token grid a layer runs at for input side ``img_size`` (scales its construction grid)."""
    scale = img_size / model.cfg.img_size
    return tuple(int(g * scale) for g in layer.grid)
