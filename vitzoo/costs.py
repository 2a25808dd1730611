"""Analytic costs of the plain layers every backbone uses and of an FFT (one home, imported by blocks, models,
the Fourier mixers and :mod:`vitzoo.flops`). Unit: multiply-adds (MACs) for one image, fvcore's conventions."""
from __future__ import annotations

import math


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


def fft_flops(points: int, real: bool = False) -> int:
    """Multiply-adds of one FFT over ``points`` points in total (the product of its transformed lengths).

    A complex transform costs ``⌊5/2·M·log₂M + 1/2⌋``: the radix-2 count of ``5M·log₂M`` real flops, halved to
    multiply-adds. A real transform (real input of a forward transform, as ``rfft`` or ``fft`` of a real tensor;
    real output of an inverse one, as ``irfft``) computes the half spectrum and costs half of that,
    ``⌊5/4·M·log₂M + 1/2⌋`` (FFTW's benchmark convention, ``2.5M·log₂M`` flops). Rounded once per transform;
    the same for a transform over several dims, whose M is the product of their lengths.

    Args:
        points: M, the points of one transform.
        real: a real-to-complex or complex-to-real transform (the half spectrum).
    """
    if points <= 1:
        return 0
    return math.floor((1.25 if real else 2.5) * points * math.log2(points) + 0.5)
