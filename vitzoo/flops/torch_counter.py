"""The second tool: ``torch.utils.flop_counter.FlopCounterMode``, converted to MACs (its FLOPs ÷ 2),
with the formulas torch's counter lacks: CPU SDPA kernels and the in-place ``baddbmm_``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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


def _baddbmm_inplace_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs (2 per MAC) of ``aten.baddbmm_`` (window attention's scores on the CPU), which torch's counter only
    knows out of place: ``a[b, m, k] @ b[b, k, n]`` (the addition is not counted, as for ``baddbmm``)."""
    from torch.utils.flop_counter import bmm_flop

    return bmm_flop(a_shape, b_shape)


def torch_flop_formulas() -> dict:
    """Formulas vitzoo adds to FlopCounterMode (``custom_mapping``): the CPU SDPA kernels, ``baddbmm_``."""
    formulas = {torch.ops.aten.baddbmm_: _baddbmm_inplace_flop}
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
        cpu_sdpa: register vitzoo's formulas (:func:`torch_flop_formulas`: CPU SDPA, ``baddbmm_``); without them
            CPU attention counts 0.
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
