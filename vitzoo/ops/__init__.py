"""vitzoo's fast paths: how the attention backends' computations run, apart from what they compute.

Each backend (:mod:`vitzoo.attention`) defines its module, config, cost and reference; the fast paths it runs live
here and are picked through one dispatch (:mod:`.dispatch`: ``select(op, ...)``):

* :mod:`.window`: Swin's window attention on the CPU in one autograd node.
* :mod:`.efficient`, :mod:`.feature`, :mod:`.linformer`: efficient, kernel feature-map and Linformer attention
  from the fused projection ``qkv`` to merged heads, recomputing in backward.
* :mod:`.exp_shift`: FAVOR+'s ``exp(proj - shift)`` with a lean backward.
* :mod:`.gather`, :mod:`.halo`: blocked sparse attention over gathered key lists and haloed query blocks.
* :mod:`.axial`: one pass of axial attention (rows or columns) from the fused projection in one autograd node.
* :mod:`.sdpa`: CPU's fused attention with its backward on fp32 copies for short key sequences under bf16/fp16
  (the SDPA of :func:`vitzoo.attention.functional.sdpa` and of axial attention's pass node).
* :mod:`.common`: the exp2 scale and (image, head) chunking they share.

The compiled CPU kernels (:mod:`vitzoo.cpu_kernels`) are called from here only. This package imports
:mod:`vitzoo.cpu_kernels` and :mod:`vitzoo.registry`, never :mod:`vitzoo.attention`.
"""
from vitzoo.ops.dispatch import TABLE, implementations, select

__all__ = ["TABLE", "implementations", "select"]
