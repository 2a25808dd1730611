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
  or ``is_causal``), FFTs (the backend that uses them supplies the handle, e.g. ``fnet``:
  ``5/2·M·log₂M`` per complex transform of ``M`` points).
* **Not counted (0)**: softmax, exp, scaling, bias and mask adds, activations, reductions, pooling,
  elementwise products (an einsum step that sums over nothing is an elementwise product), gathers,
  sorts, padding, rolls, reshapes.
* **Norms** are counted as fvcore counts them: an affine LayerNorm/GroupNorm 5 per element
  (4 without affine), so that whole-model analytic and measured totals agree exactly.
  ``torch.utils.flop_counter`` does not count norms: compare the two tools on matrix ops only.

Guarantees
----------
* Every module that does matrix work has an analytic ``flops`` (each matmul commented); parents sum
  their children. :func:`count_flops` puts analytic and fvcore-measured counts side by side for the
  whole model and per module (patch embedding, stages, blocks, attention, MLP, norms, head).
* An op that does matrix work but has no handle (``torch.linalg.solve``, an FFT without its
  backend's handle, ``cdist``, …) is never silently counted as 0: the analysis raises
  :class:`UnsupportedOpError` naming the op and the module that called it.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from fvcore.nn import FlopCountAnalysis
from fvcore.nn.jit_handles import get_shape
from torch import Tensor, nn

from vitzoo.attention.base import Grid, TokenMixer
from vitzoo.registry import ConfigError

# --------------------------------------------------------------------------------------------------
# Which ops count
# --------------------------------------------------------------------------------------------------

# ops that do no matrix work: counted 0 and not reported as unsupported (elementwise, shape, creation)
IGNORED_OPS = (
    "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::div_", "aten::sub", "aten::sub_",
    "aten::rsub", "aten::neg", "aten::softmax", "aten::gelu", "aten::elu", "aten::exp", "aten::exp_", "aten::log",
    "aten::sqrt", "aten::rsqrt", "aten::mean", "aten::sum", "aten::pad", "aten::constant_pad_nd", "aten::roll",
    "aten::masked_fill", "aten::masked_fill_", "aten::dropout", "aten::feature_dropout", "aten::relu", "aten::relu_",
    "aten::sigmoid", "aten::tanh", "aten::pow", "aten::max", "aten::min", "aten::amax", "aten::amin",
    "aten::maximum", "aten::minimum", "aten::sin", "aten::cos", "aten::abs", "aten::clamp", "aten::clamp_",
    "aten::clamp_min", "aten::clamp_max", "aten::square", "aten::reciprocal", "aten::repeat", "aten::expand_as",
    "aten::linalg_vector_norm", "aten::norm", "aten::log_softmax", "aten::logsumexp", "aten::cumsum",
    "aten::sort", "aten::argsort", "aten::argmax", "aten::argmin", "aten::topk", "aten::gather", "aten::scatter",
    "aten::scatter_add", "aten::scatter_add_", "aten::index_add", "aten::index_select", "aten::index",
    "aten::eq", "aten::ne", "aten::lt", "aten::gt", "aten::le", "aten::ge", "aten::where", "aten::fill_",
    "aten::zero_", "aten::floor_divide", "aten::remainder", "aten::bitwise_not", "aten::__and__", "aten::__or__",
    "aten::silu", "aten::sign", "aten::one_hot", "aten::eye", "aten::__iand__", "aten::__ior__", "aten::erf",
    "aten::floor", "aten::ceil", "aten::round", "aten::exp2", "aten::log1p", "aten::softplus", "aten::hardtanh",
    "aten::leaky_relu", "aten::mish", "aten::hardswish", "aten::hardsigmoid", "aten::var", "aten::std",
    "aten::logical_not", "aten::logical_and", "aten::logical_or", "aten::isinf", "aten::isnan", "aten::nan_to_num",
    "aten::tril", "aten::triu", "aten::diagonal", "aten::diag", "aten::diag_embed", "aten::flip", "aten::outer",
    "aten::real", "aten::imag", "aten::view_as_real", "aten::view_as_complex", "aten::complex", "aten::conj",
    "aten::numpy_T", "aten::im2col", "aten::col2im", "aten::avg_pool1d", "aten::avg_pool2d", "aten::max_pool1d",
    "aten::max_pool2d", "aten::adaptive_avg_pool1d", "aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d",
    "aten::upsample_bicubic2d", "aten::upsample_linear1d", "aten::bucketize", "aten::searchsorted",
    "aten::randn", "aten::rand", "aten::randint", "aten::randperm", "aten::normal", "aten::normal_",
    "aten::bernoulli", "aten::bernoulli_", "aten::multinomial", "aten::uniform_", "aten::zeros", "aten::ones",
    "aten::zeros_like", "aten::ones_like", "aten::full", "aten::full_like", "aten::empty", "aten::empty_like",
    "aten::arange", "aten::linspace", "aten::new_zeros", "aten::new_ones", "aten::new_full", "aten::new_empty",
    "aten::masked_scatter", "aten::index_put_", "aten::index_put", "aten::unique_dim", "aten::nonzero",
    "aten::count_nonzero", "aten::all", "aten::any", "aten::prod", "aten::cummax", "aten::sgn", "aten::frac",
    "aten::trunc", "aten::fmod", "aten::atan2", "aten::hypot", "aten::lerp", "aten::addcmul", "aten::addcdiv",
    "aten::glu", "aten::softmin", "aten::_safe_softmax", "aten::logit",
    "aten::scatter_reduce", "aten::isfinite", "aten::unflatten", "aten::view_as", "aten::repeat_interleave",
)

# ops that do matrix work: an unhandled one raises UnsupportedOpError instead of counting 0
MATRIX_OPS = frozenset({
    "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_", "aten::_addmm_activation",
    "aten::baddbmm", "aten::baddbmm_", "aten::addbmm", "aten::addbmm_", "aten::mv", "aten::addmv", "aten::addmv_",
    "aten::dot", "aten::vdot", "aten::inner", "aten::addr", "aten::ger", "aten::tensordot", "aten::kron",
    "aten::chain_matmul", "aten::bilinear", "aten::_trilinear", "aten::cdist", "aten::_cdist_forward",
    "aten::pdist", "aten::cosine_similarity", "aten::einsum", "aten::linear", "aten::_convolution",
    "aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_transpose1d",
    "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::conv_tbc", "aten::_convolution_mode",
    "aten::stft", "aten::istft", "aten::inverse", "aten::pinverse", "aten::cholesky", "aten::cholesky_solve",
    "aten::cholesky_inverse", "aten::triangular_solve", "aten::lu_solve", "aten::svd", "aten::qr", "aten::det",
    "aten::logdet", "aten::slogdet", "aten::matrix_power", "aten::matrix_exp", "aten::lstsq", "aten::orgqr",
    "aten::ormqr", "aten::geqrf", "aten::scaled_dot_product_attention", "aten::_native_multi_head_attention",
    "aten::_transformer_encoder_layer_fwd", "aten::multi_head_attention_forward", "aten::lstm", "aten::gru",
    "aten::rnn_tanh", "aten::rnn_relu",
})
# op-name prefixes that always mean matrix work (FFTs, linear algebra, fused attention/convolution kernels)
MATRIX_PREFIXES = (
    "aten::fft_", "aten::_fft_", "aten::linalg_", "aten::_linalg_", "aten::_scaled_dot_product",
    "aten::_flash_attention", "aten::_efficient_attention", "aten::cudnn_conv", "aten::mkldnn_conv",
    "aten::slow_conv", "aten::thnn_conv", "aten::miopen_conv", "aten::_slow_conv", "aten::_nnpack",
    "aten::flex_attention",
)


def is_matrix_op(op: str) -> bool:
    """True for an op (``aten::name``) that does matrix work, i.e. must never be silently counted 0."""
    return op in MATRIX_OPS or op.startswith(MATRIX_PREFIXES)


class UnsupportedOpError(RuntimeError):
    """fvcore met an op that does matrix work and has no handle (the count would silently drop it)."""


# --------------------------------------------------------------------------------------------------
# fvcore handles (inputs / outputs are TorchScript values; shapes via get_shape)
# --------------------------------------------------------------------------------------------------

def _constant(value: Any) -> Any:
    """The Python value of a traced constant argument (a ``prim::ListConstruct`` of constants included)."""
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [v.toIValue() for v in node.inputs()]
    return value.toIValue()


def sdpa_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``scaled_dot_product_attention(q[..., L, E], k[..., S, E], v[..., S, Ev])``.

    ``QKᵀ``: ``L·S·E`` and ``AV``: ``L·S·Ev`` per batch·head; the mask, scale and softmax are 0.
    """
    q, k, v = (get_shape(t) for t in inputs[:3])
    return math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def matmul_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``matmul``/``mm``/``bmm``/``mv``/``dot`` with any broadcast: output elements × contracted length.

    fvcore's own rule, ``numel(a)·b[-1]``, undercounts when ``b`` has more batch dims than ``a``
    (``x[N, d] @ w[B, h, d, M]``) and for 1-D operands.
    """
    return math.prod(get_shape(outputs[0])) * get_shape(inputs[0])[-1]


def addmm_like_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``baddbmm(c, a, b)``, ``addmv(c, a, v)``: output elements × contracted length (bias add 0)."""
    return math.prod(get_shape(outputs[0])) * get_shape(inputs[1])[-1]


def addbmm_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``addbmm(c, a[b, n, k], b[b, k, m])``: ``b·n·k·m`` (the sum over b is part of the MACs)."""
    return math.prod(get_shape(inputs[1])) * get_shape(inputs[2])[-1]


def tensordot_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``tensordot(a, b, dims_a, dims_b)``: output elements × product of the contracted sizes."""
    a = get_shape(inputs[0])
    dims = _constant(inputs[2])
    return math.prod(get_shape(outputs[0])) * math.prod(a[d] for d in dims)


def einsum_macs(equation: str, shapes: Sequence[Sequence[int]], path: Optional[Sequence[int]] = None) -> int:
    """MACs of ``torch.einsum(equation, *operands)`` as torch runs it.

    torch first sums out (0 MACs) every index that only one operand has and the output lacks, then
    contracts operands pairwise: left to right, or along ``path`` (pairs of positions, the result
    appended at the end, as opt_einsum's path) when one was given. A pairwise step that sums over
    an index is a batched matmul costing the product of the sizes of every index of both operands;
    a step that sums over nothing is an elementwise (or outer) product: 0. fvcore's own rule
    (numpy's optimal path, halved) ignores torch's order and counts elementwise steps and lone
    reductions, so it disagrees with what torch does (and with FlopCounterMode).

    Args:
        equation: e.g. ``"bhnd,bhmd->bhnm"`` (``...`` allowed; implicit output when no ``->``).
        shapes: operand shapes.
        path: flattened contraction path ``[i0, j0, i1, j1, ...]`` or None.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum '{equation}' has {len(terms)} operands but {len(shapes)} shapes")
    n_ell = max((len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = [chr(0x100 + i) for i in range(n_ell)]  # placeholder indices for the broadcast dims of "..."

    def expand(term: str, ndim: Optional[int]) -> list[str]:
        if "..." not in term:
            return list(term)
        head, tail = term.split("...")
        k = n_ell if ndim is None else ndim - len(head) - len(tail)
        return list(head) + ell[n_ell - k:] + list(tail)

    ops = [expand(t, len(s)) for t, s in zip(terms, shapes)]
    sizes: dict[str, int] = {}
    for idx, shape in zip(ops, shapes):
        for letter, size in zip(idx, shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    if arrow:
        out = set(expand(rhs, None))
    else:  # implicit output: broadcast dims and the indices that occur once
        counts = Counter(letter for idx in ops for letter in idx)
        out = set(ell) | {c for c, n in counts.items() if n == 1}
    remaining = [set(idx) for idx in ops]
    if len(remaining) == 1:
        return 0  # a single operand: transpose, diagonal or reduction
    # sum out indices that only one operand has and the output lacks (a reduction: 0 MACs)
    for i, idx in enumerate(remaining):
        others = out.union(*(o for j, o in enumerate(remaining) if j != i))
        remaining[i] = idx & others
    steps = list(zip(path[0::2], path[1::2])) if path else [(0, 1)] * (len(remaining) - 1)
    total = 0
    for i, j in steps:
        a, b = remaining[i], remaining[j]
        for k in sorted((i, j), reverse=True):
            remaining.pop(k)
        keep = out.union(*remaining)
        summed = (a & b) - keep
        if summed:  # a batched matmul over the summed indices
            total += math.prod(sizes[letter] for letter in a | b)
        remaining.append((a | b) - summed)
    return total


def einsum_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """fvcore handle for ``aten::einsum(equation, tensors, path)``: :func:`einsum_macs`."""
    equation = inputs[0].toIValue()
    shapes = [get_shape(v) for v in inputs[1].node().inputs()]
    path = _constant(inputs[2]) if len(inputs) > 2 else None
    return einsum_macs(equation, shapes, path)


HANDLES = {
    "aten::scaled_dot_product_attention": sdpa_flop_jit,
    "aten::matmul": matmul_flop_jit,
    "aten::mm": matmul_flop_jit,
    "aten::mv": matmul_flop_jit,
    "aten::dot": matmul_flop_jit,
    "aten::vdot": matmul_flop_jit,
    "aten::baddbmm": addmm_like_flop_jit,
    "aten::addmv": addmm_like_flop_jit,
    "aten::addbmm": addbmm_flop_jit,
    "aten::tensordot": tensordot_flop_jit,
    "aten::einsum": einsum_flop_jit,
}


def all_handles() -> dict[str, Any]:
    """vitzoo's handles plus those declared by backends (``TokenMixer.flop_handles``)."""
    from vitzoo.attention import ATTENTION, list_attention

    handles = dict(HANDLES)
    for name in list_attention():
        handles.update(ATTENTION.get(name)[0].flop_handles)
    return handles


class FlopAnalysis(FlopCountAnalysis):
    """fvcore's analysis that raises :class:`UnsupportedOpError` for an unhandled matrix op."""

    def _analyze(self):
        fresh = self._stats is None
        stats = super()._analyze()
        if fresh:
            _check_supported(stats.unsupported_ops, self._model)
        return stats


def _check_supported(unsupported: Mapping[str, Counter], model: nn.Module) -> None:
    bad = sorted(op for op in unsupported.get("", {}) if is_matrix_op(op))
    if not bad:
        return
    op = bad[0]
    where = max((name for name, ops in unsupported.items() if op in ops), key=lambda n: n.count(".") + bool(n))
    module = model.get_submodule(where) if where else model
    raise UnsupportedOpError(
        f"fvcore has no handle for {op}, which does matrix work, called in module '{where or '(model)'}' "
        f"({type(module).__name__}); counting it as 0 would be wrong: add a handle to the backend's "
        f"flop_handles (or vitzoo.flops.HANDLES)" + (f"; also unhandled: {', '.join(bad[1:])}" if bad[1:] else "")
    )


def flop_analysis(model: nn.Module, inputs: tuple) -> FlopCountAnalysis:
    """fvcore's analysis with vitzoo's handles; quiet about ops in :data:`IGNORED_OPS`.

    Raises :class:`UnsupportedOpError` (when the counts are first read) if an op that does matrix
    work has no handle.
    """
    analysis = FlopAnalysis(model, inputs)
    analysis.set_op_handle(**{op: None for op in IGNORED_OPS})
    analysis.set_op_handle(**all_handles())
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    return analysis


# --------------------------------------------------------------------------------------------------
# The second tool: torch.utils.flop_counter.FlopCounterMode
# --------------------------------------------------------------------------------------------------

# fvcore operator names (by_module_and_operator keys) whose MACs FlopCounterMode also counts; it does
# not count norms, upsampling, mv/dot/addmv/addbmm or FFTs, so compare the tools on these ops only
TORCH_COUNTED_OPS = frozenset({
    "linear", "conv", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "tensordot", "scaled_dot_product_attention",
})


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs (2 per MAC) of ``aten._scaled_dot_product_flash_attention_for_cpu``, which torch's
    counter has no formula for: CPU ``F.scaled_dot_product_attention`` dispatches to it (masked or
    not, float32 or float64), so FlopCounterMode would count attention as 0 on CPU."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def torch_flop_formulas() -> dict:
    """Formulas vitzoo adds to FlopCounterMode (``custom_mapping``): the CPU SDPA kernels."""
    formulas = {}
    for op in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        if hasattr(torch.ops.aten, op):
            formulas[getattr(torch.ops.aten, op)] = _sdpa_cpu_flop
    return formulas


@dataclass
class TorchCount:
    """FlopCounterMode's count converted to MACs (its FLOPs ÷ 2), total and per module name."""

    total: int
    by_module: dict[str, int]
    by_op: dict[str, int]


def torch_flops(model: nn.Module, inputs: tuple, cpu_sdpa: bool = True) -> TorchCount:
    """Count ``model(*inputs)`` with ``torch.utils.flop_counter.FlopCounterMode``, in MACs.

    Args:
        model: any module (run under ``no_grad``; put it in eval mode first).
        inputs: forward arguments.
        cpu_sdpa: register the formula for CPU SDPA (without it CPU attention counts 0).
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=torch_flop_formulas() if cpu_sdpa else None)
    with torch.no_grad(), counter:
        model(*inputs)
    root = type(model).__name__
    by_module = {}
    for key, ops in counter.get_flop_counts().items():
        if key == root:
            by_module[""] = sum(ops.values()) // 2
        elif key.startswith(root + "."):
            by_module[key[len(root) + 1:]] = sum(ops.values()) // 2
    by_op = {str(op).removeprefix("aten."): n // 2 for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return TorchCount(counter.get_total_flops() // 2, by_module, by_op)


# --------------------------------------------------------------------------------------------------
# Formulas as text
# --------------------------------------------------------------------------------------------------

_SUPERSCRIPTS = {"²": 2, "³": 3, "⁴": 4}
_FUNCTIONS = {"log₂": math.log2, "log2": math.log2, "log": math.log2, "ln": math.log, "sqrt": math.sqrt, "√": math.sqrt,
              "ceil": math.ceil, "floor": math.floor, "min": min, "max": max}


def with_symbols(formula: str, symbols: Mapping[str, Any]) -> str:
    """``"4NC² + 2N²C"`` -> ``"4NC² + 2N²C  (N=197, C=384, h=6)"``."""
    values = ", ".join(f"{k}={v}" for k, v in symbols.items())
    return f"{formula}  ({values})" if values else formula


def evaluate_formula(formula: str, symbols: Mapping[str, Any]) -> Optional[float]:
    """Best-effort numeric value of a formula text such as ``"4NC² + 2M²NC"`` or ``"5/2·NC·log₂(NC)"``.

    Juxtaposition is multiplication; names are matched longest first against ``symbols`` (so
    ``"NC"`` is ``N·C`` and a symbol named ``"w²"`` or ``"n_b"`` is one name); ``log``/``log₂`` is
    base 2. Returns None when the text uses a name ``symbols`` does not define or does not parse.
    """
    text = formula.replace("·", "*").replace("×", "*").replace("−", "-").replace("⌈", "ceil(").replace("⌉", ")")
    text = text.replace("⌊", "floor(").replace("⌋", ")")
    names = sorted((str(k) for k in symbols), key=len, reverse=True)
    functions = sorted(_FUNCTIONS, key=len, reverse=True)
    tokens: list[tuple[str, str]] = []  # (kind, python text)
    pos = 0
    while pos < len(text):
        rest = text[pos:]
        if rest[0].isspace():
            pos += 1
            continue
        fn = next((f for f in functions if rest.startswith(f) and rest[len(f):].lstrip().startswith("(")), None)
        name = next((n for n in names if rest.startswith(n)), None)
        number = re.match(r"\d+(\.\d+)?", rest)
        if fn:
            tokens.append(("fn", f"F[{fn!r}]"))
            pos += len(fn)
        elif name:
            tokens.append(("value", f"S[{name!r}]"))
            pos += len(name)
        elif number:
            tokens.append(("value", number.group(0)))
            pos += number.end()
        elif rest[0] in _SUPERSCRIPTS:
            tokens.append(("power", f"**{_SUPERSCRIPTS[rest[0]]}"))
            pos += 1
        elif rest.startswith("**") or rest.startswith("^"):
            tokens.append(("op", "**"))
            pos += 2 if rest.startswith("**") else 1
        elif rest[0] in "+-*/,":
            tokens.append(("op", rest[0]))
            pos += 1
        elif rest[0] in "([":
            tokens.append(("open", "("))
            pos += 1
        elif rest[0] in ")]":
            tokens.append(("close", ")"))
            pos += 1
        else:
            return None
    expr: list[str] = []
    previous = ""
    for kind, tok in tokens:  # implicit multiplication: "2N²C", "N(a + b)", "(a)(b)", "2log(N)"
        if previous in ("value", "close", "power") and kind in ("value", "fn", "open"):
            expr.append("*")
        expr.append(tok)
        previous = kind
    try:
        return float(eval("".join(expr), {"__builtins__": {}}, {"S": dict(symbols), "F": _FUNCTIONS}))  # noqa: S307
    except Exception:  # noqa: BLE001 - best effort: the text is written for humans
        return None


# --------------------------------------------------------------------------------------------------
# Analytic per-module breakdown
# --------------------------------------------------------------------------------------------------

def linear_flops(layer: nn.Linear, tokens: int) -> int:
    """``tokens·in·out`` (the bias add is 0)."""
    return tokens * layer.in_features * layer.out_features


def layernorm_flops(numel: int) -> int:
    """fvcore's count for an affine LayerNorm: 5 per element."""
    return 5 * numel


def mlp_flops(mlp: nn.Module, tokens: int) -> int:
    """timm ``Mlp``: fc1 ``N·C·D`` + fc2 ``N·D·C`` (the activation is 0)."""
    return linear_flops(mlp.fc1, tokens) + linear_flops(mlp.fc2, tokens)


def patch_embed_flops(patch_embed: nn.Module, grid: Grid) -> int:
    """timm ``PatchEmbed``: a ``p×p`` stride-``p`` conv, ``C·c·p²`` per token, plus its norm if any."""
    conv = patch_embed.proj
    tokens = grid[0] * grid[1]
    total = tokens * conv.out_channels * (conv.in_channels // conv.groups) * math.prod(conv.kernel_size)
    if isinstance(patch_embed.norm, nn.LayerNorm):
        total += layernorm_flops(tokens * conv.out_channels)
    return total


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


def _block_rows(prefix: str, block: nn.Module, grid: Grid, depth: int) -> list[ModuleRow]:
    attn = block.attn
    n, c, hidden = attn.seq_len(grid), attn.dim, block.mlp.fc1.out_features
    sym = {"N": n, "C": c}
    return [
        ModuleRow(prefix, depth, "norm1 + attn + norm2 + mlp", block.flops(grid), kind="block"),
        ModuleRow(f"{prefix}.norm1", depth + 1, with_symbols("5NC", sym), layernorm_flops(n * c), kind="norm"),
        ModuleRow(f"{prefix}.attn", depth + 1, with_symbols(attn.formula, attn.symbols(grid)), attn.flops(grid),
                  kind="attention"),
        ModuleRow(f"{prefix}.norm2", depth + 1, with_symbols("5NC", sym), layernorm_flops(n * c), kind="norm"),
        ModuleRow(f"{prefix}.mlp", depth + 1, with_symbols("2NCD", {**sym, "D": hidden}), mlp_flops(block.mlp, n),
                  kind="mlp"),
    ]


def analytic_rows(model: nn.Module, img_size: int) -> list[ModuleRow]:
    """Analytic MACs per module for one ``img_size``² image: model, patch embedding, each stage,
    each block (norms, attention, MLP), patch merging, final norm, head.

    Parents use the modules' own ``flops`` (``model.flops``, ``Block.flops``, ``SwinStage.flops``,
    ``PatchMerging.flops``); leaves use the formulas of this module, so that "children sum to
    their parent" checks the two against each other.
    """
    from vitzoo.models.swin import PatchMerging, SwinTransformer
    from vitzoo.models.vit import VisionTransformer

    cfg = model.cfg
    rows = [ModuleRow("", 0, "Σ children", model.flops(img_size), kind="model")]
    if isinstance(model, VisionTransformer):
        grid = model.token_grid((img_size, img_size))
        c, p, hw = cfg.embed_dim, cfg.patch_size, grid[0] * grid[1]
        n = model.num_prefix + hw
        rows.append(ModuleRow("patch_embed", 1, with_symbols("HW·C·c·p²", dict(H=grid[0], W=grid[1], C=c, c=cfg.in_chans, p=p)),
                              patch_embed_flops(model.patch_embed, grid), kind="patch_embed"))
        for i, block in enumerate(model.blocks):
            rows += _block_rows(f"blocks.{i}", block, grid, 1)
        rows.append(ModuleRow("norm", 1, with_symbols("5NC", dict(N=n, C=c)), layernorm_flops(n * c), kind="norm"))
    elif isinstance(model, SwinTransformer):
        grid = (img_size // cfg.patch_size, img_size // cfg.patch_size)
        c, p = cfg.embed_dim, cfg.patch_size
        rows.append(ModuleRow("patch_embed", 1, with_symbols("HW·C·c·p² + 5HWC", dict(H=grid[0], W=grid[1], C=c, c=cfg.in_chans, p=p)),
                              patch_embed_flops(model.patch_embed, grid), kind="patch_embed"))
        for i, stage in enumerate(model.stages):
            rows.append(ModuleRow(f"stages.{i}", 1, "Σ blocks + downsample", stage.flops(grid), kind="stage"))
            for j, block in enumerate(stage.blocks):
                rows += _block_rows(f"stages.{i}.blocks.{j}", block, grid, 2)
            if stage.downsample is not None:
                ds = stage.downsample
                h2, w2 = PatchMerging.out_grid(grid)
                rows.append(ModuleRow(
                    f"stages.{i}.downsample", 2,
                    with_symbols("5N'·4C + N'·4C·2C", {"N'": h2 * w2, "C": ds.reduction.in_features // 4}),
                    layernorm_flops(h2 * w2 * ds.reduction.in_features) + linear_flops(ds.reduction, h2 * w2),
                    kind="downsample"))
                grid = (h2, w2)
        n, c = grid[0] * grid[1], model.num_features
        rows.append(ModuleRow("norm", 1, with_symbols("5NC", dict(N=n, C=c)), layernorm_flops(n * c), kind="norm"))
    else:  # an unknown family: the model and its attention layers only
        for name, layer in attention_layers(model):
            grid = _layer_grid(model, layer, img_size)
            rows.append(ModuleRow(name, 1, with_symbols(layer.formula, layer.symbols(grid)), layer.flops(grid),
                                  kind="attention"))
        return rows
    head = model.head
    rows.append(ModuleRow("head", 1, with_symbols("CK", dict(C=head.in_features, K=head.out_features)),
                          linear_flops(head, 1), kind="head"))
    return rows


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
    """A zero image batch of 1 at ``img_size`` (a :class:`ConfigError` if the patch size does not divide it)."""
    cfg = model.cfg
    s = img_size or cfg.img_size
    if s % cfg.patch_size:
        raise ConfigError(f"img_size={s} is not a multiple of model.patch_size ({cfg.patch_size}); "
                          f"the patch embedding would silently crop the image")
    return torch.zeros(1, in_chans or cfg.in_chans, s, s, device=next(model.parameters()).device)


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


def _layer_grid(model: nn.Module, layer: TokenMixer, img_size: int) -> tuple[int, int]:
    """The token grid a layer runs at for input side ``img_size`` (scales its construction grid)."""
    scale = img_size / model.cfg.img_size
    return tuple(int(g * scale) for g in layer.grid)


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
    x = torch.zeros(1, attn.seq_len(grid), attn.dim)
    with torch.no_grad():
        measured = int(flop_analysis(host, (x,)).by_module()["attn"])
    second = torch_flops(host, (x,)).by_module.get("attn", 0) if second_tool else None
    return attn.flops(grid), measured, second
