"""vitzoo's optional compiled CPU kernels (``csrc/*.cpp``), built on first use (see :mod:`.loader`).

* :mod:`.block_kernel`: blocked sparse attention for the fixed patterns (``block_attention.cpp``).
* :mod:`.feature_kernel`: feature-map attention for ``performer`` and ``rfa`` (``feature_attention.cpp``).

Every entry point falls back to ``None``/``False`` where a kernel cannot be built, so callers keep their
PyTorch path. This package depends on torch only (never on :mod:`vitzoo.attention`).
"""
from vitzoo.cpu_kernels.loader import ENV, extension, tracing, usable

__all__ = ["ENV", "extension", "tracing", "usable"]
