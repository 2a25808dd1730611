"""FLOPs you can trust: fvcore-measured multiply-adds next to each module's analytic ``flops``.

Conventions (stated once, here and in ``docs/flops.md``)
--------------------------------------------------------
* **Unit: multiply-adds (MACs)** for ONE image (batch 1, eval mode). A fused multiply-add counts 1.
  This is what fvcore, the ViT/DeiT/Swin papers and timm's "GMACs" report as "FLOPs";
  ``torch.utils.flop_counter`` counts 2 FLOPs per MAC (see :func:`torch_flops`, which halves it).
* **Counted** (matrix work): ``nn.Linear``/``aten::linear``, ``addmm``/``mm``/``bmm``/``baddbmm``/
  ``addbmm``/``mv``/``addmv``/``dot``, ``matmul``/``@`` (any broadcast: output elements × the
  contracted length), ``einsum`` (the pairwise contractions torch actually runs, see
  :func:`einsum_macs`), ``tensordot``, convolutions (``Cout·Cin/g·k²`` per output position),
  ``scaled_dot_product_attention`` (``QKᵀ`` and ``AV``: ``B·h·Nq·Nk·(d + dv)``, whatever the mask
  or ``is_causal``), FFTs (every ``aten::fft_*`` op: ``5/2·M·log₂M`` per complex transform of ``M`` points, half
  of it per real one, :func:`vitzoo.costs.fft_flops`), products of two complex tensors (4 per element).
* **Not counted (0)**: softmax, exp, scaling, bias and mask adds, activations, reductions, pooling,
  real elementwise products (an einsum step that sums over nothing is an elementwise product), gathers,
  sorts, padding, rolls, reshapes.
* **Norms** are counted as fvcore counts them: an affine LayerNorm/GroupNorm 5 per element
  (4 without affine), so that whole-model analytic and measured totals agree exactly.
  ``torch.utils.flop_counter`` does not count norms: compare the two tools on matrix ops only.

Guarantees
----------
* Every module that does matrix work has an analytic ``flops`` (each matmul commented); parents sum
  their children (``flops_children``). :func:`count_flops` puts analytic and fvcore-measured counts
  side by side for the whole model and per module (patch embedding, stages, blocks, attention, MLP,
  norms, head), from a generic walk that imports no backbone.
* An op that does matrix work but has no handle (``torch.linalg.solve``, an FFT without its
  backend's handle, ``cdist``, …) is never silently counted as 0: the analysis raises
  :class:`UnsupportedOpError` naming the op and the module that called it.


Layout: :mod:`~vitzoo.flops.handles` (which ops count, fvcore handles, the analysis),
:mod:`~vitzoo.flops.torch_counter` (FlopCounterMode), :mod:`~vitzoo.flops.formula` (formula text),
:mod:`~vitzoo.flops.report` (per-module breakdown and :func:`count_flops`), :mod:`~vitzoo.flops.cli`
(``scripts/flops.py``; not imported here).
"""
from vitzoo.flops.formula import evaluate_formula, with_symbols
from vitzoo.flops.handles import (
    HANDLES,
    IGNORED_OPS,
    MATRIX_OPS,
    MATRIX_PREFIXES,
    FlopAnalysis,
    UnsupportedOpError,
    all_handles,
    einsum_macs,
    flop_analysis,
    is_matrix_op,
)
from vitzoo.flops.report import (
    FlopReport,
    MixerHost,
    ModuleRow,
    analytic_rows,
    attention_layers,
    children_of,
    count_flops,
    leaf_cost,
    mixer_flops,
    model_input,
)
from vitzoo.flops.torch_counter import TORCH_COUNTED_OPS, TorchCount, torch_flop_formulas, torch_flops

__all__ = [
    "HANDLES", "IGNORED_OPS", "MATRIX_OPS", "MATRIX_PREFIXES", "TORCH_COUNTED_OPS", "FlopAnalysis", "FlopReport",
    "MixerHost", "ModuleRow", "TorchCount", "UnsupportedOpError", "all_handles", "analytic_rows", "attention_layers",
    "children_of", "count_flops", "einsum_macs", "evaluate_formula", "flop_analysis", "is_matrix_op", "leaf_cost",
    "mixer_flops", "model_input", "torch_flop_formulas", "torch_flops", "with_symbols",
]
