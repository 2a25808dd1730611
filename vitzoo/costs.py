"""Analytic costs of the plain layers every backbone uses (one home, imported by blocks, models and
:mod:`vitzoo.flops`). Unit: multiply-adds (MACs) for one image, fvcore's conventions."""
from __future__ import annotations


def layernorm_flops(numel: int, affine: bool = True) -> int:
    """fvcore's count for a LayerNorm over ``numel`` elements: 5 per element (mean, var, normalise,
    scale, shift), 4 without the affine scale and shift.

    Args:
        numel: elements normalised (tokens × channels).
        affine: the norm has a learnable scale and shift.
    """
    return (5 if affine else 4) * numel


def linear_flops(tokens: int, in_features: int, out_features: int) -> int:
    """``tokens·in·out`` for a dense layer applied to ``tokens`` vectors (the bias add is 0).

    Args:
        tokens: vectors the layer is applied to.
        in_features: input width; out_features: output width.
    """
    return tokens * in_features * out_features  # matmul x[tokens, in] @ W[in, out]
