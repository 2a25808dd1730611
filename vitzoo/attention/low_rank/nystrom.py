"""Nyströmformer: softmax attention approximated through m landmarks.

Paper: Xiong et al., "Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention",
AAAI 2021, https://arxiv.org/abs/2102.03902.

With landmarks ``Q̃, K̃ [m, d]`` (segment means of Q and K)::

    softmax(QKᵀ/√d) V  ≈  softmax(QK̃ᵀ/√d) · pinv(softmax(Q̃K̃ᵀ/√d)) · (softmax(Q̃Kᵀ/√d) V)

and ``pinv`` is the paper's iterative Moore–Penrose approximation (Razavi et al. 2014):
``Z₀ = Aᵀ / (‖A‖₁‖A‖∞)``, ``Zₖ₊₁ = ¼ Zₖ (13I − AZₖ(15I − AZₖ(7I − AZₖ)))``, ``iterations`` times.
The norms are taken per matrix (per image and head), so an image's output never depends on the
rest of the batch (the reference code takes one maximum over the whole batch).

Segments and padding: tokens are cut into consecutive segments of ``s = ⌈N/landmarks⌉`` tokens,
giving ``m = ⌈N/s⌉ ≤ landmarks`` landmarks (``m = N``, i.e. exact landmarks, when N ≤ landmarks).
N is zero-padded at the end to ``m·s``; the padding is shorter than one segment, so only the last
segment can be partial and none is empty. A landmark is the mean over the REAL tokens of its
segment (its sum is divided by the real count, not by s), so padding never dilutes a landmark.
Padded tokens are used nowhere else: keys and values stay the N real tokens and only real
queries are computed.

Prefix tokens (ViT's class token) are ordinary tokens at the start of the sequence: the class
token falls into the first segment's landmarks and attends / is attended through the landmarks.

``softmax(Q̃Kᵀ/√d)V`` and ``softmax(QK̃ᵀ/√d)·w`` are attention over N keys and over the m landmark keys:
both are fused SDPA calls, so neither ``[N, m]`` softmax is materialised or kept for backward.

No attention dropout (the paper has none) and no depthwise-conv skip on V (an option of the
reference code).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention, check_positive
from vitzoo.attention.functional import sdpa
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.sdpa import fp32_backward_workspace


@dataclass
class NystromConfig:
    landmarks: int = 64  # landmarks m (at most; see segments): more = closer to softmax attention
    iterations: int = 6  # iterations of the Moore–Penrose pseudo-inverse approximation

    def __post_init__(self):
        check_positive(self, "landmarks", "iterations")


def segments(n: int, landmarks: int) -> tuple[int, int, int]:
    """``(s, m, pad)``: segment length ``s = ⌈n/landmarks⌉``, landmarks ``m = ⌈n/s⌉``, padding ``m·s − n < s``."""
    s = math.ceil(n / landmarks)
    m = math.ceil(n / s)
    return s, m, m * s - n


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """Approximate Moore–Penrose inverse of each ``a[..., m, m]`` (Nyströmformer, Eq. 14). 4m³ MACs per iteration."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)  # ‖A‖₁·‖A‖∞ per matrix
    z = a.transpose(-2, -1) / norms[..., None, None]  # Z₀
    for _ in range(iterations):
        az = a @ z  # m³
        z = (0.25 * z) @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))  # 3 more m³
    return z


