"""fvcore with vitzoo's handles: which ops count, the handles that count them, and an analysis that
fails loudly (:class:`UnsupportedOpError`) on matrix work it has no handle for. Conventions: see
:mod:`vitzoo.flops`."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from fvcore.nn import FlopCountAnalysis
from fvcore.nn.jit_handles import get_shape
from torch import nn

from vitzoo.costs import fft_flops

# --------------------------------------------------------------------------------------------------
# Which ops count
# --------------------------------------------------------------------------------------------------

# ops that do no matrix work: counted 0 and not reported as unsupported (elementwise, shape, creation); aten::mul
# has a handle instead (a product of two complex tensors counts, see complex_mul_flop_jit)
IGNORED_OPS = (
    "aten::add", "aten::add_", "aten::div", "aten::div_", "aten::sub", "aten::sub_",
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


def vecdot_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``linalg_vecdot(a, b, dim)``: output elements (the broadcast batch) × the length of ``dim``."""
    return math.prod(get_shape(outputs[0])) * get_shape(inputs[0])[_constant(inputs[2])]


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


def _is_complex(value: Any) -> bool:
    """The traced value is a complex tensor."""
    kind = value.type()
    return isinstance(kind, torch._C.TensorType) and "Complex" in str(kind.scalarType())


def _fft_handle(side: str):
    """fvcore handle for ``aten::fft_<op>``, ``<op>2`` and ``<op>n`` ``(self, n | s, dim, norm)``: transforms ×
    :func:`vitzoo.costs.fft_flops` over the points of one transform, read on the real side.

    Args:
        side: ``"input"`` (``rfft``, ``ihfft``: real input), ``"output"`` (``irfft``, ``hfft``: real output) or
            ``"dtype"`` (``fft``, ``ifft``: a real input makes it a real transform, else complex, sized on the output).
    """

    def handle(inputs: list[Any], outputs: list[Any]) -> int:
        real_input = side == "input" or (side == "dtype" and not _is_complex(inputs[0]))
        real = real_input or side == "output"
        shape = get_shape(inputs[0] if real_input else outputs[0])
        sizes, dims = _constant(inputs[1]), _constant(inputs[2])
        sizes = [sizes] if isinstance(sizes, int) else sizes
        if dims is None:  # fftn: every dim, or the last len(s) dims when s is given
            dims = list(range(len(shape) - (len(shape) if sizes is None else len(sizes)), len(shape)))
        dims = [d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)]
        # a real input is padded or cut to s along the transformed dims; an output already has the lengths
        lengths = sizes if real_input and sizes is not None else [shape[d] for d in dims]
        transforms = math.prod(n for d, n in enumerate(shape) if d not in dims)
        return transforms * fft_flops(math.prod(lengths), real=real)

    return handle


FFT_HANDLES = {
    f"aten::fft_{op}{suffix}": _fft_handle(side)
    for op, side in (("fft", "dtype"), ("ifft", "dtype"), ("rfft", "input"), ("ihfft", "input"),
                     ("irfft", "output"), ("hfft", "output"))
    for suffix in ("", "2", "n")
}


def complex_mul_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``aten::mul``: 4 real multiply-adds per output element when both operands are complex tensors (a complex
    product is a 2×2 real matrix product: ``(a + ib)(c + id) = (ac − bd) + i(ad + bc)``); 0 for real products
    and for scaling by a real tensor or number, as fvcore counts elementwise work."""
    if len(inputs) < 2 or not (_is_complex(inputs[0]) and _is_complex(inputs[1])):
        return 0
    return 4 * math.prod(get_shape(outputs[0]))


HANDLES = {
    **FFT_HANDLES,
    "aten::mul": complex_mul_flop_jit,
    "aten::mul_": complex_mul_flop_jit,
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
    "aten::linalg_vecdot": vecdot_flop_jit,
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
    """fvcore's analysis that raises :class:`UnsupportedOpError` for an unhandled matrix op. Its trace counts the
    forward on these inputs: sizes that follow the data (a data-dependent key span) are read from them, as in eager mode
    (:func:`vitzoo.attention.functional.counting_trace`)."""

    def _analyze(self):
        from vitzoo.attention.functional import counting_trace

        fresh = self._stats is None
        with counting_trace():  # this forward's cost: sizes that follow the data are read from it
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
