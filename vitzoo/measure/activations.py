"""Bytes autograd saves for backward, per module: the measured side of activation memory.

:class:`SavedTensorCounter` wraps a forward pass in ``torch.autograd.graph.saved_tensors_hooks`` and
records every tensor an autograd node keeps for its backward, under the name of the innermost module
that was running (forward pre/post hooks keep a stack of module names). It changes nothing the forward
or the backward computes: the hook keeps a detached alias of each tensor (same storage) and hands it back.

* Each storage is counted once, with the bytes of the whole storage (what stays alive): a view of a
  saved tensor, or a tensor saved by two nodes, adds nothing the second time. The key is the device and
  the address of the storage object, which the meta device has as well, so the counter runs on CPU, on
  an accelerator and on ``meta`` (a model moved there allocates nothing in its forward). An address counts as seen while
  a tensor saved on it is alive: a storage freed during the run and a new one at its address are two.
* The totals are what autograd holds when the counter closes: keep the output (the loss) alive inside the
  ``with`` block. Storages saved by a graph part the forward itself dropped are marked ``freed`` and
  reported apart (:attr:`SavedTensorCounter.freed_bytes`): transient, not held for backward.
* A saved tensor whose storage is a parameter's (a linear layer's weight, or a view of it) counts as
  parameter bytes; one whose storage is a buffer's as buffer bytes. Both exist without the step.
  Everything else counts as activation bytes: the memory a training step holds from forward to backward.
  Of those, :attr:`SavedTensorCounter.cast_bytes` are the low-precision copies autocast makes of parameters.
* ``scaled_dot_product_attention`` picks its kernel by device, and the meta device has only the math
  kernel, which saves the score matrix. On ``meta`` the counter runs the kernel CPU would pick instead
  (:class:`CpuSdpaOnMeta`: the fused CPU kernel without dropout, math otherwise), so fused attention saves
  on ``meta`` what it saves on CPU. A backend with its own CPU kernels (window, the sparse family) runs its
  portable path on ``meta``, whose saved set differs from its CPU kernel's.
* Inside ``torch.utils.checkpoint`` (non-reentrant) the checkpoint's own hooks hold nothing but the
  region's inputs, which it saves through autograd: the counter sees those inputs and nothing else, which
  is what such a region keeps.

Example::

    with SavedTensorCounter(model) as c:
        loss = model(x).sum()  # kept until the block closes: its graph holds what is counted
    print(c.activation_bytes, c.parameter_bytes)
    print(c.table())
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

OUTSIDE = "(outside)"  # module name for tensors saved outside every module of the model (a loss, say)
KINDS = ("activation", "parameter", "buffer")


@dataclass
class SavedRecord:
    """One storage autograd kept: where it was first saved, what it holds and how it is counted."""

    module: str  # innermost module running when it was saved ("" is the model itself)
    shape: tuple[int, ...]  # shape of the first tensor that saved this storage
    dtype: torch.dtype
    nbytes: int  # bytes of the whole storage
    kind: str  # "activation", "parameter" or "buffer"
    cast: bool  # an autocast copy of a parameter (kind "activation")
    freed: bool = False  # no saved tensor on it was left when the counter closed (a graph part dropped)


def storage_key(t: Tensor) -> tuple[str, int]:
    """Identity of ``t``'s storage: device and storage address (stable on the meta device too).

    Args:
        t: any tensor; one without a plain storage (sparse, nested) is its own key.
    """
    try:
        return str(t.device), t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return "object", id(t)


def storage_nbytes(t: Tensor) -> int:
    """Bytes of ``t``'s storage (its own elements where it has no plain storage)."""
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return t.numel() * t.element_size()


FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # CPU's fused kernel takes these