@register_attention("nystrom", NystromConfig)
class NystromAttention(QKVAttention):
    """Nyström approximation of softmax attention; its cost is :attr:`formula`.

    Args:
        cfg: :class:`NystromConfig`.
        ctx: host dims.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 4NmC + 2m²C + 4Ihm³"
    linear_cost = True

    def landmarks(self, t: Tensor) -> Tensor:
        """Segment means over real tokens: ``t[B, h, N, d] -> [B, h, m, d]``."""
        B, h, N, d = t.shape
        s, m, pad = segments(N, self.cfg.landmarks)
        sums = F.pad(t, (0, 0, 0, pad)).reshape(B, h, m, s, d).sum(-2)  # [B, h, m, d]; padding adds 0
        if not pad:
            return sums / s
        last = sums[..., -1:, :] / (s - pad)  # the last segment holds s - pad real tokens [B, h, 1, d]
        return torch.cat([sums[..., :-1, :] / s, last], dim=-2)  # [B, h, m, d]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # the two N×m softmax products are fused SDPA calls (scale 1/√d): neither softmax(QK̃ᵀ) nor
        # softmax(Q̃Kᵀ) is materialised or stored for backward, and q, k, v are used as they are (no copies)
        q_l, k_l = self.landmarks(q), self.landmarks(k)  # [B, h, m, d]
        kernel2 = (q_l @ k_l.transpose(-2, -1) * self.scale).softmax(-1)  # [B, h, m, m]: m·m·d
        w = sdpa(q_l, k, v)  # softmax(Q̃Kᵀ/√d)V [B, h, m, d]: 2·m·N·d
        w = self.pinv(kernel2) @ w  # [B, h, m, d]: 4·I·m³ + m·m·d
        return sdpa(q, k_l, w)  # softmax(QK̃ᵀ/√d)w [B, h, N, d]: 2·N·m·d

    def pinv(self, a: Tensor) -> Tensor:
        """:func:`iterative_pinv`, in float32 at least (the iteration is unstable in bf16/fp16, e.g. under autocast)."""
        if a.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(a.device.type):
            return iterative_pinv(a, self.cfg.iterations)
        with torch.autocast(a.device.type, enabled=False):
            return iterative_pinv(a.float(), self.cfg.iterations).to(a.dtype)

    def attend_flops(self, grid: Grid) -> int:
        n, c, h = self.seq_len(grid), self.dim, self.num_heads
        _, m, _ = segments(n, self.cfg.landmarks)
        total = n * m * c  # QK̃ᵀ: per head N×d times d×m
        total += m * m * c  # Q̃K̃ᵀ: per head m×d times d×m
        total += m * n * c  # Q̃Kᵀ: per head m×d times d×N
        total += m * n * c  # kernel3 · V: per head m×N times N×d
        total += 4 * self.cfg.iterations * h * m ** 3  # pinv: 4 m×m products per iteration per head
        total += m * m * c  # pinv · (kernel3 V): per head m×m times m×d
        total += n * m * c  # kernel1 · (...): per head N×m times m×d
        return total

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """What :meth:`attend` keeps: q|k|v, the landmarks, the ``[m, m]`` kernel, the two SDPA calls' outputs and
        log-sum-exp, and every ``[m, m]`` matrix of the pseudo-inverse iteration (in float32, on a float32 copy of
        the kernel under ``amp``). Args as :meth:`QKVAttention.attend_memory`."""
        n, h, d, size, iters = self.seq_len(grid), self.num_heads, self.head_dim, itemsize(amp), self.cfg.iterations
        _, m, _ = segments(n, self.cfg.landmarks)
        bh = batch * h
        items = [
            # [B, N, 3C]; the fp32 backward workspace of the SDPA calls (m rows over N keys, N rows over m keys)
            Saved("q|k|v (projection output)", batch * n * 3 * self.dim, size,
                  workspace=max(fp32_backward_workspace(bh, m, n, d, amp=amp),
                                fp32_backward_workspace(bh, n, m, d, amp=amp))),
            Saved("query landmarks", bh * m * d, size), Saved("key landmarks", bh * m * d, size),  # [B, h, m, d]
            Saved("landmark kernel softmax(Q̃K̃ᵀ/√d)", bh * m * m, size),  # [B, h, m, m]
            Saved("SDPA output softmax(Q̃Kᵀ/√d)V", bh * m * d, size),  # [B, h, m, d]
            Saved("its row log-sum-exp (fp32)", bh * m, 4),  # [B, h, m]
            Saved("softmax(Q̃Kᵀ/√d)V past sdpa()'s NaN guard (the pinv product's operand)", bh * m * d, size),
        ]
        if amp is not None:
            items.append(Saved("landmark kernel (fp32 copy)", bh * m * m, 4))  # [B, h, m, m]
        items += [
            Saved("abs column sums, abs row sums (fp32)", 2 * bh * m, 4),  # 2 x [B, h, m]
            Saved("their maxima and the norm product (fp32)", 3 * bh, 4),  # 3 x [B, h]
            Saved("Z₀ (fp32)", bh * m * m, 4),  # [B, h, m, m]
            # per iteration AZ, 7I − AZ, 15I − AZ(..), 13I − AZ(..), Z/4, and each Zₖ the next iteration reads
            Saved("pseudo-inverse iteration matrices (fp32)", (6 * iters - 1) * bh * m * m, 4, count=6 * iters - 1),
            Saved("pseudo-inverse", bh * m * m, size),  # [B, h, m, m] (a bf16 copy under amp)
            Saved("pinv · softmax(Q̃Kᵀ/√d)V", bh * m * d, size),  # [B, h, m, d]
            Saved("attention output", batch * n * self.dim, size),  # [B, h, N, d]
            Saved("row log-sum-exp (fp32)", bh * n, 4),  # [B, h, N]
        ]
        return items

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """The same approximation written plainly, one (image, head) at a time: explicit segment
        means, the three softmax matrices, the same pseudo-inverse iteration with explicit 2-D
        matrices, and ``(kernel1 · pinv) · (kernel3 · V)`` (the other association)."""
        B, h, N, d = q.shape
        s, m, _ = segments(N, self.cfg.landmarks)
        out = torch.empty_like(q)
        for b in range(B):
            for head in range(h):
                qq, kk, vv = q[b, head] / math.sqrt(d), k[b, head], v[b, head]
                bounds = [(j * s, min((j + 1) * s, N)) for j in range(m)]
                q_l = torch.stack([qq[lo:hi].mean(0) for lo, hi in bounds])  # [m, d]
                k_l = torch.stack([kk[lo:hi].mean(0) for lo, hi in bounds])
                k1 = torch.softmax(qq @ k_l.T, dim=1)
                k2 = torch.softmax(q_l @ k_l.T, dim=1)
                k3 = torch.softmax(q_l @ kk.T, dim=1)
                col_sum = max(k2[:, j].abs().sum() for j in range(m))
                row_sum = max(k2[i, :].abs().sum() for i in range(m))
                z = k2.T / (col_sum * row_sum)
                eye = torch.eye(m, dtype=q.dtype, device=q.device)
                for _ in range(self.cfg.iterations):
                    az = k2 @ z
                    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
                out[b, head] = (k1 @ z) @ (k3 @ vv)
        return out

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        n = self.seq_len(grid)
        return {**super().symbols(grid), "m": segments(n, self.cfg.landmarks)[1], "I": self.cfg.iterations}
