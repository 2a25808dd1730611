"""Analytic costs of the plain layers every backbone uses and of an FFT (one home, imported by blocks, models,
the Fourier mixers and :mod:`vitzoo.flops`). Unit: multiply-adds (MACs) for one image, fvcore's conventions.
Memory: :class:`Saved`, one tensor of a ``memory()`` formula (bytes autograd keeps for backward)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch


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


@dataclass(frozen=True)
class Saved:
    """One tensor autograd keeps from a training step's forward for its backward, as an analytic memory
    formula (``memory()`` beside ``flops()``) lists it; the measured side is
    :class:`vitzoo.measure.activations.SavedTensorCounter`.

    Args:
        name: what the tensor is, e.g. ``"qkv input (bf16 cast)"`` or ``"attention output"``.
        numel: its elements (for a batch of images).
        itemsize: bytes per element: 4 for fp32, 2 for bf16/fp16, 8 for int64 and complex64, 1 for bool.
        count: equal tensors the entry stands for (``numel`` is their total), e.g. every matrix of an iteration.
        workspace: bytes the backward of the op that saves it allocates beside the gradients while it runs (a
            kernel's buffer on CPU), 0 for most ops.
    """

    name: str
    numel: int
    itemsize: int
    count: int = 1
    workspace: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the tensor holds."""
        return self.numel * self.itemsize

    @property
    def transient(self) -> int:
        """Bytes the backward of the op that saves it makes while the entry is held: the gradient of one of its
        tensors (the op's input, the size of what it saved) and the op's :attr:`workspace`."""
        return self.numel // self.count * self.itemsize + self.workspace


def saved_bytes(items: Iterable[Saved]) -> int:
    """Total bytes of a memory formula's saved tensors.

    Args:
        items: what a ``memory()`` returned.
    """
    return sum(item.nbytes for item in items)


def casts_input(amp: Optional[torch.dtype], input_dtype: Optional[torch.dtype] = None) -> bool:
    """Whether an autocast op reading a tensor of ``input_dtype`` makes its own copy of it in ``amp`` (autocast
    caches the casts of leaf tensors only, so each op reading a non-leaf input casts it apart).

    Args:
        amp: the autocast dtype or ``None``; input_dtype: the tensor's dtype (``None``: fp32).
    """
    return amp is not None and (input_dtype or torch.float32) != amp


def itemsize(amp: Optional[torch.dtype], cast: bool = True) -> int:
    """Bytes per element of a tensor an op computes under autocast ``amp`` (``None``: fp32 training).

    Args:
        amp: the autocast dtype (``torch.bfloat16``, ``torch.float16``) or ``None``.
        cast: the op runs in the autocast dtype (matmuls, linear layers); ``False`` for ops autocast keeps
            in fp32 (softmax, layer norm, reductions).
    """
    if amp is None or not cast:
        return 4
    return torch.empty((), dtype=amp).element_size()