class CpuSdpaOnMeta(TorchFunctionMode):
    """On meta tensors, ``F.scaled_dot_product_attention`` runs the kernel CPU's dispatcher picks.

    CPU picks its fused (flash) kernel for 4-D float inputs with unit last stride, no dropout, no grouped
    heads, no mask that needs a gradient and flash enabled; that kernel saves q, k, v, the output and the
    log-sum-exp rows (no score matrix). Anything else stays on the math kernel, as on CPU.
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and _cpu_picks_flash(*args, **kwargs):
            q, k, v = args[:3]
            mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
            dropout_p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            is_causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout_p, is_causal, attn_mask=mask, scale=kwargs.get("scale"))[0]
        return func(*args, **kwargs)


def _cpu_picks_flash(q: Any = None, k: Any = None, v: Any = None, attn_mask: Any = None, dropout_p: float = 0.0,
                     is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> bool:
    tensors = (q, k, v)
    if not all(isinstance(t, Tensor) and t.device.type == "meta" for t in tensors):
        return False
    if isinstance(attn_mask, Tensor) and attn_mask.requires_grad and torch.is_grad_enabled():
        return False  # the fused kernel has no gradient for the mask: a learned bias runs on math
    return (dropout_p == 0.0 and not enable_gqa and torch.backends.cuda.flash_sdp_enabled()
            and all(t.dim() == 4 and t.dtype in FLASH_DTYPES and t.stride(-1) == 1 for t in tensors)
            and q.shape[1] == k.shape[1] == v.shape[1] and min(q.shape[-2], k.shape[-2]) > 0)


class SavedTensorCounter:
    """Context manager counting the bytes autograd saves for backward during the forward run inside it.

    Args:
        model: module whose submodules name the records, and whose parameters and buffers are counted
            apart from activations. None: every saved tensor is named :data:`OUTSIDE`, and only
            ``nn.Parameter`` instances count as parameters.
    """

    def __init__(self, model: Optional[nn.Module] = None):
        self.model = model
        self.records: list[SavedRecord] = []
        self._last: dict[tuple[str, int], int] = {}  # storage -> index of its latest record
        self._refs: list[list[weakref.ref]] = []  # per record: the saved tensors on its storage
        self._stack: list[str] = []
        self._handles: list[Any] = []
        self._hooks: Any = None
        self._owners: dict[tuple[str, int], str] = {}

    def __enter__(self) -> SavedTensorCounter:
        self.records.clear()
        self._last.clear()
        self._refs.clear()
        self._stack.clear()
        if self.model is not None:
            self._owners = {storage_key(b): "buffer" for b in self.model.buffers()}
            self._owners.update({storage_key(p): "parameter" for p in self.model.parameters()})
            for name, module in self.model.named_modules():
                self._handles.append(module.register_forward_pre_hook(self._enter_module(name)))
                self._handles.append(module.register_forward_hook(self._leave_module, always_call=True))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        self._sdpa = CpuSdpaOnMeta()
        self._sdpa.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sdpa.__exit__(*exc)
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for record, refs in zip(self.records, self._refs):
            record.freed = all(ref() is None for ref in refs)
        self._refs.clear()
        self._last.clear()

    def _enter_module(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._stack.append(name)

        return hook

    def _leave_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _pack(self, t: Tensor) -> Tensor:
        key = storage_key(t)
        last = self._last.get(key)
        # a freed storage's address may come back for a new one: the same key counts while its tensors live
        if last is None or all(ref() is None for ref in self._refs[last]):
            kind = "parameter" if isinstance(t, nn.Parameter) else self._owners.get(key, "activation")
            cast = kind == "activation" and self._is_parameter_cast(t)
            module = self._stack[-1] if self._stack else OUTSIDE
            self._last[key] = last = len(self.records)
            self.records.append(SavedRecord(module, tuple(t.shape), t.dtype, storage_nbytes(t), kind, cast))
            self._refs.append([])
        held = t.detach()  # same storage; without its grad_fn (a saved output would otherwise hold its own node)
        self._refs[last].append(weakref.ref(held))
        return held

    def _is_parameter_cast(self, t: Tensor) -> bool:
        """Whether ``t`` (or the tensor it views) is a dtype copy of a parameter (autocast's cast of a weight)."""
        fn = (t if t._base is None else t._base).grad_fn
        if fn is None or type(fn).__name__ != "ToCopyBackward0":
            return False
        source = getattr(fn.next_functions[0][0], "variable", None)
        return isinstance(source, nn.Parameter) or (
            source is not None and self._owners.get(storage_key(source)) == "parameter"
        )

    def total(self, kind: str = "activation") -> int:
        """Bytes of the saved storages of one kind (``"activation"``, ``"parameter"`` or ``"buffer"``) held
        when the counter closed (records marked ``freed`` left out)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (got {kind!r})")
        return sum(r.nbytes for r in self.records if r.kind == kind and not r.freed)

    @property
    def freed_bytes(self) -> int:
        """Bytes of storages saved during the run and freed before the counter closed (a graph part the
        forward dropped, such as a routing decision computed with gradients on; or all of them when the
        caller dropped the output): transient, not held for backward."""
        return sum(r.nbytes for r in self.records if r.freed)

    @property
    def activation_bytes(self) -> int:
        """Bytes saved for backward that a step adds: neither a parameter's nor a buffer's storage."""
        return self.total("activation")

    @property
    def parameter_bytes(self) -> int:
        """Bytes of saved storages that are parameters (or views of them): present without the step."""
        return self.total("parameter")

    @property
    def buffer_bytes(self) -> int:
        """Bytes of saved storages that are the model's buffers (index tables, random features)."""
        return self.total("buffer")

    @property
    def cast_bytes(self) -> int:
        """Of :attr:`activation_bytes`, the low-precision copies of parameters made by autocast."""
        return sum(r.nbytes for r in self.records if r.cast and not r.freed)

    def per_module(self, kind: str = "activation") -> dict[str, int]:
        """Bytes of one kind per innermost module, in the order modules first saved something.

        Args:
            kind: ``"activation"``, ``"parameter"`` or ``"buffer"``.

        Returns:
            module name (``""``: the model itself; :data:`OUTSIDE`: no module) -> bytes; modules
            that saved nothing of that kind are left out.
        """
        self.total(kind)  # validates kind
        out: dict[str, int] = {}
        for r in self.records:
            if r.kind == kind and not r.freed:
                out[r.module] = out.get(r.module, 0) + r.nbytes
        return out

    def table(self) -> str:
        """Markdown table: per module, the activation, parameter and buffer bytes and the storages saved."""
        rows: dict[str, list[int]] = {}
        for r in (r for r in self.records if not r.freed):
            row = rows.setdefault(r.module, [0, 0, 0, 0])  # activation, parameter, buffer bytes, storages
            row[KINDS.index(r.kind)] += r.nbytes
            row[3] += 1
        lines = ["| module | activation bytes | parameter bytes | buffer bytes | storages |", "|---|--:|--:|--:|--:|"]
        for name, (act, par, buf, n) in rows.items():
            lines.append(f"| {name or '(model)'} | {act:,} | {par:,} | {buf:,} | {n} |")
        kept = sum(not r.freed for r in self.records)
        lines.append(f"| total | {self.activation_bytes:,} | {self.parameter_bytes:,} | {self.buffer_bytes:,} | "
                     f"{kept} |")
        return "\n".join(lines)


def _unpack(t: Tensor) -> Tensor:
    return t
